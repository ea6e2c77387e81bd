"""Search strategies over a knob space: grid, random and evolutionary, all deterministic.

Every strategy proposes candidates in batches; a batch is priced (in
parallel when ``jobs > 1``) and results are taken in proposal order, never
completion order, so the same budget and seed give the same winner on any
machine and with any number of workers. The default candidate is always
the first trial.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor

from kiln.tune.evaluate import Context, Trial, init_worker, run_trial, run_worker_trial
from kiln.tune.space import Candidate, Knob, default_candidate, settings, space_size

STRATEGIES = ("grid", "random", "evolutionary")
BATCH = 32


class DaskPricer:
    """``pool.map`` over a Dask cluster: one task per trial, results in proposal order."""

    def __init__(self, client, context_future):
        self.client, self.context = client, context_future
        self.pending: list = []

    def map(self, _fn, batch: list[Candidate], chosen: list[dict]) -> list[Trial]:
        n = len(batch)
        self.pending = self.client.map(
            run_trial, [self.context] * n, batch, chosen, pure=False, retries=1
        )
        results = self.client.gather(self.pending)  # Ctrl-C here: shutdown cancels them
        self.pending = []
        return results

    def shutdown(self, wait: bool = False, cancel_futures: bool = True) -> None:
        if self.pending and cancel_futures:  # Ctrl-C: nothing keeps running on the cluster
            self.client.cancel(self.pending)


class Search:
    """One kernel instance's search: propose, price, remember the best."""

    def __init__(
        self,
        context: Context,
        knobs: tuple[Knob, ...],
        budget: int,
        strategy: str = "evolutionary",
        seed: int = 0,
        jobs: int = 1,
        label: str = "",
        on_trial: Callable[[Trial, Trial | None], None] | None = None,
        client=None,
    ):
        self.context, self.knobs, self.budget = context, knobs, max(1, budget)
        self.strategy, self.jobs = strategy, max(1, jobs)
        self.client = client  # a dask.distributed Client: trials are priced on its workers
        # a string seed hashes the same under every PYTHONHASHSEED
        self.rng = random.Random(f"{seed}:{strategy}:{label}")
        self.on_trial = on_trial
        self.trials: list[Trial] = []
        self.seen: set[Candidate] = set()

    # -- results ---------------------------------------------------------------

    @property
    def default(self) -> Trial | None:
        return self.trials[0] if self.trials else None

    def ranked(self) -> list[Trial]:
        """Accepted trials, best first; ties go to the earlier proposal."""
        order = {t.candidate: i for i, t in enumerate(self.trials)}
        ok = [t for t in self.trials if t.makespan is not None]
        return sorted(ok, key=lambda t: (t.makespan, order[t.candidate]))

    @property
    def best(self) -> Trial | None:
        ranked = self.ranked()
        return ranked[0] if ranked else None

    # -- running ---------------------------------------------------------------

    def run(self) -> list[Trial]:
        """Spend the budget (KeyboardInterrupt leaves what was priced so far in ``trials``)."""
        proposals = {
            "grid": self._grid,
            "random": self._random,
            "evolutionary": self._evolutionary,
        }[self.strategy]()
        pool = None
        if self.client is not None:
            # the context (the traced graph) goes to every worker once, not with each trial
            pool = DaskPricer(self.client, self.client.scatter(self.context, broadcast=True))
        elif self.jobs > 1:
            pool = ProcessPoolExecutor(self.jobs, initializer=init_worker, initargs=(self.context,))
        try:
            while len(self.trials) < self.budget:
                batch = list(
                    itertools.islice(proposals, min(BATCH, self.budget - len(self.trials)))
                )
                if not batch:
                    break
                self._price(batch, pool)
        finally:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        return self.trials

    def _price(self, batch: list[Candidate], pool) -> None:
        chosen = [settings(self.knobs, c) for c in batch]
        if pool is None:
            results: Iterator[Trial] = map(run_trial, [self.context] * len(batch), batch, chosen)
        else:
            results = pool.map(run_worker_trial, batch, chosen)
        for trial in results:
            self.trials.append(trial)
            if self.on_trial is not None:
                self.on_trial(trial, self.best)

    def _fresh(self, candidate: Candidate) -> bool:
        if candidate in self.seen:
            return False
        self.seen.add(candidate)
        return True

    # -- strategies: generators of new candidates ---------------------------------

    def _grid(self) -> Iterator[Candidate]:
        yield from filter(
            self._fresh,
            itertools.chain(
                [default_candidate(self.knobs)],
                itertools.product(*(range(len(k.values)) for k in self.knobs)),
            ),
        )

    def _random(self) -> Iterator[Candidate]:
        total = space_size(self.knobs)
        if self._fresh(default_candidate(self.knobs)):
            yield default_candidate(self.knobs)
        misses = 0
        while len(self.seen) < total and misses < 1000:
            candidate = tuple(self.rng.randrange(len(k.values)) for k in self.knobs)
            if self._fresh(candidate):
                misses = 0
                yield candidate
            else:
                misses += 1

    def _evolutionary(self) -> Iterator[Candidate]:
        """Seed with random candidates, then mutate the best few, one or two knobs at a time."""
        total = space_size(self.knobs)
        population = max(4, min(BATCH, self.budget // 4))
        starts = itertools.islice(self._random(), population)
        yield from starts
        stalled = 0
        while len(self.seen) < total and stalled < 1000:
            parents = [t.candidate for t in self.ranked()[:4]] or [default_candidate(self.knobs)]
            parent = parents[self.rng.randrange(len(parents))]
            child = list(parent)
            for _ in range(1 + (self.rng.random() < 0.5)):
                k = self.rng.randrange(len(self.knobs))
                child[k] = self.rng.randrange(len(self.knobs[k].values))
            if self._fresh(tuple(child)):
                stalled = 0
                yield tuple(child)
            else:
                stalled += 1
