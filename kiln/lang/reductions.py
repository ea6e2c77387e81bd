"""Reductions beyond sum/max/min/mean, and the softmax family, NumPy names and semantics.

``prod`` is a reduction op of its own; ``var``, ``std``, ``logsumexp``,
``argmax``/``argmin`` and the softmaxes are compositions of table ops, so
every target computes them with the arithmetic the oracle uses.
"""

from __future__ import annotations

import math
from typing import Any

from kiln.errors import TraceError
from kiln.lang import dtypes, shapes
from kiln.lang import functions as F
from kiln.lang.errors import DOCS_NOTE
from kiln.lang.tensor import Tensor, apply, constant


def prod(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    x = F.as_tensor(x, "prod")
    x = F.cast_to(x, dtypes.ARITHMETIC.get(x.dtype, x.dtype))
    return apply("prod", [x], axes=F.axes_of(x, axis, "prod"), keepdims=bool(keepdims))


def _float(x: Any, label: str) -> Tensor:
    x = F.as_tensor(x, label)
    return F.cast_to(x, dtypes.NEEDS_FLOAT.get(x.dtype, x.dtype))


def var(x: Any, axis: Any = None, keepdims: bool = False, ddof: int = 0) -> Tensor:
    """Variance ``mean((x - mean(x))**2)``; ``ddof`` divides by ``n - ddof`` like numpy."""
    x = _float(x, "var")
    axes = F.axes_of(x, axis, "var")
    centered = F.subtract(x, F.mean(x, axes, keepdims=True))
    out = F.mean(F.multiply(centered, centered), axes, keepdims)
    if ddof:
        n = math.prod(x.shape[a] for a in axes)
        out = F.multiply(out, n / (n - ddof) if n > ddof else math.inf)
    return out


def std(x: Any, axis: Any = None, keepdims: bool = False, ddof: int = 0) -> Tensor:
    return F.sqrt(var(x, axis, keepdims, ddof))


def logsumexp(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    """``log(sum(exp(x)))`` computed around the maximum so it does not overflow."""
    x = _float(x, "logsumexp")
    axes = F.axes_of(x, axis, "logsumexp")
    top = F.max(x, axes, keepdims=True)
    safe = F.where(F.equal(F.absolute(top), math.inf), 0.0, top)  # all -inf rows stay -inf
    total = F.sum(F.exp(F.subtract(x, safe)), axes, keepdims=True)
    out = F.add(F.log(total), safe)
    return out if keepdims else shapes.squeeze(out, axes)


def softmax(x: Any, axis: Any = -1) -> Tensor:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``."""
    x = _float(x, "softmax")
    axes = F.axes_of(x, axis, "softmax")
    e = F.exp(F.subtract(x, F.max(x, axes, keepdims=True)))
    return F.divide(e, F.sum(e, axes, keepdims=True))


def log_softmax(x: Any, axis: Any = -1) -> Tensor:
    x = _float(x, "log_softmax")
    axes = F.axes_of(x, axis, "log_softmax")
    return F.subtract(x, logsumexp(x, axes, keepdims=True))


def arange(n: int, *more: Any, dtype: Any = "i32") -> Tensor:
    """``0, 1, ..., n-1``, built from ~log2(n) two-element constants (no data tensor)."""
    if len(more) == 1 and dtypes.scalar_kind(more[0]) is None:
        dtype = more[0]  # arange(n, dtype) by position
    elif more:
        raise _arange_range((n, *more))
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise TraceError(f"arange: n must be a positive int, got {n!r}")
    bits = max(1, (n - 1).bit_length())
    value = F.reshape(constant(0, "i32"), (1,))
    for b in range(bits - 1, -1, -1):  # one binary digit per axis, most significant first
        pair = shapes.concatenate([F.reshape(constant(v, "i32"), (1,)) for v in (0, 1 << b)])
        value = F.add(F.reshape(value, value.shape + (1,)), pair)
    flat = F.reshape(value, (1 << bits,))
    return F.cast(shapes.getitem(flat, slice(0, n)), dtype)


def _arange_range(args: tuple) -> TraceError:
    """``arange(start, stop[, step])``: NumPy's longer forms, refused with the ``arange(n)``
    that computes the same."""
    given = f"arange({', '.join(map(repr, args))})"
    start, stop, step = (*args, 1)[:3] if len(args) < 4 else (None, None, None)
    hint = "write kiln.arange(n) * step + start"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in (start, stop, step)) and step:
        n = len(range(start, stop, step))
        if n > 0:
            hint = f"write kiln.arange({n})" + (f" * {step}" if step != 1 else "")
            hint += f" + {start}" if start else ""
    return TraceError(
        f"arange takes one argument n (np.arange(n)), got {given}",
        expected="kiln.arange(n): 0, 1, ..., n-1",
        found=given,
        hint=hint,
        notes=[DOCS_NOTE],
    )


def _arg(op: str, x: Any, axis: Any, keepdims: bool) -> Tensor:
    """Index of the first max (min): the smallest index whose value equals the extreme."""
    x = F.as_tensor(x, op)
    if axis is None:
        x, axis = shapes.flatten(x), 0
        if keepdims:
            raise TraceError(f"{op}: keepdims needs an axis")
    axes = F.axes_of(x, axis, op)
    if len(axes) != 1:  # numpy's argmax takes one axis too
        raise TraceError(f"{op}: axis must be an int or None, got {axis!r}")
    (a,) = axes
    n = x.shape[a]
    extreme = (F.max if op == "argmax" else F.min)(x, a, keepdims=True)
    hit = F.equal(x, extreme)
    if x.dtype not in ("i32", "bool"):  # a NaN is the extreme, as in numpy: the first one wins
        hit = F.maximum(hit, F.not_equal(x, x))
    index = shapes.expand_dims(arange(n), tuple(i for i in range(x.ndim) if i != a))
    index = F.broadcast_to(index, x.shape)
    return F.min(F.where(hit, index, n), a, keepdims)


def argmax(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    return _arg("argmax", x, axis, keepdims)


def argmin(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    return _arg("argmin", x, axis, keepdims)
