"""The kernel ops: NumPy names and semantics, written over :func:`kiln.lang.tensor.apply`.

Every op puts its inputs in graph normal form first: Python scalars become
shape-() ``const`` nodes, operands are cast to one dtype (the tables in
:mod:`kiln.lang.dtypes`) and broadcast to one shape with explicit
``broadcast`` nodes. Errors are TraceErrors without a location; the
caller of the kernel points them at the user's line.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.errors import TraceError
from kiln.ir.ops import OpTypeError, broadcast_shapes
from kiln.lang import dtypes
from kiln.lang.errors import DOCS_NOTE
from kiln.lang.tensor import Tensor, apply, constant

Operand = Tensor | bool | int | float

_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**", "lt": "<", "le": "<="}
_SYMBOL.update({"gt": ">", "ge": ">=", "eq": "==", "ne": "!="})


def _label(op: str) -> str:
    return f"'{_SYMBOL[op]}' ({op})" if op in _SYMBOL else op


def _operand(value: Any, label: str) -> Tensor | bool | int | float:
    """A Tensor, or a Python scalar (numpy scalars and 0-d arrays become Python scalars)."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, np.ndarray):
        if value.ndim != 0:
            raise TraceError(
                f"{label}: a numpy array of shape {value.shape} cannot be used inside a kernel",
                hint="pass it to the kernel as an argument",
            )
        value = value[()]
    if dtypes.scalar_kind(value) is None:
        raise TraceError(f"{label}: unsupported operand of type {type(value).__name__}")
    return value.item() if isinstance(value, np.generic) else value


def _shape_of(value: Operand) -> tuple[int, ...]:
    return value.shape if isinstance(value, Tensor) else ()


