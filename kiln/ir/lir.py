"""LIR: instructions bound to machine units, with SRAM addresses and dependencies.

Every instruction names the unit instance it runs on (``dma0``, ``tensor0``,
``vector1``...), the address ranges it reads and writes, its latency in
cycles, and the instructions it must wait for. What an opcode computes is
in ``args`` (opcode-specific, documented where the opcodes are lowered and
executed). The schedule and the EDF container treat instructions as opaque
records with these generic fields.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import msgpack

LIR_FORMAT = "kiln.lir/1"
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


@dataclass(frozen=True, slots=True)
class Program:
    """A whole kernel in LIR."""

    kernel: str
    machine: str
    units: tuple[tuple[str, int], ...]  # (kind, count), sorted by kind
    args: tuple[ArgSlot, ...]
    instrs: tuple[Instr, ...]
    sram_bytes: int  # capacity of the machine's SRAM
    sram_peak: int  # highest byte the allocator used
    dram_bytes: int  # total DRAM footprint of args and results

    def to_obj(self) -> dict:
        return {
            "format": LIR_FORMAT,
            "kernel": self.kernel,
            "machine": self.machine,
            "units": [list(u) for u in self.units],
            "args": [
                [a.name, a.role, list(a.shape), a.dtype, a.dram_offset, a.nbytes] for a in self.args
            ],
            "instrs": [instr_to_obj(i) for i in self.instrs],
            "sram_bytes": self.sram_bytes,
            "sram_peak": self.sram_peak,
            "dram_bytes": self.dram_bytes,
        }

    @staticmethod
    def from_obj(obj: dict) -> Program:
        if obj.get("format") != LIR_FORMAT:
            raise ValueError(f"not a Kiln LIR program (format {obj.get('format')!r})")
        return Program(
            kernel=obj["kernel"],
            machine=obj["machine"],
            units=tuple((str(k), int(n)) for k, n in obj["units"]),
            args=tuple(
                ArgSlot(n, r, tuple(s), d, int(o), int(b)) for n, r, s, d, o, b in obj["args"]
            ),
            instrs=tuple(instr_from_obj(i) for i in obj["instrs"]),
            sram_bytes=int(obj["sram_bytes"]),
            sram_peak=int(obj["sram_peak"]),
            dram_bytes=int(obj["dram_bytes"]),
        )

    def to_msgpack(self) -> bytes:
        return msgpack.packb(self.to_obj(), use_bin_type=True)

    @staticmethod
    def from_msgpack(raw: bytes) -> Program:
        return Program.from_obj(msgpack.unpackb(raw, raw=False, use_list=True))

    @property
    def key(self) -> str:
        return hashlib.sha256(self.to_msgpack()).hexdigest()


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


@dataclass(frozen=True, slots=True)
class ScheduledProgram:
    """ResourceLIR: a program plus one slot per instruction (indexed by instruction id)."""

    program: Program
    slots: tuple[Slot, ...]
    policy: str

    @property
    def makespan(self) -> int:
        return max((s.end for s in self.slots), default=0)

    def to_obj(self) -> dict:
        return {
            "program": self.program.to_obj(),
            "slots": [[s.instr, s.unit, s.start, s.end] for s in self.slots],
            "policy": self.policy,
        }

    @staticmethod
    def from_obj(obj: dict) -> ScheduledProgram:
        return ScheduledProgram(
            program=Program.from_obj(obj["program"]),
            slots=tuple(Slot(int(i), u, int(s), int(e)) for i, u, s, e in obj["slots"]),
            policy=obj["policy"],
        )

    def to_msgpack(self) -> bytes:
        return msgpack.packb(self.to_obj(), use_bin_type=True)

    @staticmethod
    def from_msgpack(raw: bytes) -> ScheduledProgram:
        return ScheduledProgram.from_obj(msgpack.unpackb(raw, raw=False, use_list=True))
