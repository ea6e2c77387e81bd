"""Kernel dtypes and the promotion rules, written as tables.

Two tensors meet through :data:`PROMOTION`. A Python scalar is *weak*: it
takes the tensor's dtype (a float scalar next to an integer or bool tensor
makes f32). After promotion, arithmetic turns bool into i32, and ops that
need floats (true division, mean, exp, ...) turn i32 into f32.
docs/language.md shows the same tables.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.errors import TraceError
from kiln.ir.interp import NUMPY_DTYPES

f32 = "f32"
f16 = "f16"
bf16 = "bf16"
i32 = "i32"
bool_ = "bool"  # NumPy's spelling; comparisons make bool tensors
# ``bool`` is internal: comparisons make it, ``where`` and casts consume it.

KERNEL_DTYPES = ("f32", "f16", "bf16", "i32")  # what kernel arguments may be
ALL_DTYPES = KERNEL_DTYPES + ("bool",)
FLOATS = ("f32", "f16", "bf16")

ALIASES: dict[str, str] = {
    "f32": "f32",
    "float32": "f32",
    "f16": "f16",
    "float16": "f16",
    "half": "f16",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "i32": "i32",
    "int32": "i32",
    "bool": "bool",
}

# Strong operands: (a, b) -> result. Symmetric; looked up in both orders.
PROMOTION: dict[tuple[str, str], str] = {
    ("f32", "f32"): "f32",
    ("f32", "f16"): "f32",
    ("f32", "bf16"): "f32",
    ("f32", "i32"): "f32",
    ("f32", "bool"): "f32",
    ("f16", "f16"): "f16",
    ("f16", "bf16"): "f32",
    ("f16", "i32"): "f16",
    ("f16", "bool"): "f16",
    ("bf16", "bf16"): "bf16",
    ("bf16", "i32"): "bf16",
    ("bf16", "bool"): "bf16",
    ("i32", "i32"): "i32",
    ("i32", "bool"): "i32",
    ("bool", "bool"): "bool",
}

# A tensor of dtype (row) meets a weak Python scalar of kind (column).
WEAK_PROMOTION: dict[tuple[str, str], str] = {
    ("f32", "float"): "f32",
    ("f16", "float"): "f16",
    ("bf16", "float"): "bf16",
    ("i32", "float"): "f32",
    ("bool", "float"): "f32",
    ("f32", "int"): "f32",
    ("f16", "int"): "f16",
    ("bf16", "int"): "bf16",
    ("i32", "int"): "i32",
    ("bool", "int"): "i32",
    ("f32", "bool"): "f32",
    ("f16", "bool"): "f16",
    ("bf16", "bool"): "bf16",
    ("i32", "bool"): "i32",
    ("bool", "bool"): "bool",
}

# Only weak scalars meet (e.g. ``kiln.where(c, 1, 0.5)``): the default dtype of each kind.
SCALAR_DEFAULT: dict[str, str] = {"float": "f32", "int": "i32", "bool": "bool"}

# What an op class does to the promoted dtype: arithmetic has no bool, some ops need floats.
ARITHMETIC = {"bool": "i32"}
NEEDS_FLOAT = {"bool": "f32", "i32": "f32"}

# numpy dtypes accepted from eager callers, and the kernel dtype they become.
WIDE_EAGER_INPUTS: dict[np.dtype, str] = {
    np.dtype(np.float64): "f32",  # numpy's default float
    np.dtype(np.int64): "i32",  # numpy's default int
}


def eager_input_dtype(dtype: np.dtype) -> str | None:
    """The kernel dtype an eager caller's array of ``dtype`` becomes, or None."""
    return NUMPY_DTYPES.name_of(dtype) or WIDE_EAGER_INPUTS.get(np.dtype(dtype))


def promote(a: str, b: str) -> str:
    """Result dtype of two tensor operands."""
    return PROMOTION.get((a, b)) or PROMOTION[(b, a)]


def scalar_kind(value: Any) -> str | None:
    """``bool``/``int``/``float`` for a Python (or numpy) real scalar; None otherwise."""
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "int"
    if isinstance(value, (float, np.floating)):
        return "float"
    return None


def combine(strong: list[str], weak: list[str]) -> str:
    """Dtype of an elementwise op over tensors (``strong``) and scalars (``weak`` kinds)."""
    if strong:
        dtype = strong[0]
        for other in strong[1:]:
            dtype = promote(dtype, other)
        for kind in weak:
            dtype = WEAK_PROMOTION[(dtype, kind)]
        return dtype
    kinds = set(weak)
    for kind in ("float", "int", "bool"):
        if kind in kinds:
            return SCALAR_DEFAULT[kind]
    raise ValueError("combine() needs at least one operand")


def normalize(dtype: Any, *, allow_bool: bool = True) -> str:
    """Kiln dtype name of a name (``"f32"``, ``"float32"``), numpy dtype or scalar type."""
    name: str | None = None
    if isinstance(dtype, str):
        name = ALIASES.get(dtype.strip().lower())
    else:
        try:
            np_dtype = np.dtype(dtype)
        except TypeError:
            np_dtype = None
        if np_dtype is not None:
            name = NUMPY_DTYPES.name_of(np_dtype)
    if name is None or (name == "bool" and not allow_bool):
        allowed = ALL_DTYPES if allow_bool else KERNEL_DTYPES
        raise TraceError(
            f"unsupported dtype {_show(dtype)}",
            expected="one of " + ", ".join(allowed),
            found=_show(dtype),
        )
    return name


def _show(dtype: Any) -> str:
    if isinstance(dtype, str):
        return repr(dtype)
    return getattr(dtype, "__name__", None) or str(dtype)
