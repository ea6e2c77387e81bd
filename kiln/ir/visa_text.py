"""The vISA text form: printer and parser (``parse(print_program(p)) == p``).

Re-exported by kiln.ir.visa; a hand-edited dump parses back, and a parse
error names the line, what was expected and what was found.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from kiln.ir.visa_records import (
    DTYPES,
    OPS,
    ROLES,
    VISA_VERSION,
    Buffer,
    DramTensor,
    Imm,
    Instr,
    Operand,
    Program,
    Tile,
    View,
    format_imm,
)

# -- printer -------------------------------------------------------------------


def _dims(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def format_operand(operand: Operand) -> str:
    if isinstance(operand, Tile):
        return _tile_text(operand.buf, operand.shape)
    if isinstance(operand, View):
        return f"@{operand.tensor}+{operand.offset}{_view_dims(operand.shape, operand.strides)}"
    return format_imm(operand)


# memoized: a large program repeats a few tiles, and a few view shapes at many offsets
@functools.lru_cache(maxsize=4096)
def _tile_text(buf: str, shape: tuple[int, ...]) -> str:
    return f"%{buf}{_dims(shape)}"


@functools.lru_cache(maxsize=4096)
def _view_dims(shape: tuple[int, ...], strides: tuple[int, ...]) -> str:
    return "[" + ",".join(f"{d}:{s}" for d, s in zip(shape, strides, strict=False)) + "]"


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


def instr_lines(program: Program) -> tuple[str, ...]:
    """``format_instr`` of every instruction, computed once per program."""
    lines = program._lines
    if lines is None:
        lines = tuple(map(format_instr, program.instrs))
        object.__setattr__(program, "_lines", lines)
    return lines


def print_program(program: Program) -> str:
    """The canonical text form; ``parse(print_program(p)) == p``."""
    lines = [f"visa {VISA_VERSION}", f"kernel {program.kernel}"]
    if program.bindings:
        lines.append("bind " + " ".join(f"{k}={v}" for k, v in program.bindings))
    for t in program.tensors:
        lines.append(f"tensor {t.name} {t.role} {t.dtype}{_dims(t.shape)}")
    for b in program.buffers:
        lines.append(f"buffer %{b.name} {b.dtype}{_dims(b.shape)}")
    lines.extend(instr_lines(program))
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
