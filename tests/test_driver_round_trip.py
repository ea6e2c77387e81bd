"""kiln/driver.py: a chain handed IR from stage to stage writes the bytes of one that decodes.

A local build decodes every stage's input from the artifact before it; the
worker hands a stage's IR to the next as it is, wherever the stage that
made it declares ``EXACT_ROUND_TRIP`` (its bytes decode to an IR the next
stage cannot tell apart). These tests hold the built-in stages to that:
for random kernels and the example kernels, on both machines, the rest of
the chain from the IR as made and from its decoded bytes gives the same
bytes at every stage.
"""

from __future__ import annotations

import importlib

import pytest
from hypothesis import given, settings

from kiln.lang import trace
from tests.kernels.test_examples import INSTANCES, KERNELS
from tests.runners.test_sim import machine
from tests.test_property_targets import COMMON, make_kernel, recipes

STAGES = ("trace", "visa", "lir", "schedule", "edf")
MACHINES = ("npu-v1", "npu-tiny")


def stage(name: str):
    return importlib.import_module(f"kiln.stages.{name}")


def chain_bytes(graph, m: dict, *, hand_over: bool) -> list[bytes]:
    """Every stage's bytes (its side artifacts' after them) from ``graph``;
    ``hand_over``: as the worker passes IR on."""
    trace_stage = stage("trace")
    data = trace_stage.serialize(graph)
    out = [data]
    ir, previous = graph, trace_stage
    for name in STAGES[1:]:
        module = stage(name)
        ir_in = ir if hand_over and previous.EXACT_ROUND_TRIP else previous.decode(data)
        if hasattr(module, "run_with_side_artifacts"):  # as the worker runs it
            ir, side = module.run_with_side_artifacts(ir_in, module.Options(), m)
        else:
            ir, side = module.run(ir_in, module.Options(), m), {}
        module.verify(ir, m)
        data = module.serialize(ir)
        out.append(data + b"".join(name.encode() + side[name] for name in sorted(side)))
        previous = module
    return out


def assert_same_bytes(graph) -> None:
    for name in MACHINES:
        m = machine(name)
        decoded = chain_bytes(graph, m, hand_over=False)
        handed = chain_bytes(graph, m, hand_over=True)
        for stage_name, a, b in zip(STAGES, decoded, handed, strict=True):
            assert a == b, f"{graph.name} on {name}: the {stage_name} stage's bytes differ"


def test_every_built_in_stage_says_whether_its_ir_may_be_handed_on():
    for name in STAGES:
        assert isinstance(stage(name).EXACT_ROUND_TRIP, bool), name


@settings(max_examples=40, **COMMON)
@given(recipes())
def test_random_kernels_give_the_same_bytes_handed_on_or_decoded(recipe):
    assert_same_bytes(trace(make_kernel(recipe), dict(recipe.sizes), recipe.dtype))


@pytest.mark.parametrize(("name", "sizes", "dtype"), [(i[0], i[2], i[3]) for i in INSTANCES])
def test_example_kernels_give_the_same_bytes_handed_on_or_decoded(name, sizes, dtype):
    assert_same_bytes(trace(KERNELS[name], sizes, dtype))
