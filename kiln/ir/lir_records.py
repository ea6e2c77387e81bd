"""LIR records: one instruction, its accesses and dependencies, an argument, a slot.

Re-exported by kiln.ir.lir (the one public face); kept apart so that the
columnar tables (kiln.ir.lir_table) can build and decode them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEP_KINDS = ("raw", "war", "waw")
SPACES = ("sram", "dram")


@dataclass(frozen=True, slots=True)
class Access:
    """A byte range in one memory space."""

    space: str
    addr: int
    nbytes: int

    @property
    def end(self) -> int:
        return self.addr + self.nbytes

    def overlaps(self, other: Access) -> bool:
        return self.space == other.space and self.addr < other.end and other.addr < self.end


@dataclass(frozen=True, slots=True)
class Dep:
    src: int  # id of the instruction waited for
    kind: str  # raw | war | waw


@dataclass(frozen=True, slots=True)
class Instr:
    id: int
    unit: str
    opcode: str
    reads: tuple[Access, ...]
    writes: tuple[Access, ...]
    nbytes: int  # bytes moved (DMA) or touched (compute)
    latency: int  # cycles on its unit
    deps: tuple[Dep, ...]
    args: tuple[tuple[str, Any], ...] = ()  # sorted (key, value); values msgpack-able, tuples
    text: str = ""

    @property
    def unit_kind(self) -> str:
        return unit_kind(self.unit)

    def arg(self, name: str, default: Any = None) -> Any:
        for key, value in self.args:
            if key == name:
                return value
        return default


@dataclass(frozen=True, slots=True)
class ArgSlot:
    """A kernel argument or result in DRAM."""

    name: str
    role: str  # input | output
    shape: tuple[int, ...]
    dtype: str
    dram_offset: int
    nbytes: int


def unit_kind(unit: str) -> str:
    """``dma1`` -> ``dma``."""
    return unit.rstrip("0123456789")


def freeze(value: Any) -> Any:
    """Lists to tuples, recursively: decoded msgpack back to hashable IR values."""
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    return value


def instr_to_obj(i: Instr) -> list:
    return [
        i.id,
        i.unit,
        i.opcode,
        [[a.space, a.addr, a.nbytes] for a in i.reads],
        [[a.space, a.addr, a.nbytes] for a in i.writes],
        i.nbytes,
        i.latency,
        [[d.src, d.kind] for d in i.deps],
        [[k, v] for k, v in i.args],
        i.text,
    ]


def instr_from_obj(obj: list) -> Instr:
    ident, unit, opcode, reads, writes, nbytes, latency, deps, args, text = obj
    return Instr(
        id=int(ident),
        unit=unit,
        opcode=opcode,
        reads=tuple(Access(s, int(a), int(n)) for s, a, n in reads),
        writes=tuple(Access(s, int(a), int(n)) for s, a, n in writes),
        nbytes=int(nbytes),
        latency=int(latency),
        deps=tuple(Dep(int(s), k) for s, k in deps),
        args=tuple((k, freeze(v)) for k, v in args),
        text=text,
    )


@dataclass(frozen=True, slots=True)
class Slot:
    """Where and when one instruction runs in the schedule."""

    instr: int
    unit: str
    start: int  # cycle
    end: int  # cycle (exclusive): start + latency
