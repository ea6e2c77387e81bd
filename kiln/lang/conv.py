"""Convolutions in full: 1-D/2-D/3-D, stride, dilation, padding, groups, both layouts,
and their backward passes (data and weight), all written over the ``conv2d`` op.

Inside, everything is channels-last with HWIO-style filters (taps..., C/groups, K):
``conv2d`` (an implicit GEMM on every target) does the work, a 1-D problem is a
2-D one with a unit height, a 3-D one is a sum over the filter's depth of 2-D
convolutions of depth slices, a grouped one is one conv per group, and a
depthwise one (one input channel per group) is a sum of shifted elementwise
products. Backward data is the forward convolution of the stride-dilated
output gradient with the flipped, channel-swapped filter; backward weight is
one small matmul per filter tap. Half-precision work is accumulated in f32.

Layouts: "NHWC" (channels last; filter K,taps...,C/groups) or "NCHW" (channels
first; filter K,C/groups,taps...). For 1-D and 3-D "NWC"/"NCW" and
"NDHWC"/"NCDHW" are accepted as well; the letters only say where C is.
"""

from __future__ import annotations

import builtins
import itertools
import math
from typing import Any

from kiln.errors import TraceError
from kiln.lang import elementwise as E
from kiln.lang import functions as F
from kiln.lang import shapes as S
from kiln.lang.tensor import Tensor, apply

_LAST = ("NHWC", "NWC", "NDHWC", "CHANNELS_LAST")
_FIRST = ("NCHW", "NCW", "NCDHW", "CHANNELS_FIRST")


def _channels_last(layout: Any, label: str = "conv") -> bool:
    name = str(layout).upper()
    if name in _LAST:
        return True
    if name in _FIRST:
        return False
    raise TraceError(
        f"{label}: unknown layout {layout!r}",
        expected="NHWC or NCHW (NWC/NCW, NDHWC/NCDHW)",
        found=repr(layout),
    )


def _per_dim(value: Any, dims: int, name: str, least: int, label: str) -> tuple[int, ...]:
    items = F.int_tuple(value, f"{label} {name}")
    items = items * dims if len(items) == 1 else items
    if len(items) != dims or builtins.any(v < least for v in items):
        raise TraceError(
            f"{label}: {name} must be an int >= {least} or {dims} of them, got {value!r}"
        )
    return items


