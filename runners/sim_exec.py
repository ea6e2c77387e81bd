"""Binding LIR instructions to memory once, so the simulator's inner loop is short.

``kiln.ir.lir_exec.execute`` decodes an instruction's operands into numpy
views on every call. The simulator runs the same binary many times, so it
binds every instruction once per prepared binary: a step (a
``functools.partial``, called with no arguments) per instruction. Common
f32/i32 opcodes get a direct numpy call writing into the destination view;
everything else calls the opcode's own semantics from ``lir_exec``, which
is also what the fast paths must agree with (tests/runners/test_sim_exec.py
checks both on every opcode).

Which path runs is decided once per *template* (``sim_templates``:
instructions that differ only in their addresses, ``choose``); a fast
path's ``build`` gives each instruction's (callable, *arguments), which
``sim_bind`` turns into steps in the order they run.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import repeat
from operator import attrgetter, call, setitem
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from kiln.ir.interp import NUMPY_DTYPES
from kiln.ir.lir import Instr
from kiln.ir.lir_exec import apply, bind_operands

if TYPE_CHECKING:
    from kiln.runners.sim_templates import Operand, Template

Step = Callable[[], None]
# views of every row (the destination's, then one list per source) -> per row, a step's
# (callable, *arguments): steps are made later, in the order they run
Build = Callable[..., list[tuple]]

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
# numpy 2.4 deprecates a positional ``out`` for these two (other ufuncs take it, cheaper)
_OUT_BY_KEYWORD = (np.maximum, np.minimum)


@dataclass(frozen=True, slots=True)
class Spec:
    """What a fast path needs to know of an operand: its type, and an immediate's value."""

    dtype: np.dtype
    shape: tuple[int, ...]
    const: np.ndarray | None = None  # immediates only

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True, slots=True)
class Fast:
    """A fast path for a template: how to build its steps, and a source to view reshaped."""

    build: Build
    reshape: dict[int, tuple[int, ...]]  # source index -> the shape its view takes


Arg = Callable[[str], Any]


def _copy(opcode: str, arg: Arg, dst: Spec, srcs: list[Spec]) -> Fast | None:
    (src,) = srcs
    if src.dtype != dst.dtype or src.size != dst.size or src.const is not None:
        return None
    # same dtype and shape: an element copy, as np.copyto; setitem is the cheaper call
    reshape = {} if src.shape == dst.shape else {0: dst.shape}
    return Fast(lambda d, s: list(zip(repeat(setitem), d, repeat(Ellipsis), s)), reshape)


def _fill(opcode: str, arg: Arg, dst: Spec, srcs: list[Spec]) -> Fast | None:
    if srcs[0].const is None:  # a memory source: its value is known only when it runs
        return None
    value = srcs[0].const.astype(dst.dtype)
    return Fast(lambda d, s: list(zip(map(attrgetter("fill"), d), repeat(value))), {})


def _binary(opcode: str, arg: Arg, dst: Spec, srcs: list[Spec]) -> Fast | None:
    ufunc = _BINARY.get(opcode)
    if opcode == "div" and dst.dtype == _F32:
        ufunc = np.true_divide
    if ufunc is None or dst.dtype not in (_F32, _I32) or len(srcs) != 2:
        return None
    a, b = srcs
    if a.dtype != dst.dtype or b.dtype != dst.dtype:
        return None
    try:
        if np.broadcast_shapes(a.shape, b.shape, dst.shape) != dst.shape:
            return None
    except ValueError:
        return None
    if ufunc in _OUT_BY_KEYWORD:
        return Fast(lambda d, a, b: list(zip(repeat(_out_by_keyword), repeat(ufunc), a, b, d)), {})
    return Fast(lambda d, a, b: list(zip(repeat(ufunc), a, b, d)), {})


def _unary(opcode: str, arg: Arg, dst: Spec, srcs: list[Spec]) -> Fast | None:
    ufunc = _UNARY_F32.get(opcode)
    if ufunc is None or dst.dtype != _F32 or len(srcs) != 1:
        return None
    (a,) = srcs
    try:
        if a.dtype != _F32 or np.broadcast_shapes(a.shape, dst.shape) != dst.shape:
            return None
    except ValueError:
        return None
    return Fast(lambda d, a: list(zip(repeat(ufunc), a, d)), {})


def _out_by_keyword(ufunc: np.ufunc, a: np.ndarray, b: np.ndarray, dst: np.ndarray) -> None:
    ufunc(a, b, out=dst)


def _mma_acc(a: np.ndarray, b: np.ndarray, dst: np.ndarray) -> None:
    np.add(dst, np.matmul(a, b), out=dst)


def _mma(opcode: str, arg: Arg, dst: Spec, srcs: list[Spec]) -> Fast | None:
    if len(srcs) != 2:
        return None
    a, b = srcs
    if not (a.dtype == b.dtype == dst.dtype == _F32) or len(a.shape) != 2 or len(b.shape) != 2:
        return None
    if a.shape[1] != b.shape[0] or dst.shape != (a.shape[0], b.shape[1]):
        return None
    fn = _mma_acc if arg("acc") else np.matmul
    return Fast(lambda d, a, b: list(zip(repeat(fn), a, b, d)), {})


