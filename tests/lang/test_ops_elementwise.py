"""Property: every elementwise op agrees with float64 numpy on cpu, sim and iree-cpu.

One kernel per example computes the whole family on one random tensor
(random shape, values mixing ordinary floats with edge values: zeros, halves,
tiny and large magnitudes), so each example costs one IREE compile.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kiln
from kiln.ir.interp import NUMPY_DTYPES
from tests.lang.targets import (
    HAS_IREE,
    SIM_MACHINES,
    assert_close,
    assert_targets_agree,
    run_all,
)

pytestmark = pytest.mark.usefixtures("shared_iree_cache")

COMMON = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_erf = np.vectorize(math.erf, otypes=[np.float64])

# name -> (kiln body, float64 numpy reference)
FLOAT_OPS = {
    "clip": (lambda x: kiln.clip(x, -1.5, 2.0), lambda x: np.clip(x, -1.5, 2.0)),
    "square": (lambda x: x.square(), np.square),
    "reciprocal": (lambda x: kiln.reciprocal(x), lambda x: 1.0 / x),
    "log1p": (lambda x: kiln.log1p(abs(x)), lambda x: np.log1p(abs(x))),
    "expm1": (lambda x: kiln.expm1(kiln.minimum(x, 20.0)), lambda x: np.expm1(np.minimum(x, 20))),
    "erf": (kiln.erf, _erf),
    "silu": (kiln.silu, lambda x: x / (1 + np.exp(-x))),
    "gelu_exact": (
        lambda x: kiln.gelu(x, approximate="none"),
        lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))),
    ),
    "gelu_tanh": (
        lambda x: x.gelu(),
        lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    ),
    "softplus": (kiln.softplus, lambda x: np.logaddexp(0, x)),
    "sign": (kiln.sign, np.sign),
    "floor": (kiln.floor, np.floor),
    "ceil": (kiln.ceil, np.ceil),
    "round": (kiln.round, np.round),
    "rsqrt": (lambda x: (abs(x) + 1).rsqrt(), lambda x: 1 / np.sqrt(abs(x) + 1)),
    "sigmoid": (lambda x: x.sigmoid(), lambda x: 1 / (1 + np.exp(-x))),
    "abs": (abs, np.abs),
    "full_like": (
        lambda x: kiln.full_like(x, 2.5) + kiln.zeros_like(x),
        lambda x: np.full_like(x, 2.5),
    ),
    "where_inf": (
        lambda x: kiln.where(x > 0, x, -kiln.inf).max(axis=-1),
        lambda x: np.where(x > 0, x, -np.inf).max(axis=-1),
    ),
}
EDGES = [0.0, -0.0, 0.5, -0.5, 1.5, -2.5, 3.5, 1e-6, -1e-6, 30.0, -30.0, 1e3, -1e3]


@st.composite
def tensors(draw, dtype: str):
    shape = tuple(draw(st.lists(st.integers(1, 7), min_size=1, max_size=3)))
    size = math.prod(shape)
    ordinary = st.floats(-6, 6, allow_nan=False, allow_subnormal=False, width=32)
    value = st.one_of(ordinary, st.sampled_from(EDGES if dtype == "f32" else EDGES[:-2]))
    values = draw(st.lists(value, min_size=size, max_size=size))
    return np.asarray(values, np.float64).reshape(shape).astype(NUMPY_DTYPES[dtype])


TOLERANCE = {"f32": (2e-5, 2e-5), "f16": (2e-3, 2e-3), "bf16": (2e-2, 2e-2)}


CASES = st.sampled_from(("f32", "f32", "f16", "bf16")).flatmap(
    lambda d: st.tuples(st.just(d), tensors(d))
)


@settings(max_examples=25, **COMMON)
@given(CASES)
def test_float_elementwise_ops_match_float64_numpy_on_cpu_and_sim(case):
    _check_float_ops(case, SIM_MACHINES, iree=False)


@pytest.mark.skipif(not HAS_IREE, reason="iree-base-compiler/runtime not installed")
@settings(max_examples=2, **COMMON)  # one kernel of ~20 outputs: ~5 s of IREE compile
@given(CASES)
def test_float_elementwise_ops_match_float64_numpy_on_iree_cpu(case):
    _check_float_ops(case, (), iree=True)


def _check_float_ops(case, machines, iree):
    dtype, x = case
    names = list(FLOAT_OPS)
    results = run_all(lambda a: tuple(FLOAT_OPS[n][0](a) for n in names), [x], machines, iree)
    wide = x.astype(np.float64)
    rtol, atol = TOLERANCE[dtype]
    with np.errstate(all="ignore"):
        for name, got in zip(names, results["cpu"], strict=True):
            want = FLOAT_OPS[name][1](wide).astype(got.dtype).astype(np.float64)  # rounded once
            try:
                assert_close(
                    got,
                    want,
                    rtol,
                    atol * max(1.0, float(np.nanmax(np.abs(want[np.isfinite(want)]), initial=0))),
                )
            except AssertionError as exc:
                raise AssertionError(f"{name}: {exc}") from None
    assert_targets_agree(results, _dtypes(results["cpu"]), names)


def _dtypes(outputs) -> list[str]:
    from kiln.ir.interp import kiln_dtype

    return [kiln_dtype(o.dtype) for o in outputs]


LOGICAL_CASES = st.lists(st.integers(1, 6), min_size=1, max_size=3).flatmap(
    lambda shape: st.tuples(
        *(
            st.lists(
                st.floats(-3, 3, width=32), min_size=math.prod(shape), max_size=math.prod(shape)
            )
            for _ in range(2)
        ),
        st.just(tuple(shape)),
    )
)


@settings(max_examples=15, **COMMON)
@given(LOGICAL_CASES)
def test_logical_ops_and_casts_match_numpy_on_cpu_and_sim(case):
    _check_logical(case, SIM_MACHINES, iree=False)


@pytest.mark.skipif(not HAS_IREE, reason="iree-base-compiler/runtime not installed")
@settings(max_examples=1, **COMMON)
@given(LOGICAL_CASES)
def test_logical_ops_and_casts_match_numpy_on_iree_cpu(case):
    _check_logical(case, (), iree=True)


def _check_logical(case, machines, iree):
    a_values, b_values, shape = case
    a = np.round(np.asarray(a_values, np.float32).reshape(shape))
    b = np.round(np.asarray(b_values, np.float32).reshape(shape))

    def body(x, y):
        p, q = x > 0, y < 1
        return (
            p & q,
            p | q,
            p ^ q,
            ~p,
            kiln.logical_and(p, True),
            x.astype("i32"),
            x.astype("bool"),
            p.astype("f32") + q.astype("i32"),
            x.astype("f16").astype("bf16").astype("f32"),
            kiln.where(p & ~q, x, y),
        )

    results = run_all(body, [a, b], machines, iree)
    p, q = a > 0, b < 1
    want = [
        p & q, p | q, p ^ q, ~p, p, a.astype(np.int32), a.astype(bool),
        p.astype(np.float32) + q.astype(np.int32), a, np.where(p & ~q, a, b),
    ]  # fmt: skip
    for got, expected in zip(results["cpu"], want, strict=True):
        np.testing.assert_array_equal(got, expected)
    assert_targets_agree(results, _dtypes(results["cpu"]))


def test_infinities_flow_through_every_elementwise_op_like_numpy():
    """±inf inputs: every target returns what the oracle does, and the oracle what numpy does."""
    x = np.array([np.inf, -np.inf, 0.0, -1.5, 2.5, 1e30, -1e30], np.float32)
    names = list(FLOAT_OPS)
    results = run_all(lambda a: tuple(FLOAT_OPS[n][0](a) for n in names), [x], SIM_MACHINES)
    with np.errstate(all="ignore"):
        for name, got in zip(names, results["cpu"], strict=True):
            want = FLOAT_OPS[name][1](x.astype(np.float64)).astype(np.float32)
            np.testing.assert_allclose(
                got, want, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=name
            )
    assert_targets_agree(results, _dtypes(results["cpu"]), names)


def test_bool_arguments_and_logical_ops_agree_on_every_target():
    mask = np.array([[True, False, True], [False, False, True]])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    results = run_all(
        lambda m, v: (kiln.where(m & (v > 1), v, 0.0), ~m | (v < 1), m.astype("i32").sum(axis=1)),
        [mask, x],
    )
    np.testing.assert_array_equal(results["cpu"][0], np.where(mask & (x > 1), x, 0))
    np.testing.assert_array_equal(results["cpu"][1], ~mask | (x < 1))
    np.testing.assert_array_equal(results["cpu"][2], [2, 1])
    assert_targets_agree(results, ["f32", "bool", "i32"])
