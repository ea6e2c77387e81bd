"""The op table: one entry per graph op with its type rule and its numpy meaning.

This is the single place an op is defined (STYLE 5). The tracer uses
``infer`` to type new nodes, ``Graph.verify`` re-checks with it, and the
eager path and the graph interpreter both run ``evaluate``. Half-precision
floats (f16, bf16) are computed in f32 and rounded once per op, which is
what the targets do too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kiln.ir.graph import TensorType

FLOAT_DTYPES = ("f32", "f16", "bf16")
# Elementwise unary ops every backend implements natively; kiln.lang composes the rest
# (silu, softplus, clip, ...) from these. The vISA and LIR op tables read this tuple.
UNARY_OPS = (
    *("neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu"),
    *("erf", "log1p", "expm1", "floor", "ceil", "round"),
)


class OpTypeError(ValueError):
    """An op was given inputs or attributes its type rule rejects."""


@dataclass(frozen=True, slots=True)
class OpDef:
    name: str
    kind: str  # source unary binary compare select cast reduce matmul layout concat conv
    arity: int  # -1: no fixed arity
    infer: Callable[[Sequence[TensorType], dict], TensorType] | None
    numpy: Callable[..., Any] | None  # (inputs: list[ndarray], attrs: dict) -> ndarray


def _same(op: str, types: Sequence[TensorType]) -> TensorType:
    first = types[0]
    for t in types[1:]:
        if t != first:
            raise OpTypeError(f"{op}: operands must share shape and dtype, got {first} and {t}")
    return first


def _infer_elementwise(op: str):
    def rule(types, attrs):
        return _same(op, types)

    return rule


def _infer_float_unary(op: str):
    def rule(types, attrs):
        (t,) = types
        if t.dtype not in FLOAT_DTYPES and op not in ("neg", "abs", "relu"):
            raise OpTypeError(f"{op}: needs a float operand, got {t.dtype}")
        return t

    return rule


def _infer_compare(types, attrs):
    t = _same("compare", types)
    return TensorType(t.shape, "bool")


def _infer_where(types, attrs):
    cond, a, b = types
    if cond.dtype != "bool":
        raise OpTypeError(f"where: condition must be bool, got {cond.dtype}")
    if cond.shape != a.shape:
        raise OpTypeError(f"where: condition shape {cond.shape} differs from {a.shape}")
    return _same("where", (a, b))


def _infer_cast(types, attrs):
    (t,) = types
    return TensorType(t.shape, attrs["dtype"])


def _infer_reduce(types, attrs):
    (t,) = types
    axes = tuple(attrs["axes"])
    if any(a < 0 or a >= t.rank for a in axes) or list(axes) != sorted(set(axes)):
        raise OpTypeError(f"reduce: axes {axes} invalid for rank {t.rank}")
    if attrs.get("keepdims"):
        shape = tuple(1 if i in axes else d for i, d in enumerate(t.shape))
    else:
        shape = tuple(d for i, d in enumerate(t.shape) if i not in axes)
    return TensorType(shape, t.dtype)


def _infer_matmul(types, attrs):
    a, b = types
    if a.rank < 2 or b.rank < 2:
        raise OpTypeError(f"matmul: operands must have rank >= 2, got {a} and {b}")
    if a.dtype != b.dtype:
        raise OpTypeError(f"matmul: dtypes differ ({a.dtype} vs {b.dtype})")
    if a.shape[:-2] != b.shape[:-2]:
        raise OpTypeError(f"matmul: batch dims differ ({a.shape[:-2]} vs {b.shape[:-2]})")
    if a.shape[-1] != b.shape[-2]:
        raise OpTypeError(
            f"matmul: contraction dims differ: {a.shape} @ {b.shape} "
            f"({a.shape[-1]} != {b.shape[-2]})"
        )
    return TensorType(a.shape[:-1] + (b.shape[-1],), a.dtype)


def _infer_transpose(types, attrs):
    (t,) = types
    perm = tuple(attrs["perm"])
    if sorted(perm) != list(range(t.rank)):
        raise OpTypeError(f"transpose: {perm} is not a permutation of rank {t.rank}")
    return TensorType(tuple(t.shape[p] for p in perm), t.dtype)


def _infer_reshape(types, attrs):
    (t,) = types
    shape = tuple(attrs["shape"])
    if math.prod(shape) != t.size:
        raise OpTypeError(f"reshape: cannot reshape {t.shape} ({t.size} elements) to {shape}")
    return TensorType(shape, t.dtype)


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """NumPy broadcasting of several shapes; raises OpTypeError when they clash."""
    rank = max(len(s) for s in shapes)
    out = []
    for axis in range(rank):
        dims = {s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise OpTypeError(
                "shapes " + " and ".join(str(tuple(s)) for s in shapes) + " do not broadcast"
            )
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _infer_broadcast(types, attrs):
    (t,) = types
    shape = tuple(attrs["shape"])
    if broadcast_shapes(t.shape, shape) != shape:
        raise OpTypeError(f"broadcast: {t.shape} does not broadcast to {shape}")
    return TensorType(shape, t.dtype)


def _infer_slice(types, attrs):
    (t,) = types
    starts, steps, sizes = (tuple(attrs[k]) for k in ("starts", "steps", "sizes"))
    if not len(starts) == len(steps) == len(sizes) == t.rank:
        raise OpTypeError(f"slice: needs one start, step and size per axis of {t}")
    for axis, (dim, start, step, size) in enumerate(
        zip(t.shape, starts, steps, sizes, strict=False)
    ):
        if step < 1 or size < 0 or start < 0 or (size and start + (size - 1) * step >= dim):
            raise OpTypeError(
                f"slice: axis {axis} of {t}: start {start}, step {step}, size {size} "
                "leaves the tensor"
            )
    return TensorType(sizes, t.dtype)


def _infer_concat(types, attrs):
    axis = attrs["axis"]
    first = types[0]
    if not 0 <= axis < first.rank:
        raise OpTypeError(f"concat: axis {axis} invalid for rank {first.rank}")
    for t in types[1:]:
        same = t.rank == first.rank and all(
            d == e for i, (d, e) in enumerate(zip(t.shape, first.shape, strict=False)) if i != axis
        )
        if not same or t.dtype != first.dtype:
            raise OpTypeError(f"concat: {t} does not match {first} off axis {axis}")
    size = sum(t.shape[axis] for t in types)
    return TensorType(first.shape[:axis] + (size,) + first.shape[axis + 1 :], first.dtype)


def conv2d_shape(x: tuple[int, ...], w: tuple[int, ...], attrs: dict) -> tuple[int, ...]:
    n, h, wd, c = x
    kh, kw, wc, f = w
    if wc != c:
        raise OpTypeError(f"conv2d: input has {c} channels, weight expects {wc}")
    (sh, sw), (ph, pw), (dh, dw) = attrs["stride"], attrs["padding"], attrs["dilation"]
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if oh <= 0 or ow <= 0:
        raise OpTypeError(f"conv2d: output would be empty ({oh}x{ow})")
    return (n, oh, ow, f)


def _infer_conv2d(types, attrs):
    x, w = types
    if x.rank != 4 or w.rank != 4:
        raise OpTypeError(f"conv2d: needs NHWC input and HWIO weight, got {x} and {w}")
    if x.dtype != w.dtype:
        raise OpTypeError(f"conv2d: dtypes differ ({x.dtype} vs {w.dtype})")
    return TensorType(conv2d_shape(x.shape, w.shape, attrs), x.dtype)


OPS: dict[str, OpDef] = {}


def _register(name, kind, arity, infer_rule, numpy_fn=None):
    OPS[name] = OpDef(name, kind, arity, infer_rule, numpy_fn)


_register("arg", "source", 0, None)
_register("const", "source", 0, None)
for _name in ("add", "sub", "mul", "div", "maximum", "minimum", "pow"):
    _register(_name, "binary", 2, _infer_elementwise(_name))
for _name in UNARY_OPS:
    _register(_name, "unary", 1, _infer_float_unary(_name))
for _name in ("lt", "le", "gt", "ge", "eq", "ne"):
    _register(_name, "compare", 2, _infer_compare)
_register("where", "select", 3, _infer_where)
_register("cast", "cast", 1, _infer_cast)
for _name in ("sum", "max", "min", "mean", "prod"):
    _register(_name, "reduce", 1, _infer_reduce)
_register("matmul", "matmul", 2, _infer_matmul)
_register("transpose", "layout", 1, _infer_transpose)
_register("reshape", "layout", 1, _infer_reshape)
_register("broadcast", "layout", 1, _infer_broadcast)
_register("slice", "layout", 1, _infer_slice)
_register("concat", "concat", -1, _infer_concat)
_register("conv2d", "conv", 2, _infer_conv2d)


def infer(op: str, types: Sequence[TensorType], attrs: dict, declared: TensorType | None = None):
    """Result type of ``op``; source ops (arg, const) keep their declared type."""
    opdef = OPS.get(op)
    if opdef is None:
        raise OpTypeError(f"unknown op {op!r}")
    if opdef.infer is None:
        if declared is None:
            raise OpTypeError(f"{op}: source op needs a declared type")
        return declared
    if opdef.arity >= 0 and len(types) != opdef.arity:
        raise OpTypeError(f"{op}: expects {opdef.arity} operands, got {len(types)}")
    return opdef.infer(types, attrs)