def _reduce_acc(ufunc, src: np.ndarray, axes: tuple, part: np.ndarray, dst: np.ndarray) -> None:
    """dst = dst (op) reduce(src), the reduction first into ``part`` (a template's scratch)."""
    ufunc.reduce(src, axes, None, part, True)
    if ufunc in _OUT_BY_KEYWORD:
        ufunc(dst, part, out=dst)
    else:
        ufunc(dst, part, dst)


def _reduce(opcode: str, arg: Arg, dst: Spec, srcs: list[Spec]) -> Fast | None:
    if len(srcs) != 1:
        return None
    (src,) = srcs
    if src.dtype != _F32 or dst.dtype != _F32 or src.const is not None:
        return None
    ufunc = _REDUCE[opcode]
    axes = tuple(arg("axes") or ())
    if not all(type(a) is int and 0 <= a < len(src.shape) for a in axes):
        return None
    kept = tuple(1 if i in axes else d for i, d in enumerate(src.shape))
    if kept != dst.shape:
        return None
    if arg("acc"):
        scratch = (dst.shape, dst.dtype)  # one per binding: where the reduction goes first
        return Fast(
            lambda d, s: list(
                zip(
                    repeat(_reduce_acc),
                    repeat(ufunc),
                    s,
                    repeat(axes),
                    repeat(np.empty(*scratch)),
                    d,
                )
            ),
            {},
        )
    reduce = ufunc.reduce  # (array, axis, dtype, out, keepdims): positional, the cheaper call
    return Fast(
        lambda d, s: list(zip(repeat(reduce), s, repeat(axes), repeat(None), d, repeat(True))), {}
    )


FAST: dict[str, Callable[[str, Arg, Spec, list[Spec]], Fast | None]] = {
    "load": _copy,
    "store": _copy,
    "fill": _fill,
    "mma": _mma,
    **{op: _binary for op in (*_BINARY, "div")},
    **{op: _unary for op in _UNARY_F32},
    **{op: _reduce for op in _REDUCE},
}


def _spec(op: Operand) -> Spec:
    dtype = NUMPY_DTYPES[op.dtype]
    if op.kind == "imm":
        return Spec(dtype, (), np.asarray(op.value, dtype=dtype))
    return Spec(dtype, op.shape)


def _reshapable(op: Operand, shape: tuple[int, ...]) -> bool:
    """Whether a view of ``op`` takes ``shape`` without a copy (same for every address)."""
    dtype = NUMPY_DTYPES[op.dtype]
    view = as_strided(np.zeros(1, dtype), op.shape, byte_strides(op, dtype))
    try:
        view.shape = shape
    except AttributeError:
        return False
    return True


def choose(t: Template) -> Fast | None:
    """The fast path of a template, or None: it runs ``lir_exec``'s semantics."""
    fast = FAST.get(t.opcode)
    if fast is None or t.dst is None or t.dst.kind == "imm":
        return None
    chosen = fast(t.opcode, t.arg, _spec(t.dst), [_spec(s) for s in t.srcs])
    if chosen is not None:
        for k, shape in chosen.reshape.items():
            if not _reshapable(t.srcs[k], shape):
                return None
    return chosen


def byte_strides(op: Operand, dtype: np.dtype) -> tuple[int, ...]:
    if op.strides is None:  # sram: row-major
        out, acc = [], dtype.itemsize
        for d in reversed(op.shape):
            out.append(acc)
            acc *= d
        return tuple(reversed(out))
    return tuple(s * dtype.itemsize for s in op.strides)


def extent(op: Operand) -> int:
    """Bytes from an operand's address to one past its last element (0: no elements)."""
    dtype = NUMPY_DTYPES[op.dtype]
    if math.prod(op.shape) == 0:
        return 0
    return sum((d - 1) * s for d, s in zip(op.shape, byte_strides(op, dtype), strict=True)) + (
        dtype.itemsize
    )


def bind(instr: Instr, dram: np.ndarray, sram: np.ndarray) -> Step:
    """A step that runs one ``instr`` on these two memories (views built now, once)."""
    semantics, dst, srcs = bind_operands(instr, dram, sram)
    kinds = [s[0] for s in instr.arg("srcs", ())]
    specs = [
        Spec(v.dtype, v.shape, v if kind == "imm" else None)
        for v, kind in zip(srcs, kinds, strict=True)
    ]
    fast = FAST.get(instr.opcode)
    chosen = fast(instr.opcode, instr.arg, Spec(dst.dtype, dst.shape), specs) if fast else None
    if chosen is not None:
        views = list(srcs)
        for k, shape in chosen.reshape.items():
            view = views[k].view()
            try:
                view.shape = shape
            except AttributeError:
                chosen = None
                break
            views[k] = view
        if chosen is not None:
            return partial(*chosen.build([dst], *([v] for v in views))[0])
    return partial(apply, semantics, instr, dst, srcs)


def run_steps(steps: Sequence[Step]) -> None:
    """Call every step in order; the loop is in C (about 40 ns a step less than ``for``)."""
    _drain(map(call, steps))


_drain = deque(maxlen=0).extend
