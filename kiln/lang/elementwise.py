"""Elementwise ops beyond the v1 set, NumPy names; most are compositions of table ops.

Where the machine has no unit for a function (silu, softplus, clip, sign,
logical and/or), it is written here over ops every backend already has, so
each target computes it the same way the oracle does. ``erf``, ``log1p``,
``expm1``, ``floor``, ``ceil`` and ``round`` are ops of their own
(kiln/ir/ops.py UNARY_OPS): a composition would lose accuracy.
"""

from __future__ import annotations

import math
from typing import Any

from kiln.errors import TraceError
from kiln.lang import dtypes
from kiln.lang import functions as F
from kiln.lang.tensor import Tensor, constant

INF = math.inf


def _float_op(op: str, x: Any) -> Tensor:
    return F.unary(op, x, dtypes.NEEDS_FLOAT)


def erf(x: Any) -> Tensor:
    return _float_op("erf", x)


def log1p(x: Any) -> Tensor:
    """``log(1 + x)``, accurate for small ``x``."""
    return _float_op("log1p", x)


def expm1(x: Any) -> Tensor:
    """``exp(x) - 1``, accurate for small ``x``."""
    return _float_op("expm1", x)


def _rounding(op: str, x: Any) -> Tensor:
    x = F.as_tensor(x, op)
    if x.dtype in ("i32", "bool"):
        return x  # already whole numbers, as numpy keeps them
    return F.unary(op, x)


def floor(x: Any) -> Tensor:
    return _rounding("floor", x)


def ceil(x: Any) -> Tensor:
    return _rounding("ceil", x)


def round(x: Any, decimals: int = 0) -> Tensor:  # noqa: A001  (NumPy's name)
    """Round to the nearest whole number, halves to even (``np.round``; ``decimals=0`` only)."""
    if decimals is not None and decimals != 0:
        raise TraceError(
            f"round: only rounding to whole numbers is a kiln op, got decimals={decimals!r}",
            expected="round(x) or kiln.round(x)",
            found=f"decimals={decimals!r}",
            hint=f"scale first: kiln.round(x * {10**decimals}) / {10**decimals}"
            if isinstance(decimals, int) and decimals > 0
            else None,
        )
    return _rounding("round", x)


def square(x: Any) -> Tensor:
    x = F.as_tensor(x, "square")
    return F.multiply(x, x)


def reciprocal(x: Any) -> Tensor:
    return F.divide(1.0, x)


def clip(
    x: Any,
    a_min: Any = None,
    a_max: Any = None,
    *,
    min: Any = None,  # noqa: A002  (NumPy 2's keyword)
    max: Any = None,  # noqa: A002
) -> Tensor:
    """``minimum(maximum(x, a_min), a_max)``; either bound may be None.

    ``min=``/``max=`` are NumPy 2's keywords for the same bounds (``x.clip(max=1.0)``).
    """
    for name, old, new in (("min", a_min, min), ("max", a_max, max)):
        if old is not None and new is not None:
            raise TraceError(f"clip: give a_{name} or {name}, not both")
    a_min = a_min if min is None else min
    a_max = a_max if max is None else max
    if a_min is None and a_max is None:
        raise TraceError("clip: give a_min, a_max or both (or min=, max=)")
    x = F.as_tensor(x, "clip")
    if a_min is not None:
        x = F.maximum(x, a_min)
    if a_max is not None:
        x = F.minimum(x, a_max)
    return x


def silu(x: Any) -> Tensor:
    """``x * sigmoid(x)`` (also called swish)."""
    x = F.as_tensor(x, "silu")
    return F.multiply(x, F.sigmoid(x))


def softplus(x: Any) -> Tensor:
    """``log(1 + exp(x))``, as ``max(x, 0) + log1p(exp(-|x|))`` so it never overflows."""
    x = F.as_tensor(x, "softplus")
    return F.add(F.relu(x), log1p(F.exp(F.negative(F.absolute(x)))))


def gelu(x: Any, approximate: str = "tanh") -> Tensor:
    """GELU: ``approximate="tanh"`` (the default) or ``"none"`` for the exact erf form."""
    if approximate == "tanh":
        return F.gelu(x)
    if approximate not in ("none", "erf"):
        raise TraceError(
            f"gelu: approximate must be 'tanh' or 'none', got {approximate!r}",
            expected="'tanh' or 'none'",
            found=repr(approximate),
        )
    x = F.as_tensor(x, "gelu")
    inner = erf(F.multiply(x, 1.0 / math.sqrt(2.0)))
    return F.multiply(F.multiply(x, 0.5), F.add(inner, 1.0))


def sign(x: Any) -> Tensor:
    """-1, 0 or 1 by the sign of ``x`` (NaN stays NaN)."""
    x = F.as_tensor(x, "sign")
    if x.dtype == "bool":
        return x
    return F.where(F.greater(x, 0), 1, F.where(F.less(x, 0), -1, x))


def _bools(label: str, a: Any, b: Any) -> tuple[Tensor, Tensor]:
    a, b = F.as_tensor(a, label), F.as_tensor(b, label)
    for t in (a, b):
        if t.dtype != "bool":
            raise TraceError(
                f"'{label}' needs bool tensors, got {t.dtype}: bitwise integer ops are not "
                "supported",
                hint="compare first (x > 0) to get a bool mask",
            )
    return a, b


def logical_and(a: Any, b: Any) -> Tensor:
    """``a & b`` on bool tensors (the minimum of two bools)."""
    return F.minimum(*_bools("&", a, b))


def logical_or(a: Any, b: Any) -> Tensor:
    """``a | b`` on bool tensors (the maximum of two bools)."""
    return F.maximum(*_bools("|", a, b))


def logical_xor(a: Any, b: Any) -> Tensor:
    """``a ^ b`` on bool tensors."""
    return F.not_equal(*_bools("^", a, b))


def full(shape: Any, fill_value: bool | float, dtype: Any = None) -> Tensor:
    """A tensor of ``shape`` holding ``fill_value`` (±inf allowed for float dtypes).

    Without ``dtype``, NumPy's rule in kiln's dtypes: a float fills f32, an int i32, a bool bool.
    """
    target = F.shape_tuple(shape, "full") if shape != () else ()
    if dtype is None:
        kind = dtypes.scalar_kind(fill_value)
        if kind is None:
            raise TraceError(
                f"full: fill_value must be a Python number, got {type(fill_value).__name__}",
                hint="for a tensor, use kiln.broadcast_to(value, shape)",
            )
        dtype = dtypes.SCALAR_DEFAULT[kind]
    return F.broadcast_to(constant(fill_value, dtypes.normalize(dtype)), target)


def full_like(x: Any, fill_value: bool | float, dtype: Any = None) -> Tensor:
    x = F.as_tensor(x, "full_like")
    return full(x.shape, fill_value, dtype if dtype is not None else x.dtype)


def zeros_like(x: Any, dtype: Any = None) -> Tensor:
    return full_like(x, 0, dtype)


def ones_like(x: Any, dtype: Any = None) -> Tensor:
    return full_like(x, 1, dtype)
