"""Property: reductions (axis int or tuple, keepdims) and the softmax family agree with
float64 numpy on cpu, sim and iree-cpu."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kiln
from kiln.ir.interp import kiln_dtype
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


def _lse(x, axis, keepdims):
    top = np.max(x, axis=axis, keepdims=True)
    out = np.log(np.sum(np.exp(x - top), axis=axis, keepdims=True)) + top
    return out if keepdims else np.squeeze(out, axis=axis)


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# name -> (kiln body, float64 reference); ``axis`` is an int or a tuple, ``one`` an int
REDUCTIONS = {
    "sum": (lambda x, ax, one, k: x.sum(ax, k), lambda x, ax, one, k: x.sum(ax, keepdims=k)),
    "mean": (lambda x, ax, one, k: x.mean(ax, k), lambda x, ax, one, k: x.mean(ax, keepdims=k)),
    "max": (lambda x, ax, one, k: x.max(ax, k), lambda x, ax, one, k: x.max(ax, keepdims=k)),
    "min": (lambda x, ax, one, k: kiln.min(x, ax, k), lambda x, ax, one, k: x.min(ax, keepdims=k)),
    "prod": (
        lambda x, ax, one, k: (x * 0.25 + 1).prod(ax, k),
        lambda x, ax, one, k: (x * 0.25 + 1).prod(ax, keepdims=k),
    ),
    "var": (lambda x, ax, one, k: x.var(ax, k), lambda x, ax, one, k: x.var(ax, keepdims=k)),
    "std": (
        lambda x, ax, one, k: kiln.std(x, ax, k, ddof=0),
        lambda x, ax, one, k: x.std(ax, keepdims=k),
    ),
    "argmax": (
        lambda x, ax, one, k: x.argmax(one, k),
        lambda x, ax, one, k: x.argmax(one, keepdims=k),
    ),
    "argmin": (
        lambda x, ax, one, k: kiln.argmin(x, one),
        lambda x, ax, one, k: x.argmin(one),
    ),
    "argmax_flat": (lambda x, ax, one, k: kiln.argmax(x), lambda x, ax, one, k: x.argmax()),
    "logsumexp": (
        lambda x, ax, one, k: kiln.logsumexp(x, ax, k),
        lambda x, ax, one, k: _lse(x, ax, k),
    ),
    "softmax": (lambda x, ax, one, k: kiln.softmax(x, one), lambda x, ax, one, k: _softmax(x, one)),
    "log_softmax": (
        lambda x, ax, one, k: kiln.log_softmax(x, ax),
        lambda x, ax, one, k: x - _lse(x, ax, True),
    ),
}


@st.composite
def cases(draw):
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    rank = len(shape)
    axes = draw(
        st.lists(
            st.integers(-rank, rank - 1), min_size=1, max_size=rank, unique_by=lambda a: a % rank
        )
    )
    axis = tuple(axes) if len(axes) > 1 or draw(st.booleans()) else axes[0]
    one = draw(st.integers(-rank, rank - 1))
    keepdims = draw(st.booleans())
    # half-integers: ties for argmax/argmin, exact sums
    values = draw(
        st.lists(st.integers(-8, 8), min_size=math.prod(shape), max_size=math.prod(shape))
    )
    x = (np.asarray(values, np.float32) / 2).reshape(shape)
    return x, axis, one, keepdims


def _check(case, machines, iree):
    x, axis, one, keepdims = case
    names = list(REDUCTIONS)
    results = run_all(
        lambda a: tuple(REDUCTIONS[n][0](a, axis, one, keepdims) for n in names),
        [x],
        machines,
        iree,
    )
    wide = x.astype(np.float64)
    for name, got in zip(names, results["cpu"], strict=True):
        want = np.asarray(REDUCTIONS[name][1](wide, axis, one, keepdims))
        try:
            assert_close(got, want, 1e-5, 1e-5)
        except AssertionError as exc:
            raise AssertionError(
                f"{name} (axis={axis}, one={one}, keepdims={keepdims}): {exc}"
            ) from None
    assert_targets_agree(results, [kiln_dtype(o.dtype) for o in results["cpu"]], names)


@settings(max_examples=25, **COMMON)
@given(cases())
def test_reductions_match_float64_numpy_on_cpu_and_sim(case):
    _check(case, SIM_MACHINES, iree=False)


@pytest.mark.skipif(not HAS_IREE, reason="iree-base-compiler/runtime not installed")
@settings(max_examples=1, **COMMON)
@given(cases())
def test_reductions_match_float64_numpy_on_iree_cpu(case):
    _check(case, (), iree=True)


def test_logsumexp_of_an_all_minus_inf_row_is_minus_inf():
    x = np.array([[-np.inf, -np.inf], [0.0, 1.0]], np.float32)
    results = run_all(lambda a: kiln.logsumexp(kiln.maximum(a, -kiln.inf), axis=1), [x])
    assert results["cpu"][0] == -np.inf
    assert_targets_agree(results, "f32")
