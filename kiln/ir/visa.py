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

import hashlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

VISA_VERSION = 1
ROLES = ("input", "output", "scratch")
DTYPES = ("f32", "f16", "bf16", "i32", "bool")
FLOAT_DTYPES = ("f32", "f16", "bf16")
ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2, "i32": 4, "bool": 1}


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
for _name in ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu"):
    _op(_name, "unary", "vector", 1)
for _name in ("add", "sub", "mul", "div", "maximum", "minimum", "pow"):
    _op(_name, "binary", "vector", 2)
for _name in ("lt", "le", "gt", "ge", "eq", "ne"):
    _op(_name, "compare", "vector", 2)
_op("where", "select", "vector", 3)
_op("cast", "cast", "vector", 1)
for _name in ("sum", "max", "min"):
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

    def tensor_map(self) -> dict[str, DramTensor]:
        return {t.name: t for t in self.tensors}

    def buffer_map(self) -> dict[str, Buffer]:
        return {b.name: b for b in self.buffers}

    def to_text(self) -> str:
        return print_program(self)

    @property
    def key(self) -> str:
        return hashlib.sha256(self.to_text().encode()).hexdigest()


# -- printer -------------------------------------------------------------------


def _dims(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def format_imm(imm: Imm) -> str:
    if imm.dtype == "bool":
        text = "true" if imm.value else "false"
    elif imm.dtype in FLOAT_DTYPES:
        text = repr(float(imm.value))
    else:
        text = str(int(imm.value))
    return f"#{text}:{imm.dtype}"


def format_operand(operand: Operand) -> str:
    if isinstance(operand, Tile):
        return f"%{operand.buf}{_dims(operand.shape)}"
    if isinstance(operand, View):
        dims = ",".join(f"{d}:{s}" for d, s in zip(operand.shape, operand.strides, strict=False))
        return f"@{operand.tensor}+{operand.offset}[{dims}]"
    return format_imm(operand)


def _format_attr(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ",".join(str(v) for v in value) + ")"
    return str(value)


def format_instr(instr: Instr) -> str:
    """One instruction as its text line."""
    text = f"{instr.op} {format_operand(instr.dst)} <- " + ", ".join(
        format_operand(s) for s in instr.srcs
    )
    for key, value in instr.attrs:
        text += f" {key}={_format_attr(value)}"
    return text


def print_program(program: Program) -> str:
    """The canonical text form; ``parse(print_program(p)) == p``."""
    lines = [f"visa {VISA_VERSION}", f"kernel {program.kernel}"]
    if program.bindings:
        lines.append("bind " + " ".join(f"{k}={v}" for k, v in program.bindings))
    for t in program.tensors:
        lines.append(f"tensor {t.name} {t.role} {t.dtype}{_dims(t.shape)}")
    for b in program.buffers:
        lines.append(f"buffer %{b.name} {b.dtype}{_dims(b.shape)}")
    lines.extend(format_instr(i) for i in program.instrs)
    return "\n".join(lines) + "\n"


# -- parser --------------------------------------------------------------------


class VisaParseError(ValueError):
    """Malformed vISA text: says the line, what was expected and what was found."""

    def __init__(self, line: int, expected: str, found: str, source: str = ""):
        super().__init__(f"line {line}: expected {expected}, found {found!r}")
        self.line = line
        self.expected = expected
        self.found = found
        self.source = source


_NAME = r"[A-Za-z_][\w.\-]*"
_TOKEN = re.compile(
    r"\s*(?:"
    rf"(?P<tile>%(?P<tname>{_NAME})\[(?P<tdims>[\d,\s]*)\])"
    rf"|(?P<view>@(?P<vname>{_NAME})\+(?P<voff>\d+)\[(?P<vdims>[\d:,\s]*)\])"
    r"|(?P<imm>#(?P<ival>[^\s,:]+):(?P<idtype>\w+))"
    r"|(?P<attr>(?P<akey>[A-Za-z_]\w*)=(?P<aval>\([-\d,\s]*\)|-?\d+))"
    r")\s*,?"
)
_SHAPED = re.compile(r"^(\w+)\[([\d,\s]*)\]$")
_OPERAND_FORMS = "an operand (%buf[dims], @tensor+offset[dim:stride,...] or #value:dtype)"


class _Line:
    """One source line being parsed, for error messages."""

    def __init__(self, number: int, text: str):
        self.number = number
        self.text = text

    def fail(self, expected: str, found: str) -> VisaParseError:
        return VisaParseError(self.number, expected, found, self.text)


def _ints(text: str, line: _Line, what: str) -> tuple[int, ...]:
    text = text.strip()
    if not text:
        return ()
    try:
        return tuple(int(p) for p in text.split(","))
    except ValueError:
        raise line.fail(what, text) from None


def _imm(value: str, dtype: str, line: _Line) -> Imm:
    if dtype not in DTYPES:
        raise line.fail("an immediate dtype (" + ", ".join(DTYPES) + ")", dtype)
    try:
        if dtype == "bool":
            if value not in ("true", "false"):
                raise ValueError
            return Imm(value == "true", dtype)
        if dtype == "i32":
            return Imm(int(value), dtype)
        return Imm(float(value), dtype)
    except ValueError:
        raise line.fail(f"a {dtype} immediate value", value) from None


def _operand(m: re.Match, line: _Line) -> Operand:
    if m["tile"]:
        return Tile(m["tname"], _ints(m["tdims"], line, "tile dims"))
    if m["view"]:
        shape, strides = [], []
        for part in filter(None, (p.strip() for p in m["vdims"].split(","))):
            size, sep, stride = part.partition(":")
            if not sep or not size.isdigit() or not stride.isdigit():
                raise line.fail("a view dim as size:stride", part)
            shape.append(int(size))
            strides.append(int(stride))
        return View(m["vname"], int(m["voff"]), tuple(shape), tuple(strides))
    return _imm(m["ival"], m["idtype"], line)


def _parse_instr(line: _Line, text: str) -> Instr:
    op, _, rest = text.partition(" ")
    if op not in OPS:
        raise line.fail("an opcode (" + ", ".join(sorted(OPS)) + ") or a declaration", op)
    operands: list[Operand] = []
    attrs: dict[str, Any] = {}
    arrow = rest.find("<-")
    if arrow < 0:
        raise line.fail("'<-' between destination and sources", rest)
    for part, is_dst in ((rest[:arrow], True), (rest[arrow + 2 :], False)):
        pos = 0
        while pos < len(part.rstrip()):
            m = _TOKEN.match(part, pos)
            if m is None or m.end() == pos:
                raise line.fail(_OPERAND_FORMS, part[pos:].split()[0])
            pos = m.end()
            if m["attr"]:
                if is_dst:
                    raise line.fail("a destination operand", m["attr"])
                raw = m["aval"]
                attrs[m["akey"]] = (
                    _ints(raw[1:-1], line, "attribute ints") if raw.startswith("(") else int(raw)
                )
            elif attrs:
                raise line.fail("attributes after all operands", m.group(0).strip())
            else:
                operands.append(_operand(m, line))
    if not operands or isinstance(operands[0], Imm):
        raise line.fail("a destination tile or view before '<-'", rest[:arrow].strip())
    spec = OPS[op]
    if len(operands) - 1 != spec.arity:
        raise line.fail(f"{spec.arity} source operand(s) for {op}", str(len(operands) - 1))
    unknown = sorted(set(attrs) - set(spec.attrs))
    if unknown:
        raise line.fail(f"attributes of {op}: " + (", ".join(spec.attrs) or "none"), unknown[0])
    return Instr(op, operands[0], tuple(operands[1:]), tuple(sorted(attrs.items())))


def _shaped(line: _Line, text: str, what: str) -> tuple[str, tuple[int, ...]]:
    m = _SHAPED.match(text.strip())
    if m is None or m[1] not in DTYPES:
        raise line.fail(what, text.strip())
    return m[1], _ints(m[2], line, "dims")


def parse(text: str) -> Program:
    """Parse the text form; raises VisaParseError naming the line and what was expected."""
    kernel = None
    bindings: tuple[tuple[str, int], ...] = ()
    tensors: list[DramTensor] = []
    buffers: list[Buffer] = []
    instrs: list[Instr] = []
    seen_version = False
    for number, raw in enumerate(text.splitlines(), start=1):
        body = raw.split(";", 1)[0].strip()
        if not body:
            continue
        line = _Line(number, raw)
        word, _, rest = body.partition(" ")
        rest = rest.strip()
        if not seen_version:
            if word != "visa" or rest != str(VISA_VERSION):
                raise line.fail(f"the header 'visa {VISA_VERSION}'", body)
            seen_version = True
        elif kernel is None:
            if word != "kernel" or not re.fullmatch(_NAME, rest):
                raise line.fail("'kernel <name>'", body)
            kernel = rest
        elif word == "bind":
            pairs = []
            for part in rest.split():
                key, sep, value = part.partition("=")
                if not sep or not value.isdigit():
                    raise line.fail("a binding NAME=INT", part)
                pairs.append((key, int(value)))
            bindings = tuple(pairs)
        elif word == "tensor":
            name, _, after = rest.partition(" ")
            role, _, typ = after.strip().partition(" ")
            if not re.fullmatch(_NAME, name):
                raise line.fail("a tensor name", name)
            if role not in ROLES:
                raise line.fail("a tensor role (" + ", ".join(ROLES) + ")", role)
            dtype, shape = _shaped(line, typ, "a tensor type like f32[64,64]")
            tensors.append(DramTensor(name, role, shape, dtype))
        elif word == "buffer":
            if not rest.startswith("%"):
                raise line.fail("a buffer name starting with %", rest)
            name, _, typ = rest[1:].partition(" ")
            if not re.fullmatch(_NAME, name):
                raise line.fail("a buffer name", name)
            dtype, shape = _shaped(line, typ, "a buffer type like f32[64,64]")
            buffers.append(Buffer(name, dtype, shape))
        else:
            instrs.append(_parse_instr(line, body))
    if kernel is None:
        raise VisaParseError(len(text.splitlines()) + 1, "'visa 1' and 'kernel <name>'", "end")
    return Program(kernel, bindings, tuple(tensors), tuple(buffers), tuple(instrs))


# -- verifier ------------------------------------------------------------------


class VisaError(ValueError):
    """A broken vISA invariant: ``index`` is the instruction (None: a declaration)."""

    def __init__(self, index: int | None, rule: str, instr: Instr | None = None):
        where = f"instruction {index} ({format_instr(instr)})" if instr else "declarations"
        super().__init__(f"{where}: {rule}")
        self.index = index
        self.rule = rule


class _Ctx:
    """What the per-kind checks need: declarations and the dtype of each operand."""

    def __init__(self, program: Program):
        self.tensors = program.tensor_map()
        self.buffers = program.buffer_map()

    def dtype(self, operand: Operand) -> str:
        if isinstance(operand, Tile):
            return self.buffers[operand.buf].dtype
        if isinstance(operand, View):
            return self.tensors[operand.tensor].dtype
        return operand.dtype


def _need(cond: bool, rule: str) -> None:
    if not cond:
        raise ValueError(rule)


def _kinds(instr: Instr, dst: type, *srcs: tuple[type, ...] | type) -> None:
    _need(isinstance(instr.dst, dst), f"destination must be a {dst.__name__.lower()}")
    for i, (src, allowed) in enumerate(zip(instr.srcs, srcs, strict=True)):
        names = " or ".join(
            t.__name__.lower() for t in (allowed if isinstance(allowed, tuple) else (allowed,))
        )
        _need(isinstance(src, allowed), f"source {i} must be a {names}")


def _same_shape(instr: Instr) -> None:
    """Tile operands match the result, or repeat along its dims where they have size 1."""
    out = instr.dst.shape
    for src in instr.srcs:
        if not isinstance(src, Imm):
            _need(
                len(src.shape) == len(out)
                and all(s in (d, 1) for s, d in zip(src.shape, out, strict=True)),
                f"operand shape {src.shape} does not broadcast to {out}",
            )


def _check_load(c: _Ctx, instr: Instr) -> None:
    _kinds(instr, Tile, View)
    (src,) = instr.srcs
    _need(src.size == instr.dst.size, f"tile has {instr.dst.size} elements, view {src.size}")
    _need(c.dtype(src) == c.dtype(instr.dst), "tile and tensor dtypes differ")


def _check_store(c: _Ctx, instr: Instr) -> None:
    _kinds(instr, View, Tile)
    (src,) = instr.srcs
    dst = instr.dst
    _need(src.size == dst.size, f"tile has {src.size} elements, view {dst.size}")
    _need(c.dtype(src) == c.dtype(dst), "tile and tensor dtypes differ")
    _need(c.tensors[dst.tensor].role != "input", "stores must not write an input tensor")
    _need(
        all(s > 0 or d == 1 for d, s in zip(dst.shape, dst.strides, strict=True)),
        "a store view must not repeat elements (stride 0 on a dim > 1)",
    )


def _check_mma(c: _Ctx, instr: Instr) -> None:
    _kinds(instr, Tile, Tile, Tile)
    a, b = instr.srcs
    d = instr.dst
    _need(len(a.shape) == len(b.shape) == len(d.shape) == 2, "mma operands must be 2-D")
    _need(a.shape[1] == b.shape[0], f"contraction dims differ: {a.shape} @ {b.shape}")
    _need(d.shape == (a.shape[0], b.shape[1]), f"result {d.shape} != {a.shape} @ {b.shape}")
    _need(c.dtype(a) == c.dtype(b), "mma operand dtypes differ")
    _need(c.dtype(d) == acc_dtype(c.dtype(a)), f"mma accumulates in {acc_dtype(c.dtype(a))}")


def _check_unary(c: _Ctx, instr: Instr) -> None:
    _kinds(instr, Tile, (Tile, Imm))
    _same_shape(instr)
    _need(c.dtype(instr.srcs[0]) == c.dtype(instr.dst), "operand and result dtypes differ")


def _check_binary(c: _Ctx, instr: Instr, result: str | None = None) -> None:
    _kinds(instr, Tile, (Tile, Imm), (Tile, Imm))
    _same_shape(instr)
    a, b = (c.dtype(s) for s in instr.srcs)
    _need(a == b, f"operand dtypes differ ({a} vs {b})")
    _need(c.dtype(instr.dst) == (result or a), "result dtype is wrong")


def _check_select(c: _Ctx, instr: Instr) -> None:
    _kinds(instr, Tile, (Tile, Imm), (Tile, Imm), (Tile, Imm))
    _same_shape(instr)
    cond, a, b = (c.dtype(s) for s in instr.srcs)
    _need(cond == "bool", "the condition must be bool")
    _need(a == b == c.dtype(instr.dst), "the selected values and the result must share a dtype")


def _check_cast(c: _Ctx, instr: Instr) -> None:
    _kinds(instr, Tile, (Tile, Imm))
    _same_shape(instr)


def _check_reduce(c: _Ctx, instr: Instr) -> None:
    _kinds(instr, Tile, Tile)
    (src,) = instr.srcs
    axes = instr.attr("axes", ())
    _need(isinstance(axes, tuple) and list(axes) == sorted(set(axes)), "axes must be sorted")
    _need(all(0 <= a < len(src.shape) for a in axes), f"axes {axes} out of range")
    kept = tuple(1 if i in axes else d for i, d in enumerate(src.shape))
    _need(instr.dst.shape == kept, f"result shape {instr.dst.shape} != {kept}")
    s, d = c.dtype(src), c.dtype(instr.dst)
    _need(d == s or (instr.op == "sum" and d == acc_dtype(s)), f"cannot reduce {s} into {d}")


def _check_transpose(c: _Ctx, instr: Instr) -> None:
    _kinds(instr, Tile, Tile)
    (src,) = instr.srcs
    perm = instr.attr("perm", ())
    _need(sorted(perm) == list(range(len(src.shape))), f"perm {perm} is not a permutation")
    _need(instr.dst.shape == tuple(src.shape[p] for p in perm), "result shape is not permuted")
    _need(c.dtype(src) == c.dtype(instr.dst), "operand and result dtypes differ")


def _check_fill(c: _Ctx, instr: Instr) -> None:
    _kinds(instr, Tile, Imm)
    _need(c.dtype(instr.srcs[0]) == c.dtype(instr.dst), "immediate and tile dtypes differ")


_CHECKS: dict[str, Callable[[_Ctx, Instr], None]] = {
    "load": _check_load,
    "store": _check_store,
    "mma": _check_mma,
    "unary": _check_unary,
    "binary": _check_binary,
    "compare": lambda c, i: _check_binary(c, i, "bool"),
    "select": _check_select,
    "cast": _check_cast,
    "reduce": _check_reduce,
    "transpose": _check_transpose,
    "fill": _check_fill,
}


def _check_declarations(program: Program) -> None:
    for kind, items in (("tensor", program.tensors), ("buffer", program.buffers)):
        names = [x.name for x in items]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise VisaError(None, f"{kind} {dup[0]!r} is declared twice")
        for x in items:
            if x.dtype not in DTYPES or any(d < 0 for d in x.shape):
                raise VisaError(None, f"{kind} {x.name!r} has a bad type {x.dtype}{x.shape}")
    for t in program.tensors:
        if t.role not in ROLES:
            raise VisaError(None, f"tensor {t.name!r} has unknown role {t.role!r}")


def _check_operands(c: _Ctx, instr: Instr, written: set[str]) -> None:
    read = list(instr.srcs) + ([instr.dst] if instr.accumulates else [])
    for operand in (instr.dst, *instr.srcs):
        if isinstance(operand, Tile):
            buf = c.buffers.get(operand.buf)
            _need(buf is not None, f"buffer %{operand.buf} is not declared")
            _need(
                operand.size <= buf.size,
                f"tile %{operand.buf}{list(operand.shape)} exceeds the buffer's "
                f"{buf.size} elements",
            )
        elif isinstance(operand, View):
            t = c.tensors.get(operand.tensor)
            _need(t is not None, f"tensor {operand.tensor} is not declared")
            _need(len(operand.shape) == len(operand.strides), "view shape and strides differ")
            _need(all(s >= 0 for s in operand.strides), "view strides must be >= 0")
            lo, hi = operand.span()
            _need(hi <= t.size, f"view reaches element {hi - 1} of {operand.tensor} ({t.size})")
        elif operand.dtype not in DTYPES:
            raise ValueError(f"immediate has unknown dtype {operand.dtype}")
    for operand in read:
        if isinstance(operand, Tile):
            _need(operand.buf in written, f"buffer %{operand.buf} is read before it is written")


def verify(program: Program) -> None:
    """Check declarations and every instruction; raise VisaError naming it and the rule."""
    _check_declarations(program)
    ctx = _Ctx(program)
    written: set[str] = set()
    for index, instr in enumerate(program.instrs):
        spec = OPS.get(instr.op)
        try:
            _need(spec is not None, f"unknown opcode {instr.op!r}")
            _need(len(instr.srcs) == spec.arity, f"{instr.op} takes {spec.arity} sources")
            _need(
                set(k for k, _ in instr.attrs) <= set(spec.attrs),
                f"{instr.op} takes attributes {spec.attrs}",
            )
            _check_operands(ctx, instr, written)
            _CHECKS[spec.kind](ctx, instr)
        except VisaError:
            raise
        except ValueError as exc:
            raise VisaError(index, str(exc), instr) from None
        if isinstance(instr.dst, Tile):
            written.add(instr.dst.buf)
