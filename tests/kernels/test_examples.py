"""The example kernels: right answers, and eager == interpreted graph at every shape set."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import numpy as np
import pytest
import yaml

import kernels
from kiln import DeviceFunction, trace
from kiln.ir.interp import NUMPY_DTYPES, run_graph

REPO = Path(__file__).resolve().parents[2]
PIPELINE = yaml.safe_load((REPO / "pipeline.yaml").read_text())


def all_kernels() -> dict[str, DeviceFunction]:
    found = {}
    for info in pkgutil.iter_modules(kernels.__path__, "kernels."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, DeviceFunction) and value.__module__ == info.name:
                assert name not in found, f"kernel {name} defined twice"
                found[name] = value
    return found


KERNELS = all_kernels()
INSTANCES = [
    (name, shape_set, sizes, spec.get("dtype", "f32"))
    for name, spec in PIPELINE["kernels"].items()
    for shape_set, sizes in spec["shapes"].items()
]


def f32(values) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def inputs(kernel: DeviceFunction, sizes: dict, dtype: str, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = [
        tuple(sizes[d] if isinstance(d, str) else d for d in dims) for _, dims in kernel.params
    ]
    return [rng.standard_normal(s).astype(NUMPY_DTYPES[dtype]) for s in shapes]


def test_every_pipeline_kernel_exists_with_matching_dims():
    for name, spec in PIPELINE["kernels"].items():
        assert name in KERNELS, f"pipeline.yaml builds {name} but kernels/ has no such kernel"
        dims = {d for _, ds in KERNELS[name].params for d in ds if isinstance(d, str)}
        for sizes in spec["shapes"].values():
            assert dims == set(sizes), name


@pytest.mark.parametrize("name, shape_set, sizes, dtype", INSTANCES, ids=lambda v: str(v))
def test_eager_equals_interpreted_graph(name, shape_set, sizes, dtype):
    kernel = KERNELS[name]
    graph = trace(kernel, sizes, dtype)
    args = inputs(kernel, sizes, dtype)
    eager = kernel(*args)
    eager = list(eager) if isinstance(eager, tuple) else [eager]
    interpreted = run_graph(graph, args)
    assert len(eager) == len(interpreted)
    for e, g in zip(eager, interpreted, strict=True):
        assert e.dtype == g.dtype and e.shape == g.shape
        np.testing.assert_array_equal(e, g)


@pytest.mark.parametrize("name, shape_set, sizes, dtype", INSTANCES, ids=lambda v: str(v))
def test_matches_an_independent_numpy_formula(name, shape_set, sizes, dtype):
    kernel = KERNELS[name]
    args = [a.astype(np.float64) for a in inputs(kernel, sizes, dtype, seed=1)]
    want = REFERENCE[name](*args)
    got = kernel(*inputs(kernel, sizes, dtype, seed=1))
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _layernorm(x, g, b):
    mu = x.mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(x.var(axis=-1, keepdims=True) + 1e-5) * g + b


REFERENCE = {
    "vector_add": np.add,
    "gemm": np.matmul,
    "gemm_bias_relu": lambda a, b, bias: np.maximum(a @ b + bias, 0),
    "batched_matmul": np.matmul,
    "transpose": np.transpose,
    "row_sum": lambda x: x.sum(axis=-1),
    "row_max": lambda x: x.max(axis=-1),
    "attention_scores": lambda q, k: q @ k.T / np.sqrt(q.shape[-1]),
    "softmax": _softmax,
    "layernorm": _layernorm,
}


# -- small cases worked out by hand --------------------------------------------------------
def test_vector_add_by_hand():
    assert KERNELS["vector_add"](f32([1, 2, 3]), f32([10, 20, 30])).tolist() == [11, 22, 33]


def test_gemm_bias_relu_by_hand():
    a = f32([[1, 2], [3, 4]])
    b = f32([[1, 0], [0, -1]])
    bias = f32([1, 1])
    # a @ b = [[1, -2], [3, -4]]; + bias = [[2, -1], [4, -3]]; relu
    assert KERNELS["gemm_bias_relu"](a, b, bias).tolist() == [[2, 0], [4, 0]]


def test_batched_matmul_by_hand():
    a = f32([[[1, 2]], [[3, 4]]])  # (2, 1, 2)
    b = f32([[[1], [1]], [[2], [0]]])  # (2, 2, 1)
    assert KERNELS["batched_matmul"](a, b).tolist() == [[[3]], [[6]]]


def test_transpose_by_hand():
    assert KERNELS["transpose"](f32([[1, 2, 3], [4, 5, 6]])).tolist() == [[1, 4], [2, 5], [3, 6]]


def test_row_reductions_by_hand():
    x = f32([[1, -5, 2], [0, 7, 1]])
    assert KERNELS["row_sum"](x).tolist() == [-2, 8]
    assert KERNELS["row_max"](x).tolist() == [2, 7]


def test_softmax_by_hand_and_stable_for_large_inputs():
    out = KERNELS["softmax"](f32([[0, np.log(3)], [1000, 1000]]))
    # e^0 : e^ln3 = 1 : 3 -> [0.25, 0.75]; equal huge logits -> [0.5, 0.5], no overflow
    np.testing.assert_allclose(out, [[0.25, 0.75], [0.5, 0.5]], rtol=1e-6)


def test_layernorm_by_hand():
    x = f32([[1, 3], [2, 2]])
    out = KERNELS["layernorm"](x, f32([2, 1]), f32([0, 10]))
    # row 0: mean 2, var 1 -> normalized [-1, 1] (eps shifts it by ~5e-6); row 1: var 0 -> [0, 0]
    np.testing.assert_allclose(out, [[-2, 11], [0, 10]], rtol=1e-4)
