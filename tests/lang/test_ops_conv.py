"""Property: kiln.conv / conv_dgrad / conv_wgrad in every variant agree with float64 numpy
on every target, and the backward passes are the forward's gradient.

Variants drawn: 1-D/2-D/3-D, NHWC/NCHW, stride, dilation, symmetric,
asymmetric, "same" and "valid" padding, groups (grouped and depthwise).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kiln
from kiln.lang.conv import ConvGeometry
from tests.lang import conv_reference as ref
from tests.lang.targets import HAS_IREE, assert_close, assert_targets_agree, kernel, run_all

pytestmark = pytest.mark.usefixtures("shared_iree_cache")

COMMON = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@st.composite
def problems(draw):
    dims = draw(st.sampled_from((1, 2, 2, 3)))
    groups = draw(st.sampled_from((1, 1, 2, "depthwise")))
    cg = draw(st.integers(1, 3))
    if groups == "depthwise":
        c = draw(st.integers(2, 4))
        groups, cg, k = c, 1, c * draw(st.integers(1, 2))
    else:
        c, k = cg * groups, groups * draw(st.integers(1, 3))
    taps = tuple(draw(st.integers(1, 3)) for _ in range(dims))
    dilation = draw(st.integers(1, 2))
    stride = draw(st.integers(1, 2))
    span = [d := dilation * (t - 1) + 1 for t in taps]
    sizes = tuple(draw(st.integers(s, s + 4)) for s in span)
    padding = draw(
        st.one_of(
            st.sampled_from(("same", "valid", 0, 1)),
            st.tuples(*(st.tuples(st.integers(0, 2), st.integers(0, 2)) for _ in range(dims))),
        )
    )
    layout = draw(st.sampled_from(("NHWC", "NCHW")))
    n = draw(st.integers(1, 2))
    del d
    return dict(
        n=n, c=c, k=k, sizes=sizes, taps=taps, stride=stride, padding=padding,
        dilation=dilation, groups=groups, layout=layout, cg=cg,
    )  # fmt: skip


def _setup(p, seed):
    rng = np.random.default_rng(seed)
    last = p["layout"] == "NHWC"
    x = rng.normal(size=(p["n"], *p["sizes"], p["c"]))
    w = rng.normal(size=(*p["taps"], p["cg"], p["k"]))
    geo = ConvGeometry(x.shape, w.shape, p["stride"], p["padding"], p["dilation"], p["groups"])
    dy = rng.normal(size=(p["n"], *geo.out, p["k"]))
    kw = {k: p[k] for k in ("stride", "padding", "dilation", "groups", "layout")}
    return last, x, w, dy, geo, kw


def _f32(a):
    return np.ascontiguousarray(a, dtype=np.float32)


def _check_all_passes(p, machines, iree):
    """conv, conv_dgrad and conv_wgrad in one kernel, against float64 numpy, on the targets."""
    last, x, w, dy, geo, kw = _setup(p, 0)
    xu, wu, dyu = (
        _f32(a) for a in (ref.x_to_user(x, last), ref.w_to_user(w, last), ref.x_to_user(dy, last))
    )

    def body(a, b, g):
        return (
            kiln.conv(a, b, **kw),
            kiln.conv_dgrad(g, b, xu.shape, **kw),
            kiln.conv_wgrad(a, g, wu.shape, **kw),
        )

    results = run_all(body, [xu, wu, dyu], machines, iree)
    xs, ws, dys = ref.x_from_user(xu, last), ref.w_from_user(wu, last), ref.x_from_user(dyu, last)
    geometry = (geo.stride, geo.pads, geo.dilation, p["groups"])
    want = (
        ref.x_to_user(ref.forward(xs, ws, *geometry), last),
        ref.x_to_user(ref.dgrad(dys, ws, xs.shape, *geometry), last),
        ref.w_to_user(ref.wgrad(xs, dys, ws.shape, *geometry), last),
    )
    for name, got, expected in zip(
        ("forward", "dgrad", "wgrad"), results["cpu"], want, strict=True
    ):
        try:
            assert_close(got, expected, 1e-4, 1e-3)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None
    assert_targets_agree(results, "f32", ["forward", "dgrad", "wgrad"])


@settings(max_examples=25, **COMMON)
@given(problems())
def test_conv_and_its_gradients_match_float64_numpy_on_cpu_and_sim(p):
    _check_all_passes(p, ("npu-v1",), iree=False)


@pytest.mark.skipif(not HAS_IREE, reason="iree-base-compiler/runtime not installed")
@settings(max_examples=2, **COMMON)  # each conv kernel is several seconds of IREE compile
@given(problems())
def test_conv_and_its_gradients_match_float64_numpy_on_iree_cpu(p):
    _check_all_passes(p, (), iree=True)


@settings(max_examples=15, **COMMON)
@given(problems())
def test_backward_passes_are_the_numerical_gradient_of_the_forward(p):
    """Finite differences of sum(conv(x, w) * dy) in float64 match dgrad and wgrad."""
    last, x, w, dy, _, kw = _setup(p, 3)
    xu, wu, dyu = ref.x_to_user(x, last), ref.w_to_user(w, last), ref.x_to_user(dy, last)

    forward = kernel(lambda a, b: kiln.conv(a, b, **kw), [xu, wu])

    def loss(xv, wv):
        return float((np.asarray(forward(_f32(xv), _f32(wv)), np.float64) * dyu).sum())

    dgrad = kernel(lambda a, b: kiln.conv_dgrad(a, b, xu.shape, **kw), [dyu, wu])
    wgrad = kernel(lambda a, b: kiln.conv_wgrad(a, b, wu.shape, **kw), [xu, dyu])
    dx = np.asarray(dgrad(_f32(dyu), _f32(wu)), np.float64)
    dw = np.asarray(wgrad(_f32(xu), _f32(dyu)), np.float64)
    rng = np.random.default_rng(4)
    eps = 1e-2  # the forward is linear: central differences are exact up to f32 rounding
    for value, grad, which in ((xu, dx, 0), (wu, dw, 1)):
        for flat in rng.choice(value.size, size=min(3, value.size), replace=False):
            idx = np.unravel_index(flat, value.shape)
            up, down = value.copy(), value.copy()
            up[idx] += eps
            down[idx] -= eps
            args_up = (up, wu) if which == 0 else (xu, up)
            args_down = (down, wu) if which == 0 else (xu, down)
            numeric = (loss(*args_up) - loss(*args_down)) / (2 * eps)
            assert numeric == pytest.approx(grad[idx], rel=2e-2, abs=2e-2)


@pytest.mark.parametrize("dtype, tol", [("f16", 1e-2), ("bf16", 5e-2)])
def test_half_precision_passes_are_within_documented_tolerance(dtype, tol):
    from kiln.ir.interp import NUMPY_DTYPES

    half = NUMPY_DTYPES[dtype]
    rng = np.random.default_rng(5)
    x = rng.normal(size=(1, 6, 6, 4)).astype(half)
    w = rng.normal(size=(4, 3, 3, 4)).astype(half)
    dy = rng.normal(size=(1, 3, 3, 4)).astype(half)
    kw = dict(stride=2, padding="same")

    def body(a, b, g):
        return (
            kiln.conv(a, b, **kw),
            kiln.conv_dgrad(g, b, x.shape, **kw),
            kiln.conv_wgrad(a, g, w.shape, **kw),
        )

    results = run_all(body, [x, w, dy], ("npu-v1",))
    geometry = ((2, 2), ((0, 1), (0, 1)), (1, 1), 1)
    ws = ref.w_from_user(w, True)
    want = (
        ref.forward(x, ws, *geometry),
        ref.dgrad(dy, ws, x.shape, *geometry),
        ref.w_to_user(ref.wgrad(x, dy, ws.shape, *geometry), True),
    )
    for got, expected in zip(results["cpu"], want, strict=True):
        assert_close(got, expected, tol, tol * np.abs(expected).max())
    assert_targets_agree(results, dtype)
