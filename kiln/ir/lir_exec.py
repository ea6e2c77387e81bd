"""What every LIR opcode does, in numpy, on DRAM/SRAM byte arrays.

An instruction's ``args`` hold everything it needs: ``dst`` and ``srcs`` are
operands, each a tuple:

- ``("sram", addr, dtype, shape)``: a row-major tile at byte ``addr``;
- ``("dram", addr, dtype, shape, strides)``: a strided view at byte ``addr``
  (strides in elements; 0 repeats an element, as broadcasts do);
- ``("imm", value, dtype)``: a scalar.

Opcode-specific keys: ``acc`` (mma, sum/max/min: 1 combines with the old
destination), ``axes`` (sum/max/min, reduced axes kept as size 1), ``perm``
(transpose). Op meaning comes from :func:`kiln.ir.interp.evaluate`, so the
oracle and the simulator cannot disagree; half floats are computed in f32 and
rounded when stored.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from kiln.ir.graph import TensorType
from kiln.ir.interp import NUMPY_DTYPES, evaluate
from kiln.ir.lir import Instr, Program
from kiln.ir.ops import UNARY_OPS


class LirExecError(RuntimeError):
    """An instruction could not run: bad operand, out-of-bounds access, unknown opcode."""


def _contig_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def _where(instr: Instr) -> str:
    return f"instruction {instr.id} ({instr.text or instr.opcode})"


def operand_array(instr: Instr, operand: tuple, dram: np.ndarray, sram: np.ndarray) -> np.ndarray:
    """A numpy view of a memory operand (writable), or a 0-d array for an immediate."""
    kind = operand[0]
    if kind == "imm":
        return np.asarray(operand[1], dtype=NUMPY_DTYPES[operand[2]])
    if kind == "sram":
        _, addr, dtype, shape = operand
        strides, memory = _contig_strides(shape), sram
    elif kind == "dram":
        _, addr, dtype, shape, strides = operand
        memory = dram
    else:
        raise LirExecError(f"{_where(instr)}: unknown operand kind {kind!r}")
    dt = NUMPY_DTYPES[dtype]
    shape, strides = tuple(shape), tuple(strides)
    if math.prod(shape) == 0:
        return np.zeros(shape, dtype=dt)
    extent = (sum((d - 1) * s for d, s in zip(shape, strides, strict=True)) + 1) * dt.itemsize
    if addr < 0 or min(strides, default=0) < 0 or addr + extent > memory.size:
        raise LirExecError(
            f"{_where(instr)}: {kind} access [{addr}, {addr + extent}) is outside "
            f"the {kind} of {memory.size} bytes"
        )
    return np.ndarray(
        shape, dtype=dt, buffer=memory, offset=addr, strides=tuple(s * dt.itemsize for s in strides)
    )


def _type(operand: tuple) -> TensorType:
    return TensorType(tuple(operand[3]), operand[2])


def _put(dst: np.ndarray, value: np.ndarray) -> None:
    dst[...] = np.asarray(value).reshape(dst.shape)


def _load(instr: Instr, dst: np.ndarray, srcs: list[np.ndarray]) -> None:
    _put(dst, srcs[0])


def _mma(instr: Instr, dst: np.ndarray, srcs: list[np.ndarray]) -> None:
    out = _type(instr.arg("dst"))
    result = evaluate("matmul", srcs, {}, out)
    if instr.arg("acc"):
        result = evaluate("add", [dst.copy(), result], {}, out)
    _put(dst, result)


def _elementwise(instr: Instr, dst: np.ndarray, srcs: list[np.ndarray]) -> None:
    out = _type(instr.arg("dst"))
    values = [np.broadcast_to(s, out.shape) for s in srcs]  # immediates, row operands
    attrs = {"dtype": out.dtype} if instr.opcode == "cast" else {}
    _put(dst, evaluate(instr.opcode, values, attrs, out))


_COMBINE = {"sum": "add", "max": "maximum", "min": "minimum", "prod": "mul"}


def _reduce(instr: Instr, dst: np.ndarray, srcs: list[np.ndarray]) -> None:
    out = _type(instr.arg("dst"))
    attrs = {"axes": tuple(instr.arg("axes", ())), "keepdims": True}
    result = evaluate(instr.opcode, srcs, attrs, out)
    if instr.arg("acc"):
        result = evaluate(_COMBINE[instr.opcode], [dst.copy(), result], {}, out)
    _put(dst, result)


def _transpose(instr: Instr, dst: np.ndarray, srcs: list[np.ndarray]) -> None:
    out = _type(instr.arg("dst"))
    _put(dst, evaluate("transpose", srcs, {"perm": tuple(instr.arg("perm"))}, out))


def _fill(instr: Instr, dst: np.ndarray, srcs: list[np.ndarray]) -> None:
    dst[...] = srcs[0].astype(dst.dtype)


Semantics = Callable[[Instr, np.ndarray, list[np.ndarray]], None]
OPCODES: dict[str, Semantics] = {
    "load": _load,
    "store": _load,
    "mma": _mma,
    **{
        op: _elementwise
        for op in (
            *UNARY_OPS,
            *("add", "sub", "mul", "div", "maximum", "minimum", "pow"),
            *("lt", "le", "gt", "ge", "eq", "ne", "where", "cast"),
        )
    },
    "sum": _reduce,
    "max": _reduce,
    "min": _reduce,
    "prod": _reduce,
    "transpose": _transpose,
    "fill": _fill,
}


def bind_operands(instr: Instr, dram: np.ndarray, sram: np.ndarray):
    """(semantics, destination view, source views) of one instruction on these memories."""
    semantics = OPCODES.get(instr.opcode)
    if semantics is None:
        raise LirExecError(f"{_where(instr)}: unknown opcode {instr.opcode!r}")
    dst_operand = instr.arg("dst")
    if dst_operand is None or dst_operand[0] == "imm":
        raise LirExecError(f"{_where(instr)}: needs a memory destination")
    srcs = [operand_array(instr, s, dram, sram) for s in instr.arg("srcs", ())]
    dst = operand_array(instr, dst_operand, dram, sram)
    return semantics, dst, srcs


def apply(semantics: Semantics, instr: Instr, dst: np.ndarray, srcs: list[np.ndarray]) -> None:
    """Run bound semantics; numpy's complaints become a LirExecError naming the instruction."""
    try:
        semantics(instr, dst, srcs)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise LirExecError(f"{_where(instr)}: {type(exc).__name__}: {exc}") from None


