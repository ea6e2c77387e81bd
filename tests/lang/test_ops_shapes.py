"""Property: static indexing and slicing, concatenate/stack, shape ops and contractions
(dot, matmul with batch broadcasting, einsum) agree with numpy on cpu, sim and iree-cpu."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import kiln
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


@st.composite
def index_cases(draw):
    shape = tuple(draw(st.lists(st.integers(1, 7), min_size=1, max_size=3)))
    key = []
    for d in shape:
        if draw(st.integers(0, 3)) == 0:
            key.append(draw(st.integers(-d, d - 1)))
        else:
            bound = st.one_of(st.none(), st.integers(-d - 1, d + 1))
            step = draw(st.sampled_from((None, 1, 2, 3, -1, -2)))
            key.append(slice(draw(bound), draw(bound), step))
        if draw(st.integers(0, 4)) == 0:
            key.append(None)
    if len(key) > 1 and draw(st.booleans()):  # drop the leading items behind an ellipsis
        key = [Ellipsis, *key[draw(st.integers(1, len(key) - 1)) :]]
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) * 0.5 - 3
    cat_axis = draw(st.integers(-len(shape), len(shape) - 1))
    assume(x[tuple(key)].size > 0)
    return x, tuple(key), cat_axis


def _check_indexing(case, machines, iree):
    x, key, axis = case

    def body(a):
        return (
            a[key] * 2,
            kiln.concatenate(
                [a, a * 2, a[..., :1]] if axis in (-1, a.ndim - 1) else [a, a * 2], axis=axis
            ),
            kiln.stack([a, -a], axis=axis),
            kiln.expand_dims(a, 0).squeeze(0).flatten(),
            a.swapaxes(0, -1),
            a.mT if a.ndim >= 2 else a,
            kiln.flip(a, axis),
        )

    results = run_all(body, [x], machines, iree)
    cat = [x, x * 2, x[..., :1]] if axis in (-1, x.ndim - 1) else [x, x * 2]
    want = [
        x[key] * 2,
        np.concatenate(cat, axis=axis),
        np.stack([x, -x], axis=axis),
        x.flatten(),
        np.swapaxes(x, 0, -1),
        np.swapaxes(x, -1, -2) if x.ndim >= 2 else x,
        np.flip(x, axis),
    ]
    for i, (got, expected) in enumerate(zip(results["cpu"], want, strict=True)):
        assert got.shape == expected.shape, f"output {i} (key {key})"
        np.testing.assert_array_equal(got, expected)
    assert_targets_agree(results, "f32")


@settings(max_examples=30, **COMMON)
@given(index_cases())
def test_indexing_and_shape_ops_match_numpy_on_cpu_and_sim(case):
    _check_indexing(case, SIM_MACHINES, iree=False)


@pytest.mark.skipif(not HAS_IREE, reason="iree-base-compiler/runtime not installed")
@settings(max_examples=1, **COMMON)
@given(index_cases())
def test_indexing_and_shape_ops_match_numpy_on_iree_cpu(case):
    _check_indexing(case, (), iree=True)


@st.composite
def contraction_cases(draw):
    m, k, n, b = (draw(st.integers(1, 6)) for _ in range(4))
    rng = np.random.default_rng(draw(st.integers(0, 99)))
    arrays = [
        rng.normal(size=s).astype(np.float32) for s in ((m, k), (k, n), (b, 1, m, k), (m,), (n,))
    ]
    return arrays, draw(st.sampled_from(sorted(EINSUM_OPERANDS)))


# einsum spec -> its operands, picked from (a: MxK, b: KxN, u: M, v: N)
EINSUM_OPERANDS = {
    "mk,kn->mn": lambda a, b, u, v: (a, b),
    "mk,nk->mn": lambda a, b, u, v: (a, b.T),
    "mk,mk->m": lambda a, b, u, v: (a, a),
    "mk,kn->nm": lambda a, b, u, v: (a, b),
    "mk,kn": lambda a, b, u, v: (a, b),
    "mk->km": lambda a, b, u, v: (a,),
    "mk->": lambda a, b, u, v: (a,),
    "m,n->mn": lambda a, b, u, v: (u, v),
}


def _check_contractions(case, machines, iree):
    (a, b, batched, u, v), spec = case
    pick = EINSUM_OPERANDS[spec]

    def body(ta, tb, tbatch, tu, tv):
        return (
            kiln.dot(ta, tb),
            tbatch @ tb,
            kiln.matmul(ta[None], kiln.stack([tb, tb * 2])),
            kiln.einsum(spec, *pick(ta, tb, tu, tv)),
        )

    results = run_all(body, [a, b, batched, u, v], machines, iree)
    wa, wb, wbatch, wu, wv = (x.astype(np.float64) for x in (a, b, batched, u, v))
    want = [
        wa @ wb,
        wbatch @ wb,
        wa[None] @ np.stack([wb, 2 * wb]),
        np.einsum(spec, *pick(wa, wb, wu, wv)),
    ]
    for got, expected in zip(results["cpu"], want, strict=True):
        assert_close(got, expected, 1e-5, 1e-5)
    assert_targets_agree(results, "f32")


@settings(max_examples=20, **COMMON)
@given(contraction_cases())
def test_contractions_match_float64_numpy_on_cpu_and_sim(case):
    _check_contractions(case, SIM_MACHINES, iree=False)


@pytest.mark.skipif(not HAS_IREE, reason="iree-base-compiler/runtime not installed")
@settings(max_examples=1, **COMMON)
@given(contraction_cases())
def test_contractions_match_float64_numpy_on_iree_cpu(case):
    _check_contractions(case, (), iree=True)
