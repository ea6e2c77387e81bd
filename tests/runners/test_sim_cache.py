"""Plans are kept per EDF bytes: a second prepare of the same bytes decodes and checks nothing."""

from __future__ import annotations

import dataclasses

import numpy as np

import kernels.linalg as linalg
from kiln.ir.edf import encode
from kiln.lang import trace
from kiln.runners import sim_plan
from kiln.runners.sim_plan import checked_plan, clear_cache
from tests.runners.test_sim import compile_graph, inputs_for, machine, prepare_file


def _gemm(n: int = 32):
    graph = trace(linalg.gemm, {"M": n, "K": n, "N": n}, "f32")
    return graph, compile_graph(graph, machine())


def test_the_same_bytes_share_one_plan_and_get_memories_of_their_own(tmp_path):
    clear_cache()
    graph, edf = _gemm()
    runner, first, _ = prepare_file(tmp_path, graph, edf, machine())
    plan = checked_plan(encode(edf), "elsewhere.edf")  # another name, the same bytes
    other = tmp_path / "copy"
    other.mkdir()
    _, second, _ = prepare_file(other, graph, encode(edf), machine())
    assert checked_plan(encode(edf), "x") is plan
    assert first.dram is not second.dram and first.steps is not second.steps
    a, b = inputs_for(graph)
    c, d = inputs_for(graph, seed=1)
    out1 = runner.run(first, [a, b]).outputs[0]
    runner.run(second, [c, d])  # runs on its own memories: first's results stay
    np.testing.assert_array_equal(runner.run(first, [a, b]).outputs[0], out1)
    np.testing.assert_allclose(out1, a @ b, rtol=1e-5)


def test_other_bytes_make_another_plan(tmp_path):
    clear_cache()
    _, edf = _gemm()
    plan = checked_plan(encode(edf), "x")
    changed = edf.with_metadata({"note": "rebuilt"})
    assert checked_plan(encode(changed), "x") is not plan
    assert checked_plan(encode(edf), "x") is plan


def test_the_cache_keeps_the_most_recent_plans():
    clear_cache()
    _, edf = _gemm(16)
    raws = [encode(edf.with_metadata({"n": k})) for k in range(sim_plan.CACHE_SIZE + 1)]
    plans = [checked_plan(raw, "x") for raw in raws]
    assert checked_plan(raws[-1], "x") is plans[-1]
    assert checked_plan(raws[0], "x") is not plans[0]  # the oldest was dropped


def test_a_refused_binary_is_never_kept(tmp_path):
    clear_cache()
    _, edf = _gemm()
    slots = list(edf.scheduled.slots)
    slots[1] = dataclasses.replace(slots[1], unit=slots[0].unit)  # two loads on one unit
    bad = encode(type(edf)(dataclasses.replace(edf.scheduled, slots=tuple(slots)), edf.metadata))
    assert checked_plan(bad, "x") is None
    assert not sim_plan._CACHE.items
