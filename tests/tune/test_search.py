"""Search strategies: deterministic, default first, never choosing a rejected candidate."""

import pytest

from kiln.tune.evaluate import Trial, run_trial
from kiln.tune.search import Search
from kiln.tune.space import default_candidate, knobs_for, settings
from tests.tune.graphs import MACHINE, context, traced


@pytest.fixture(scope="module")
def transpose():
    graph = traced("transpose", "kernels.linalg", M=128, N=256)
    return context(graph), knobs_for(graph, MACHINE)


@pytest.mark.parametrize("strategy", ["grid", "random", "evolutionary"])
def test_same_seed_same_trials_and_default_first(transpose, strategy):
    ctx, knobs = transpose
    runs = [Search(ctx, knobs, 12, strategy=strategy, seed=3).run() for _ in range(2)]
    assert runs[0] == runs[1]
    assert runs[0][0].candidate == default_candidate(knobs)
    assert len(runs[0]) == 12 and len({t.candidate for t in runs[0]}) == 12


def test_another_seed_proposes_other_candidates(transpose):
    ctx, knobs = transpose
    a = [t.candidate for t in Search(ctx, knobs, 10, strategy="random", seed=1).run()]
    b = [t.candidate for t in Search(ctx, knobs, 10, strategy="random", seed=2).run()]
    assert a[0] == b[0] and a != b


def test_grid_covers_a_small_space_exactly_once(transpose):
    ctx, knobs = transpose
    search = Search(ctx, knobs, 10_000, strategy="grid")
    trials = search.run()
    size = 1
    for k in knobs:
        size *= len(k.values)
    assert len(trials) == size
    assert search.best.makespan <= search.default.makespan
    assert search.best.makespan < search.default.makespan  # transpose gains from tuning


def test_parallel_pricing_gives_the_same_trials(transpose):
    ctx, knobs = transpose
    serial = Search(ctx, knobs, 20, strategy="evolutionary", seed=5).run()
    parallel = Search(ctx, knobs, 20, strategy="evolutionary", seed=5, jobs=2).run()
    assert serial == parallel


def test_a_candidate_the_stages_refuse_is_rejected_with_its_reason(transpose):
    ctx, knobs = transpose
    huge = {"visa": {"vector_tile": -64}}
    trial = run_trial(ctx, (0,), huge)
    assert trial.makespan is None and trial.reason


def test_rejected_trials_are_never_ranked():
    search = Search.__new__(Search)
    search.trials = [Trial((0,), 100), Trial((1,), None, "does not fit"), Trial((2,), 90)]
    assert [t.candidate for t in search.ranked()] == [(2,), (0,)]
    assert search.best.candidate == (2,)


def test_ties_go_to_the_earlier_proposal():
    search = Search.__new__(Search)
    search.trials = [Trial((0,), 100), Trial((1,), 90), Trial((2,), 90)]
    assert search.best.candidate == (1,)


def test_settings_of_the_best_candidate_compile(transpose):
    ctx, knobs = transpose
    search = Search(ctx, knobs, 16, strategy="random", seed=0)
    search.run()
    assert run_trial(ctx, search.best.candidate, settings(knobs, search.best.candidate)) == (
        search.best
    )