def _pads(padding, dims, sizes, taps, stride, dilation, label) -> tuple[tuple[int, int], ...]:
    """(low, high) per spatial dim from an int, ints, pairs, "same" or "valid"."""
    if isinstance(padding, str):
        if padding.lower() == "valid":
            return ((0, 0),) * dims
        if padding.lower() != "same":
            raise TraceError(f"{label}: padding {padding!r} is not 'same', 'valid' or ints")
        out = []
        for n, k, s, d in zip(sizes, taps, stride, dilation, strict=True):
            total = builtins.max((math.ceil(n / s) - 1) * s + d * (k - 1) + 1 - n, 0)
            out.append((total // 2, total - total // 2))
        return tuple(out)
    if isinstance(padding, (tuple, list)) and padding and isinstance(padding[0], (tuple, list)):
        pairs = tuple(tuple(F.int_tuple(p, f"{label} padding")) for p in padding)
        if len(pairs) != dims or builtins.any(len(p) != 2 or min(p) < 0 for p in pairs):
            raise TraceError(
                f"{label}: padding needs {dims} (low, high) pairs >= 0, got {padding!r}"
            )
        return pairs
    return tuple((p, p) for p in _per_dim(padding, dims, "padding", 0, label))


def pad(x: Tensor, pads: tuple[tuple[int, int], ...], first_axis: int = 1) -> Tensor:
    """Zero-pad (or, for negative amounts, crop) axes ``first_axis...`` of ``x``."""
    for i, (lo, hi) in enumerate(pads):
        a = first_axis + i
        if lo < 0 or hi < 0:
            key = [slice(None)] * x.ndim
            key[a] = slice(builtins.max(-lo, 0), x.shape[a] - builtins.max(-hi, 0))
            x = S.getitem(x, tuple(key))
        parts = []
        for amount in (builtins.max(lo, 0), builtins.max(hi, 0)):
            shape = tuple(amount if j == a else d for j, d in enumerate(x.shape))
            parts.append(E.full(shape, 0, x.dtype) if amount else None)
        if parts[0] is not None or parts[1] is not None:
            x = S.concatenate([p for p in (parts[0], x, parts[1]) if p is not None], axis=a)
    return x


def check_ranks(label: str, shapes: dict[str, tuple[int, ...]], hint: str | None = None) -> None:
    """The operands of one convolution (named as the user wrote them) share a rank of 3, 4 or 5.

    Said before any transpose to channels-last, so the message shows the
    shapes the user gave, under the function they called. ``hint`` is for
    the last entry (a shape the user typed), said when that one is off.
    """
    (first, lead), *rest = shapes.items()
    listed = ", ".join(f"{name} {tuple(shape)}" for name, shape in shapes.items())
    if len(lead) not in (3, 4, 5):
        raise TraceError(
            f"{label}: {first} has rank {len(lead)}; a convolution's operands have rank "
            f"3, 4 or 5 (1-D, 2-D, 3-D); got {listed}",
            expected=f"{first} of rank 3, 4 or 5",
            found=f"{first} {tuple(lead)}",
            hint=hint,
        )
    for name, shape in rest:
        if len(shape) != len(lead):
            raise TraceError(
                f"{label}: {name} has rank {len(shape)}, not {len(lead)} like {first}; "
                f"got {listed}",
                expected=f"{name} of rank {len(lead)}, as {first}",
                found=f"{name} {tuple(shape)}",
                hint=hint if name == rest[-1][0] else None,
            )


class ConvGeometry:
    """One convolution's geometry, channels-last: x (N, *sizes, C), w (*taps, C/g, K).

    ``label`` is the function the user called: its errors carry that name.
    """

    def __init__(self, x_shape, w_shape, stride, padding, dilation, groups, label="conv"):
        self.dims = len(x_shape) - 2
        if self.dims not in (1, 2, 3) or len(w_shape) != len(x_shape):
            raise TraceError(
                f"{label}: needs input and filter of the same rank 3, 4 or 5 (1-D, 2-D, 3-D), "
                f"got shapes {tuple(x_shape)} and {tuple(w_shape)}"
            )
        self.n, self.sizes, self.c = x_shape[0], tuple(x_shape[1:-1]), x_shape[-1]
        self.taps, cg, self.k = tuple(w_shape[:-2]), w_shape[-2], w_shape[-1]
        if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
            raise TraceError(f"{label}: groups must be a positive int, got {groups!r}")
        self.groups = groups
        if self.c % groups or self.k % groups or cg * groups != self.c:
            raise TraceError(
                f"{label}: {self.c} input channels, {self.k} filters and {groups} groups do "
                f"not fit a filter with {cg} channels per group",
                hint="input channels = groups x filter channels; filters divisible by groups",
            )
        self.stride = _per_dim(stride, self.dims, "stride", 1, label)
        self.dilation = _per_dim(dilation, self.dims, "dilation", 1, label)
        self.pads = _pads(
            padding, self.dims, self.sizes, self.taps, self.stride, self.dilation, label
        )
        self.out = tuple(
            (n + lo + hi - d * (k - 1) - 1) // s + 1
            for n, k, s, d, (lo, hi) in zip(
                self.sizes, self.taps, self.stride, self.dilation, self.pads, strict=True
            )
        )
        if builtins.any(o <= 0 for o in self.out):
            raise TraceError(f"{label}: the output would be empty (spatial size {self.out})")

    @property
    def depthwise(self) -> bool:
        return self.groups > 1 and self.groups == self.c


def _to_last(x: Tensor, w: Tensor, last: bool) -> tuple[Tensor, Tensor]:
    """User layout -> channels-last input and (taps, C/g, K) filter."""
    r = x.ndim
    if not last:
        x = F.transpose(x, (0, *range(2, r), 1))
        return x, F.transpose(w, (*range(2, r), 1, 0))
    return x, F.transpose(w, (*range(1, r - 1), r - 1, 0))


def _x_from_last(x: Tensor, last: bool) -> Tensor:
    r = x.ndim
    return x if last else F.transpose(x, (0, r - 1, *range(1, r - 1)))


def _w_from_last(w: Tensor, last: bool) -> Tensor:
    r = w.ndim
    return F.transpose(w, (r - 1, *range(r - 2), r - 2) if last else (r - 1, r - 2, *range(r - 2)))


def _wide(t: Tensor) -> Tensor:
    return F.cast_to(t, "f32") if t.dtype in ("f16", "bf16") else t


def _tap_window(p: ConvGeometry, xp: Tensor, tap: tuple[int, ...]) -> Tensor:
    """The (N, *out, C) window of padded ``xp`` that filter tap ``tap`` meets."""
    key = [slice(None)]
    for t, s, d, o in zip(tap, p.stride, p.dilation, p.out, strict=True):
        key.append(slice(t * d, t * d + (o - 1) * s + 1, s))
    return S.getitem(xp, (*key, slice(None)))


def _forward(p: ConvGeometry, x: Tensor, w: Tensor) -> Tensor:
    """Channels-last forward convolution (x, w already in internal layout)."""
    if p.depthwise:
        return _depthwise(p, x, w)
    if p.groups > 1:
        cg, kg = p.c // p.groups, p.k // p.groups
        parts = []
        for g in range(p.groups):
            xg = S.getitem(x, (Ellipsis, slice(g * cg, (g + 1) * cg)))
            wg = S.getitem(w, (Ellipsis, slice(g * kg, (g + 1) * kg)))
            parts.append(_dense(p, xg, wg))
        return S.concatenate(parts, axis=-1)
    return _dense(p, x, w)


def _dense(p: ConvGeometry, x: Tensor, w: Tensor) -> Tensor:
    """groups=1: conv2d directly (1-D through a unit height, 3-D as a sum over depth)."""
    if p.dims == 1:
        x2 = S.expand_dims(x, 1)
        w2 = S.expand_dims(w, 0)
        pads = ((0, 0), p.pads[0])
        out = _conv2d(x2, w2, (1, p.stride[0]), pads, (1, p.dilation[0]))
        return S.squeeze(out, 1)
    if p.dims == 2:
        return _conv2d(x, w, p.stride, p.pads, p.dilation)
    xp = pad(x, (p.pads[0], (0, 0), (0, 0)))
    (sd, *s2), (dd, *d2), od = p.stride, p.dilation, p.out[0]
    total = None
    for kd in range(p.taps[0]):
        window = S.getitem(xp, (slice(None), slice(kd * dd, kd * dd + (od - 1) * sd + 1, sd)))
        flat = F.reshape(window, (p.n * od, *window.shape[2:]))
        part = _conv2d(flat, S.getitem(w, kd), tuple(s2), p.pads[1:], tuple(d2))
        part = _wide(part)
        total = part if total is None else F.add(total, part)
    out = F.reshape(total, (p.n, od, *total.shape[1:]))
    return F.cast_to(out, x.dtype)


def _conv2d(x: Tensor, w: Tensor, stride, pads, dilation) -> Tensor:
    """The conv2d op; asymmetric padding is applied to the input first."""
    if builtins.all(lo == hi for lo, hi in pads):
        padding = tuple(lo for lo, _ in pads)
    else:
        x, padding = pad(x, pads), (0, 0)
    return apply("conv2d", [x, w], stride=tuple(stride), padding=padding, dilation=tuple(dilation))


def _depthwise(p: ConvGeometry, x: Tensor, w: Tensor) -> Tensor:
    """One input channel per group: a sum over taps of window * filter row (f32 sums)."""
    mult = p.k // p.c
    xp = pad(x, p.pads)
    if mult > 1:  # each input channel feeds `mult` consecutive filters
        xp = F.reshape(
            F.broadcast_to(S.expand_dims(xp, -1), (*xp.shape, mult)), (*xp.shape[:-1], p.k)
        )
    total = None
    for tap in itertools.product(*(range(k) for k in p.taps)):
        term = F.multiply(_wide(_tap_window(p, xp, tap)), _wide(S.getitem(w, (*tap, 0))))
        total = term if total is None else F.add(total, term)
    return F.cast_to(total, x.dtype)


def conv(
    x: Any,
    w: Any,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    layout: str = "NHWC",
) -> Tensor:
    """N-d convolution (cross-correlation) of ``x`` with filter ``w`` in matching layout.

    NHWC: x (N, *spatial, C), w (K, *taps, C/groups). NCHW: x (N, C, *spatial),
    w (K, C/groups, *taps). ``padding``: int, one per dim, (low, high) pairs,
    "same" or "valid".
    """
    x, w = F.as_tensor(x, "conv"), F.as_tensor(w, "conv")
    check_ranks("conv", {"x": x.shape, "w": w.shape})
    last = _channels_last(layout)
    dtype = F.result_dtype([x, w])
    xl, wl = _to_last(F.cast_to(x, dtype), F.cast_to(w, dtype), last)
    p = ConvGeometry(xl.shape, wl.shape, stride, padding, dilation, groups)
    return _x_from_last(_forward(p, xl, wl), last)


def _dilate(dy: Tensor, stride: tuple[int, ...]) -> Tensor:
    """Insert ``s - 1`` zeros between neighbours along each spatial axis (length (O-1)s+1)."""
    for i, s in enumerate(stride):
        if s == 1:
            continue
        a = 1 + i
        o = dy.shape[a]
        zeros = E.zeros_like(S.expand_dims(dy, a + 1))
        spread = S.concatenate([S.expand_dims(dy, a + 1)] + [zeros] * (s - 1), axis=a + 1)
        merged = F.reshape(spread, (*dy.shape[:a], o * s, *dy.shape[a + 1 :]))
        dy = S.getitem(merged, (*[slice(None)] * a, slice(0, (o - 1) * s + 1)))
    return dy


def _check_grad(p: ConvGeometry, dy: Tensor, last: bool, label: str) -> None:
    """``dy`` (in the user's layout) has the shape of the convolution's output."""
    want = (p.n, *p.out, p.k) if last else (p.n, p.k, *p.out)
    if dy.shape != want:
        raise TraceError(
            f"{label}: dy has shape {dy.shape}, but the convolution's output is {want}",
            expected=f"dy of shape {want}",
            found=f"dy {dy.shape}",
        )


def conv_dgrad(
    dy: Any,
    w: Any,
    x_shape: Any,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    layout: str = "NHWC",
) -> Tensor:
    """Gradient of ``conv(x, w, ...)`` with respect to ``x`` (shape ``x_shape``), given ``dy``."""
    dy, w = F.as_tensor(dy, "conv_dgrad"), F.as_tensor(w, "conv_dgrad")
    shape = F.int_tuple(x_shape, "conv_dgrad x_shape")
    check_ranks(
        "conv_dgrad",
        {"dy": dy.shape, "w": w.shape, "x_shape": shape},
        hint="x_shape is the shape of conv's input x: dy's rank, in dy's layout",
    )
    last = _channels_last(layout, "conv_dgrad")
    dtype = F.result_dtype([dy, w])
    dyl, wl = _to_last(F.cast_to(dy, dtype), F.cast_to(w, dtype), last)
    shape = shape if last else (shape[0], *shape[2:], shape[1])
    p = ConvGeometry(shape, wl.shape, stride, padding, dilation, groups, "conv_dgrad")
    _check_grad(p, dy, last, "conv_dgrad")
    # The filter of the transposed problem: taps flipped, per group (C/g, K/g) -> (K/g, C/g).
    kg = p.k // p.groups
    flipped = S.flip(wl, tuple(range(p.dims)))
    blocks = [
        S.swapaxes(S.getitem(flipped, (Ellipsis, slice(g * kg, (g + 1) * kg))), -1, -2)
        for g in range(p.groups)
    ]
    wt = S.concatenate(blocks, axis=-1)
    pads = tuple(
        (d * (k - 1) - lo, n + lo - (o - 1) * s - 1)
        for n, k, s, d, (lo, _), o in zip(
            p.sizes, p.taps, p.stride, p.dilation, p.pads, p.out, strict=True
        )
    )
    spread = pad(_dilate(dyl, p.stride), pads)
    q = ConvGeometry(spread.shape, wt.shape, 1, 0, p.dilation, p.groups)
    return _x_from_last(_forward(q, spread, wt), last)


def conv_wgrad(
    x: Any,
    dy: Any,
    w_shape: Any,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    layout: str = "NHWC",
) -> Tensor:
    """Gradient of ``conv(x, w, ...)`` with respect to ``w`` (shape ``w_shape``), given ``dy``."""
    x, dy = F.as_tensor(x, "conv_wgrad"), F.as_tensor(dy, "conv_wgrad")
    shape = F.int_tuple(w_shape, "conv_wgrad w_shape")
    check_ranks(
        "conv_wgrad",
        {"x": x.shape, "dy": dy.shape, "w_shape": shape},
        hint="w_shape is the shape of conv's filter w: x's rank, in the layout's filter order",
    )
    last = _channels_last(layout, "conv_wgrad")
    dtype = F.result_dtype([x, dy])
    xl, dyl = _x_to_last(F.cast_to(x, dtype), last), _x_to_last(F.cast_to(dy, dtype), last)
    r = len(shape)
    wl_shape = (
        (*shape[1 : r - 1], shape[-1], shape[0]) if last else (*shape[2:], shape[1], shape[0])
    )
    p = ConvGeometry(xl.shape, wl_shape, stride, padding, dilation, groups, "conv_wgrad")
    _check_grad(p, dy, last, "conv_wgrad")
    xp = pad(xl, p.pads)
    rows = p.n * math.prod(p.out)
    dy2 = _wide(F.reshape(dyl, (rows, p.k)))
    kg, cg = p.k // p.groups, p.c // p.groups
    taps = []
    for tap in itertools.product(*(range(k) for k in p.taps)):
        window = _wide(F.reshape(_tap_window(p, xp, tap), (rows, p.c)))
        if p.depthwise:  # (1, K): each filter sees its own input channel
            mult = p.k // p.c
            rep = F.reshape(
                F.broadcast_to(S.expand_dims(window, -1), (rows, p.c, mult)), (rows, p.k)
            )
            taps.append(F.sum(F.multiply(rep, dy2), 0, keepdims=True))
            continue
        blocks = [
            F.matmul(
                S.matrix_transpose(S.getitem(window, (slice(None), slice(g * cg, (g + 1) * cg)))),
                S.getitem(dy2, (slice(None), slice(g * kg, (g + 1) * kg))),
            )
            for g in range(p.groups)
        ]
        taps.append(S.concatenate(blocks, axis=-1) if len(blocks) > 1 else blocks[0])
    dw = F.reshape(S.stack(taps), wl_shape)
    return F.cast_to(_w_from_last(dw, last), dtype)


def _x_to_last(x: Tensor, last: bool) -> Tensor:
    r = x.ndim
    return x if last else F.transpose(x, (0, *range(2, r), 1))
