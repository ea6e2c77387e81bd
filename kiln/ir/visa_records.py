"""vISA: a tiled program over virtual tile buffers (the visa stage's IR).

A program names the kernel's DRAM tensors (arguments, results, scratch
intermediates), declares tile buffers (virtual SRAM regions with a dtype and
a capacity shape) and lists instructions in execution order, loops unrolled.
Operands: a tile (a buffer seen with a shape: a row-major prefix of the
buffer), a view (a strided window of a DRAM tensor, in elements) or an
immediate scalar. The text form (``print_program``/``parse``) round-trips
exactly and is meant to be read and hand-edited.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kiln.ir.graph import ITEMSIZE
from kiln.ir.ops import UNARY_OPS

VISA_VERSION = 1
ROLES = ("input", "output", "scratch")
DTYPES = ("f32", "f16", "bf16", "i32", "bool")
FLOAT_DTYPES = ("f32", "f16", "bf16")


def acc_dtype(dtype: str) -> str:
    """Accumulator dtype of matmuls and sums: half floats accumulate in f32."""
    return "f32" if dtype in FLOAT_DTYPES else dtype


@dataclass(frozen=True, slots=True)
class DramTensor:
    """A kernel argument, result or scratch intermediate: contiguous in DRAM."""

    name: str
    role: str  # input | output | scratch
    shape: tuple[int, ...]
    dtype: str

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True, slots=True)
class Buffer:
    """A virtual tile buffer; ``shape`` fixes its capacity (the LIR allocates it)."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * ITEMSIZE[self.dtype]


@dataclass(frozen=True, slots=True)
class Tile:
    """Buffer ``buf`` seen as a row-major array of ``shape`` from its start."""

    buf: str
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True, slots=True)
class View:
    """Elements ``offset + sum(i_d * strides[d])`` of DRAM tensor ``tensor``."""

    tensor: str
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def span(self) -> tuple[int, int]:
        """First and one-past-last element index touched (empty views: offset, offset)."""
        if self.size == 0:
            return self.offset, self.offset
        last = self.offset + sum((d - 1) * s for d, s in zip(self.shape, self.strides, strict=True))
        return self.offset, last + 1


@dataclass(frozen=True, slots=True, eq=False)
class Imm:
    """A scalar immediate, already rounded to ``dtype``; equal by its text (so NaN == NaN)."""

    value: Any  # float for float dtypes, int for i32, bool for bool
    dtype: str

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Imm) and format_imm(self) == format_imm(other)

    def __hash__(self) -> int:
        return hash(format_imm(self))


def format_imm(imm: Imm) -> str:
    """An immediate as the text form writes it (``#1.5:f32``): also what makes two equal."""
    if imm.dtype == "bool":
        text = "true" if imm.value else "false"
    elif imm.dtype in FLOAT_DTYPES:
        text = repr(float(imm.value))
    else:
        text = str(int(imm.value))
    return f"#{text}:{imm.dtype}"


Operand = Tile | View | Imm


@dataclass(frozen=True, slots=True)
class Instr:
    op: str
    dst: Tile | View
    srcs: tuple[Operand, ...]
    attrs: tuple[tuple[str, Any], ...] = ()  # sorted by key; ints and tuples of ints

    def attr(self, name: str, default: Any = None) -> Any:
        for key, value in self.attrs:
            if key == name:
                return value
        return default

    @property
    def accumulates(self) -> bool:
        """True when the instruction reads its destination (mma/reduce with acc=1)."""
        return bool(self.attr("acc", 0))


@dataclass(frozen=True, slots=True)
class OpSpec:
    name: str
    kind: str  # load store mma unary binary compare select cast reduce transpose fill
    unit: str  # dma | tensor | vector
    arity: int
    attrs: tuple[str, ...] = ()


OPS: dict[str, OpSpec] = {}


def _op(name: str, kind: str, unit: str, arity: int, attrs: tuple[str, ...] = ()) -> None:
    OPS[name] = OpSpec(name, kind, unit, arity, attrs)


_op("load", "load", "dma", 1)
_op("store", "store", "dma", 1)
_op("mma", "mma", "tensor", 2, ("acc",))
for _name in UNARY_OPS:
    _op(_name, "unary", "vector", 1)
for _name in ("add", "sub", "mul", "div", "maximum", "minimum", "pow"):
    _op(_name, "binary", "vector", 2)
for _name in ("lt", "le", "gt", "ge", "eq", "ne"):
    _op(_name, "compare", "vector", 2)
_op("where", "select", "vector", 3)
_op("cast", "cast", "vector", 1)
for _name in ("sum", "max", "min", "prod"):
    _op(_name, "reduce", "vector", 1, ("acc", "axes"))
_op("transpose", "transpose", "vector", 1, ("perm",))
_op("fill", "fill", "vector", 1)


@dataclass(frozen=True, slots=True)
class Program:
    kernel: str
    bindings: tuple[tuple[str, int], ...]
    tensors: tuple[DramTensor, ...]
    buffers: tuple[Buffer, ...]
    instrs: tuple[Instr, ...]
    # each instruction's text line, made once (visa_text.instr_lines): the printer and the
    # lir stage's instruction texts both need them; never compared, not copied by replace
    _lines: tuple[str, ...] | None = field(default=None, init=False, repr=False, compare=False)

    def tensor_map(self) -> dict[str, DramTensor]:
        return {t.name: t for t in self.tensors}

    def buffer_map(self) -> dict[str, Buffer]:
        return {b.name: b for b in self.buffers}
