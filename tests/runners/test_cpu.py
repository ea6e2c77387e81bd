"""The cpu runner is the oracle: the @device function on numpy, or the graph interpreter."""

from pathlib import Path

import numpy as np
import pytest

import kernels.linalg as linalg
import kernels.normalization as normalization
from kiln import Tensor, device
from kiln.inputs import random_inputs
from kiln.ir.interp import run_graph
from kiln.lang import trace
from kiln.runners.base import KernelArtifacts
from kiln.runners.cpu import CpuRunner

# ruff: noqa: F821  (Tensor["R"] names a dim)


@device
def two_outputs(x: Tensor["R", "C"]):
    return x.sum(axis=-1), (x * 2.0).relu()


CASES = [
    (normalization.layernorm, {"R": 7, "C": 33}, "f32"),
    (normalization.softmax, {"R": 4, "C": 16}, "f16"),
    (linalg.gemm_bias_relu, {"M": 5, "K": 6, "N": 7}, "bf16"),
    (linalg.batched_matmul, {"B": 2, "M": 3, "K": 4, "N": 5}, "i32"),
    (two_outputs, {"R": 3, "C": 5}, "f32"),
]


def artifacts(fn, bindings, dtype, with_function: bool) -> tuple[KernelArtifacts, list]:
    graph = trace(fn, bindings, dtype)
    art = KernelArtifacts(graph.name, graph, Path("."), None, fn if with_function else None)
    return art, random_inputs(graph.name, [(a.shape, a.dtype) for a in graph.args])


@pytest.mark.parametrize(
    "fn,bindings,dtype", CASES, ids=[c[0].__name__ + "-" + c[2] for c in CASES]
)
def test_eager_function_equals_the_graph_interpreter(fn, bindings, dtype):
    art, inputs = artifacts(fn, bindings, dtype, with_function=True)
    runner = CpuRunner()
    result = runner.run(runner.prepare(art), inputs)
    want = run_graph(art.graph, inputs)
    assert len(result.outputs) == len(want) == len(art.graph.outputs)
    for got, exp in zip(result.outputs, want, strict=True):
        assert got.dtype == exp.dtype and got.shape == exp.shape
        np.testing.assert_array_equal(got, exp)


def test_without_the_function_it_interprets_the_graph():
    art, inputs = artifacts(two_outputs, {"R": 3, "C": 5}, "f32", with_function=False)
    runner = CpuRunner()
    prepared = runner.prepare(art)
    result = runner.run(prepared, inputs)
    x = inputs[0]
    np.testing.assert_array_equal(result.outputs[0], run_graph(art.graph, inputs)[0])
    np.testing.assert_allclose(result.outputs[0], x.sum(axis=-1), rtol=1e-6)
    np.testing.assert_array_equal(result.outputs[1], np.maximum(x * 2.0, 0))


def test_outputs_are_numpy_arrays_and_the_run_is_timed():
    art, inputs = artifacts(linalg.gemm, {"M": 4, "K": 4, "N": 4}, "f32", with_function=True)
    result = CpuRunner().run(CpuRunner().prepare(art), inputs)
    assert isinstance(result.outputs, list) and type(result.outputs[0]) is np.ndarray
    np.testing.assert_allclose(result.outputs[0], inputs[0] @ inputs[1], rtol=1e-6)
    assert set(result.metrics) == {"seconds"} and result.metrics["seconds"] >= 0
    assert CpuRunner().unavailable() is None