def execute(instr: Instr, dram: np.ndarray, sram: np.ndarray) -> None:
    """Run one instruction on the byte arrays ``dram`` and ``sram`` (uint8, modified in place)."""
    semantics, dst, srcs = bind_operands(instr, dram, sram)
    apply(semantics, instr, dst, srcs)


def load_inputs(program: Program, dram: np.ndarray, inputs: Sequence[np.ndarray]) -> None:
    """Copy the kernel's inputs into DRAM at their argument offsets (ValueError if they differ)."""
    slots = [a for a in program.args if a.role == "input"]
    if len(inputs) != len(slots):
        raise ValueError(f"{program.kernel}: expects {len(slots)} inputs, got {len(inputs)}")
    for slot, array in zip(slots, inputs, strict=True):
        # order="C", not ascontiguousarray: that one turns a 0-d scalar into shape (1,)
        data = np.asarray(array, dtype=NUMPY_DTYPES[slot.dtype], order="C")
        if data.shape != tuple(slot.shape):
            raise ValueError(
                f"{program.kernel}: input {slot.name} has shape {list(data.shape)}, "
                f"the binary expects {list(slot.shape)}"
            )
        dram[slot.dram_offset : slot.dram_offset + data.nbytes] = data.reshape(-1).view(np.uint8)


def read_outputs(program: Program, dram: np.ndarray) -> list[np.ndarray]:
    """The kernel's results, copied out of DRAM, in argument order."""
    outputs = []
    for slot in program.args:
        if slot.role == "output":
            dt = NUMPY_DTYPES[slot.dtype]
            raw = dram[slot.dram_offset : slot.dram_offset + math.prod(slot.shape) * dt.itemsize]
            outputs.append(raw.view(dt).reshape(slot.shape).copy())
    return outputs


def run_program(program: Program, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Execute ``program`` in instruction order; returns the outputs in ArgSlot order."""
    dram = np.zeros(program.dram_bytes, dtype=np.uint8)
    sram = np.zeros(program.sram_bytes, dtype=np.uint8)
    load_inputs(program, dram, inputs)
    for instr in program.instrs:
        execute(instr, dram, sram)
    return read_outputs(program, dram)
