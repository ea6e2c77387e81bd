"""Binding LIR instructions to memory once, so the simulator's inner loop is short.

``kiln.ir.lir_exec.execute`` decodes an instruction's operands into numpy
views on every call. The simulator runs the same binary many times, so
``bind`` builds those views once per prepared binary and returns a closure
per instruction. Common f32/i32 opcodes get a direct numpy call writing
into the destination view (``out=``); everything else calls the opcode's
own semantics from ``lir_exec``, which is also what the fast paths must
agree with (tests/runners/test_sim_exec.py checks both on every opcode).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln.ir.lir import Instr
from kiln.ir.lir_exec import apply, bind_operands

Bound = Callable[[], None]

_F32 = np.dtype(np.float32)
_I32 = np.dtype(np.int32)

_BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "maximum": np.maximum,
    "minimum": np.minimum,
}
_UNARY_F32 = {
    "neg": np.negative,
    "abs": np.absolute,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "tanh": np.tanh,
    "log1p": np.log1p,
    "expm1": np.expm1,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.rint,  # half to even, as np.round
}
_REDUCE = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


def _copy(instr: Instr, dst: np.ndarray, srcs: list[np.ndarray]) -> Bound | None:
    (src,) = srcs
    if src.dtype != dst.dtype or src.size != dst.size:
        return None
    if src.shape != dst.shape:  # same elements, other shape: only when a view can say it
        src = src.view()
        try:
            src.shape = dst.shape
        except AttributeError:
            return None
    return lambda: np.copyto(dst, src)


def _fill(instr: Instr, dst: np.ndarray, srcs: list[np.ndarray]) -> Bound | None:
    value = srcs[0].astype(dst.dtype)
    return lambda: dst.fill(value)


def _binary(instr: Instr, dst: np.ndarray, srcs: list[np.ndarray]) -> Bound | None:
    ufunc = _BINARY.get(instr.opcode)
    if instr.opcode == "div" and dst.dtype == _F32:
        ufunc = np.true_divide
    if ufunc is None or dst.dtype not in (_F32, _I32) or len(srcs) != 2:
        return None
    a, b = srcs
    if a.dtype != dst.dtype or b.dtype != dst.dtype:
        return None
    if np.broadcast_shapes(a.shape, b.shape, dst.shape) != dst.shape:
        return None
    return lambda: ufunc(a, b, out=dst)


def _unary(instr: Instr, dst: np.ndarray, srcs: list[np.ndarray]) -> Bound | None:
    ufunc = _UNARY_F32.get(instr.opcode)
    if ufunc is None or dst.dtype != _F32 or len(srcs) != 1:
        return None
    (a,) = srcs
    if a.dtype != _F32 or np.broadcast_shapes(a.shape, dst.shape) != dst.shape:
        return None
    return lambda: ufunc(a, out=dst)


def _mma(instr: Instr, dst: np.ndarray, srcs: list[np.ndarray]) -> Bound | None:
    a, b = srcs
    if not (a.dtype == b.dtype == dst.dtype == _F32) or a.ndim != 2 or b.ndim != 2:
        return None
    if dst.shape != (a.shape[0], b.shape[1]):
        return None
    if instr.arg("acc"):
        return lambda: np.add(dst, np.matmul(a, b), out=dst)
    return lambda: np.matmul(a, b, out=dst)


def _reduce(instr: Instr, dst: np.ndarray, srcs: list[np.ndarray]) -> Bound | None:
    (src,) = srcs
    if src.dtype != _F32 or dst.dtype != _F32:
        return None
    ufunc = _REDUCE[instr.opcode]
    axes = tuple(instr.arg("axes", ()))
    kept = tuple(1 if i in axes else d for i, d in enumerate(src.shape))
    if kept != dst.shape:
        return None
    if instr.arg("acc"):
        return lambda: ufunc(dst, ufunc.reduce(src, axis=axes, keepdims=True), out=dst)
    return lambda: ufunc.reduce(src, axis=axes, keepdims=True, out=dst)


FAST: dict[str, Callable[[Instr, np.ndarray, list[np.ndarray]], Bound | None]] = {
    "load": _copy,
    "store": _copy,
    "fill": _fill,
    "mma": _mma,
    **{op: _binary for op in (*_BINARY, "div")},
    **{op: _unary for op in _UNARY_F32},
    **{op: _reduce for op in _REDUCE},
}


def bind(instr: Instr, dram: np.ndarray, sram: np.ndarray) -> Bound:
    """A closure that runs ``instr`` on these two memories (views built now, once)."""
    semantics, dst, srcs = bind_operands(instr, dram, sram)
    fast = FAST.get(instr.opcode)
    bound = fast(instr, dst, srcs) if fast is not None else None
    if bound is not None:
        return bound

    def generic() -> None:
        apply(semantics, instr, dst, srcs)

    return generic