def _common_shape(label: str, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    try:
        return broadcast_shapes(*shapes)
    except OpTypeError:
        raise TraceError(
            f"shape mismatch in {label}: "
            + " and ".join(str(s) for s in shapes)
            + " cannot be broadcast together",
            hint="NumPy broadcasting: trailing dims must be equal or 1",
        ) from None


def _dtype(values: Sequence[Operand], rule: dict[str, str] | None) -> str:
    """The one dtype of an elementwise op's operands (promotion tables, then the op's rule)."""
    strong = [v.dtype for v in values if isinstance(v, Tensor)]
    weak = [dtypes.scalar_kind(v) for v in values if not isinstance(v, Tensor)]
    dtype = dtypes.combine(strong, weak)
    return rule.get(dtype, dtype) if rule else dtype


def result_dtype(values: Sequence[Operand]) -> str:
    """The dtype operands promote to (kiln.lang.dtypes tables)."""
    return _dtype(values, None)


def _normalize(label: str, values: Sequence[Any], rule: dict[str, str] | None) -> list[Tensor]:
    """Cast and broadcast operands to one dtype and shape (the graph normal form)."""
    values = [_operand(v, label) for v in values]
    dtype = _dtype(values, rule)
    shape = _common_shape(label, [_shape_of(v) for v in values])
    return [_to(v, dtype, shape) for v in values]


def _to(value: Operand, dtype: str, shape: tuple[int, ...]) -> Tensor:
    tensor = value if isinstance(value, Tensor) else constant(value, dtype)
    return broadcast_op(cast_to(tensor, dtype), shape)


def cast_to(x: Tensor, dtype: str) -> Tensor:
    return x if x.dtype == dtype else apply("cast", [x], dtype=dtype)


def broadcast_op(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    return x if x.shape == shape else apply("broadcast", [x], shape=shape)


def as_tensor(value: Any, label: str) -> Tensor:
    value = _operand(value, label)
    if isinstance(value, Tensor):
        return value
    return constant(value, dtypes.combine([], [dtypes.scalar_kind(value)]))


# -- elementwise ---------------------------------------------------------------
def _binary(op: str, a: Any, b: Any, rule: dict[str, str] | None = None) -> Tensor:
    return apply(op, _normalize(_label(op), [a, b], rule))


def unary(op: str, x: Any, rule: dict[str, str] | None = None) -> Tensor:
    return apply(op, _normalize(op, [x], rule))


def add(a: Any, b: Any) -> Tensor:
    return _binary("add", a, b, dtypes.ARITHMETIC)


def subtract(a: Any, b: Any) -> Tensor:
    return _binary("sub", a, b, dtypes.ARITHMETIC)


def multiply(a: Any, b: Any) -> Tensor:
    return _binary("mul", a, b, dtypes.ARITHMETIC)


def divide(a: Any, b: Any) -> Tensor:
    """True division: integer operands are cast to f32 first."""
    return _binary("div", a, b, dtypes.NEEDS_FLOAT)


def power(a: Any, b: Any) -> Tensor:
    """``a ** b``; on integers only a constant exponent >= 0 (see _integer_power)."""
    label = _label("pow")
    a, b = _operand(a, label), _operand(b, label)
    if _dtype([a, b], dtypes.ARITHMETIC) == "i32":
        _integer_power(b, label)
    return _binary("pow", a, b, dtypes.ARITHMETIC)


def _integer_power(exponent: Operand, label: str) -> None:
    """NumPy raises for integers to a negative power; a target cannot raise while it runs.

    So a negative constant exponent is refused here, and so is an exponent
    tensor, whose sign is known only at run time.
    """
    if isinstance(exponent, Tensor):
        raise TraceError(
            f"{label}: an integer base to an integer exponent tensor ({exponent.dtype} "
            f"{list(exponent.shape)}) is not a kiln op: NumPy raises when an exponent is "
            "negative, which a target cannot do while it runs",
            hint="cast to float first: base.astype('f32') ** exponent",
            notes=[DOCS_NOTE],
        )
    if exponent < 0:
        raise TraceError(
            f"{label}: integers to negative integer powers are not allowed (exponent {exponent})",
            hint=f"compute in float: base.astype('f32') ** {exponent} (or base ** {exponent}.0)",
            notes=[DOCS_NOTE],
        )


def maximum(a: Any, b: Any) -> Tensor:
    return _binary("maximum", a, b)


def minimum(a: Any, b: Any) -> Tensor:
    return _binary("minimum", a, b)


def less(a: Any, b: Any) -> Tensor:
    return _binary("lt", a, b)


def less_equal(a: Any, b: Any) -> Tensor:
    return _binary("le", a, b)


def greater(a: Any, b: Any) -> Tensor:
    return _binary("gt", a, b)


def greater_equal(a: Any, b: Any) -> Tensor:
    return _binary("ge", a, b)


def equal(a: Any, b: Any) -> Tensor:
    return _binary("eq", a, b)


def not_equal(a: Any, b: Any) -> Tensor:
    return _binary("ne", a, b)


def logical_not(x: Any) -> Tensor:
    """``~mask`` for bool tensors (recorded as ``mask == False``)."""
    x = as_tensor(x, "~")
    if x.dtype != "bool":
        raise TraceError(f"'~' needs a bool tensor, got {x.dtype}: bitwise ops are not supported")
    return equal(x, False)


def negative(x: Any) -> Tensor:
    return unary("neg", x, dtypes.ARITHMETIC)


def absolute(x: Any) -> Tensor:
    return unary("abs", x, dtypes.ARITHMETIC)


def relu(x: Any) -> Tensor:
    return unary("relu", x, dtypes.ARITHMETIC)


def exp(x: Any) -> Tensor:
    return unary("exp", x, dtypes.NEEDS_FLOAT)


def log(x: Any) -> Tensor:
    return unary("log", x, dtypes.NEEDS_FLOAT)


def sqrt(x: Any) -> Tensor:
    return unary("sqrt", x, dtypes.NEEDS_FLOAT)


def rsqrt(x: Any) -> Tensor:
    """``1 / sqrt(x)``."""
    return unary("rsqrt", x, dtypes.NEEDS_FLOAT)


def tanh(x: Any) -> Tensor:
    return unary("tanh", x, dtypes.NEEDS_FLOAT)


def sigmoid(x: Any) -> Tensor:
    return unary("sigmoid", x, dtypes.NEEDS_FLOAT)


def gelu(x: Any) -> Tensor:
    """GELU, tanh approximation."""
    return unary("gelu", x, dtypes.NEEDS_FLOAT)


_MISSING = object()  # where(cond) and where(cond, a): NumPy's other forms, said by name


def where(condition: Any, a: Any = _MISSING, b: Any = _MISSING) -> Tensor:
    """``a`` where ``condition`` holds, else ``b`` (a non-bool condition means ``!= 0``)."""
    if a is _MISSING or b is _MISSING:
        given = 1 if a is _MISSING else 2
        raise TraceError(
            f"where: needs 3 arguments, where(condition, a, b), got {given}"
            + (
                "; NumPy's one-argument where(condition) is nonzero(condition), whose "
                "length depends on the data, and a kernel's shapes are static"
                if given == 1
                else ""
            ),
            expected="where(condition, a, b)",
            found="where(condition)" if given == 1 else "where(condition, a)",
            hint="choose between two values: kiln.where(condition, a, 0.0)",
            notes=[DOCS_NOTE],
        )
    cond, x, y = (_operand(v, "where") for v in (condition, a, b))
    shape = _common_shape("where", [_shape_of(v) for v in (cond, x, y)])
    dtype = _dtype([x, y], None)
    return apply("where", [_to(cond, "bool", shape), _to(x, dtype, shape), _to(y, dtype, shape)])


def cast(x: Any, dtype: Any) -> Tensor:
    """``x`` converted to ``dtype`` (a name like ``"f16"`` or a numpy dtype)."""
    name = dtypes.normalize(dtype)
    x = _operand(x, "cast")
    return cast_to(x, name) if isinstance(x, Tensor) else constant(x, name)


def broadcast_to(x: Any, shape: Any) -> Tensor:
    x = as_tensor(x, "broadcast_to")
    target = shape_tuple(shape, "broadcast_to")
    try:
        ok = broadcast_shapes(x.shape, target) == target
    except OpTypeError:
        ok = False
    if not ok:
        raise TraceError(f"broadcast_to: cannot broadcast shape {x.shape} to {target}")
    return broadcast_op(x, target)


# -- reductions ------------------------------------------------------------------
def axes_of(x: Tensor, axis: Any, label: str) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(x.ndim))
    items = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    out: list[int] = []
    for a in items:
        if isinstance(a, bool) or not isinstance(a, (int, np.integer)):
            raise TraceError(f"{label}: axis must be an int or a tuple of ints, got {a!r}")
        norm = int(a) + x.ndim if a < 0 else int(a)
        if not 0 <= norm < x.ndim:
            raise TraceError(
                f"{label}: axis {a} is out of range for a tensor of rank {x.ndim} "
                f"(shape {x.shape})",
                expected=f"an axis in [{-x.ndim}, {x.ndim - 1}]" if x.ndim else "no axis",
                found=str(a),
            )
        if norm in out:
            raise TraceError(f"{label}: axis {a} is repeated in {axis!r}")
        out.append(norm)
    return tuple(sorted(out))


def _reduce(op: str, x: Any, axis: Any, keepdims: bool, rule: dict | None) -> Tensor:
    x = as_tensor(x, op)
    if rule:
        x = cast_to(x, rule.get(x.dtype, x.dtype))
    return apply(op, [x], axes=axes_of(x, axis, op), keepdims=bool(keepdims))


def sum(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    return _reduce("sum", x, axis, keepdims, dtypes.ARITHMETIC)


def max(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    return _reduce("max", x, axis, keepdims, None)


def min(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    return _reduce("min", x, axis, keepdims, None)


def mean(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    """Mean; integer tensors are cast to f32 first."""
    return _reduce("mean", x, axis, keepdims, dtypes.NEEDS_FLOAT)


# -- matmul and layout -------------------------------------------------------------
def matmul(a: Any, b: Any) -> Tensor:
    """``a @ b`` with NumPy rules: 1-D operands are vectors, batch dims broadcast."""
    a, b = (_operand(v, "'@' (matmul)") for v in (a, b))
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)):
        raise TraceError("'@' (matmul) needs two tensors, not a Python scalar")
    if a.ndim == 0 or b.ndim == 0:
        raise TraceError(f"'@' (matmul) needs operands of rank >= 1, got {a.shape} @ {b.shape}")
    ka, kb = a.shape[-1], b.shape[0] if b.ndim == 1 else b.shape[-2]
    if ka != kb:
        raise TraceError(
            f"matmul inner dimensions differ: {a.shape} @ {b.shape} ({ka} != {kb})",
            hint="the last dim of the left operand must equal the second-to-last of the right",
        )
    dtype = _dtype([a, b], dtypes.ARITHMETIC)
    a, b = cast_to(a, dtype), cast_to(b, dtype)
    a_vec, b_vec = a.ndim == 1, b.ndim == 1
    if a_vec:
        a = reshape(a, (1, ka))
    if b_vec:
        b = reshape(b, (kb, 1))
    batch = _common_shape("matmul batch dims", [a.shape[:-2], b.shape[:-2]])
    a = broadcast_op(a, batch + a.shape[-2:])
    b = broadcast_op(b, batch + b.shape[-2:])
    out = apply("matmul", [a, b])
    if a_vec or b_vec:  # drop the unit dims the vectors were given
        rows = () if a_vec else out.shape[-2:-1]
        cols = () if b_vec else out.shape[-1:]
        out = reshape(out, out.shape[:-2] + rows + cols)
    return out


def transpose(x: Any, axes: Any = None) -> Tensor:
    """Permute axes (``None``: reverse them, like ``x.T``)."""
    x = as_tensor(x, "transpose")
    if axes is None:
        perm = tuple(range(x.ndim - 1, -1, -1))
    else:
        perm = int_tuple(axes, "transpose")
        perm = tuple(p + x.ndim if p < 0 else p for p in perm)
        if sorted(perm) != list(range(x.ndim)):
            raise TraceError(
                f"transpose: axes {tuple(axes)} are not a permutation of the {x.ndim} axes "
                f"of a tensor of shape {x.shape}"
            )
    if perm == tuple(range(x.ndim)):
        return x
    return apply("transpose", [x], perm=perm)


def permute(x: Any, *dims: Any) -> Tensor:
    """``permute(x, (1, 0))`` or ``permute(x, 1, 0)``: transpose with an explicit order."""
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    return transpose(x, dims)


def reshape(x: Any, shape: Any) -> Tensor:
    """A new shape with the same number of elements; one dim may be -1."""
    x = as_tensor(x, "reshape")
    dims = int_tuple(shape, "reshape")
    known = math.prod(d for d in dims if d != -1)
    bad = dims.count(-1) > 1 or builtins.any(d < -1 or d == 0 for d in dims)
    if not bad and -1 in dims:
        bad = known == 0 or x.size % known != 0
        dims = tuple(x.size // known if d == -1 else d for d in dims) if not bad else dims
    if bad or math.prod(dims) != x.size:
        raise TraceError(
            f"reshape: cannot reshape a tensor of shape {x.shape} ({x.size} elements) "
            f"into {int_tuple(shape, 'reshape')}",
            hint="the new shape must have the same number of elements; at most one -1",
        )
    return x if dims == x.shape else apply("reshape", [x], shape=dims)


def conv2d(x: Any, w: Any, stride: Any = 1, padding: Any = 0, dilation: Any = 1) -> Tensor:
    """2-D convolution: NHWC input, HWIO weight (cross-correlation, like most frameworks)."""
    x, w = as_tensor(x, "conv2d"), as_tensor(w, "conv2d")
    if x.ndim != 4 or w.ndim != 4:
        raise TraceError(
            f"conv2d needs an NHWC input and an HWIO weight (rank 4), got {x.shape} and {w.shape}"
        )
    attrs = {
        "stride": _pair(stride, "stride", 1),
        "padding": _pair(padding, "padding", 0),
        "dilation": _pair(dilation, "dilation", 1),
    }
    dtype = _dtype([x, w], dtypes.ARITHMETIC)
    return apply("conv2d", [cast_to(x, dtype), cast_to(w, dtype)], **attrs)


def _pair(value: Any, name: str, least: int) -> tuple[int, int]:
    pair = int_tuple(value, f"conv2d {name}")
    pair = pair * 2 if len(pair) == 1 else pair
    if len(pair) != 2 or builtins.any(v < least for v in pair):
        raise TraceError(
            f"conv2d: {name} must be an int >= {least} or a pair of them, got {value!r}"
        )
    return pair


def shape_tuple(value: Any, label: str) -> tuple[int, ...]:
    """A shape to make: ints >= 1 (a kernel's tensors are never empty, as for slices)."""
    shape = int_tuple(value, label)
    if not builtins.all(d >= 1 for d in shape):
        raise TraceError(
            f"{label}: shape {shape} has a dim below 1: kernels cannot make empty tensors",
            expected="dims >= 1",
            found=str(shape),
        )
    return shape


def int_tuple(value: Any, label: str) -> tuple[int, ...]:
    items = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not builtins.all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in items
    ):
        raise TraceError(f"{label}: expected an int or a tuple of ints, got {value!r}")
    return tuple(int(v) for v in items)
