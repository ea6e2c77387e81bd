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
from dataclasses import dataclass, field

import msgpack

from kiln.ir.lir_records import (  # noqa: F401  (re-exported: kiln.ir.lir is the public face)
    DEP_KINDS,
    SPACES,
    Access,
    ArgSlot,
    Dep,
    Instr,
    Slot,
    freeze,
    instr_from_obj,
    instr_to_obj,
    unit_kind,
)
from kiln.ir.lir_table import InstrTable, SlotTable, map_header, pack

LIR_FORMAT = "kiln.lir/1"


@dataclass(frozen=True, slots=True)
class Program:
    """A whole kernel in LIR.

    ``instrs`` is any sequence of ``Instr``: the lir stage hands an
    ``InstrTable`` (columns, packed once); a tuple built by hand works the
    same, and ``table`` makes it columnar on first use (cached).
    """

    kernel: str
    machine: str
    units: tuple[tuple[str, int], ...]  # (kind, count), sorted by kind
    args: tuple[ArgSlot, ...]
    instrs: tuple[Instr, ...] | InstrTable
    sram_bytes: int  # capacity of the machine's SRAM
    sram_peak: int  # highest byte the allocator used
    dram_bytes: int  # total DRAM footprint of args and results
    # caches, never compared or copied by dataclasses.replace (init=False)
    _table: InstrTable | None = field(default=None, init=False, repr=False, compare=False)
    _key: str | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def table(self) -> InstrTable:
        """The instructions as columns (what the stages walk)."""
        if isinstance(self.instrs, InstrTable):
            return self.instrs
        if self._table is None:
            object.__setattr__(self, "_table", InstrTable.from_instrs(self.instrs))
        return self._table

    def _head(self) -> dict:
        return {
            "format": LIR_FORMAT,
            "kernel": self.kernel,
            "machine": self.machine,
            "units": [list(u) for u in self.units],
            "args": [
                [a.name, a.role, list(a.shape), a.dtype, a.dram_offset, a.nbytes] for a in self.args
            ],
        }

    def _tail(self) -> dict:
        return {
            "sram_bytes": self.sram_bytes,
            "sram_peak": self.sram_peak,
            "dram_bytes": self.dram_bytes,
        }

    def to_obj(self) -> dict:
        return {
            **self._head(),
            "instrs": [instr_to_obj(i) for i in self.instrs],
            **self._tail(),
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
        """``packb(self.to_obj())``, byte for byte, from the table's packed instructions."""
        return _pack_map(self._head(), ("instrs", self.table.packed_array()), self._tail())

    @staticmethod
    def from_msgpack(raw: bytes) -> Program:
        return Program.from_obj(msgpack.unpackb(raw, raw=False, use_list=True))

    @property
    def key(self) -> str:
        """sha256 of ``to_msgpack()`` (computed once: the EDF stage asks twice)."""
        if self._key is None:
            object.__setattr__(self, "_key", hashlib.sha256(self.to_msgpack()).hexdigest())
        return self._key


def _pack_map(*parts: dict | tuple[str, bytes]) -> bytes:
    """A msgpack map from dicts (packed as they are) and (key, already packed value) pairs,
    in order: the bytes packb gives the merged dict, without re-packing the packed values."""
    out = []
    count = 0
    for part in parts:
        if isinstance(part, tuple):
            out += [pack(part[0]), part[1]]
            count += 1
        else:
            for k, v in part.items():
                out += [pack(k), pack(v)]
            count += len(part)
    return map_header(count) + b"".join(out)


@dataclass(frozen=True, slots=True)
class ScheduledProgram:
    """ResourceLIR: a program plus one slot per instruction (indexed by instruction id).

    ``slots`` is any sequence of ``Slot``: the schedule stage hands a
    ``SlotTable`` (columns); ``slot_table`` makes a tuple columnar on first use.
    """

    program: Program
    slots: tuple[Slot, ...] | SlotTable
    policy: str
    _slot_table: SlotTable | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def slot_table(self) -> SlotTable:
        if isinstance(self.slots, SlotTable):
            return self.slots
        if self._slot_table is None:
            object.__setattr__(self, "_slot_table", SlotTable.from_slots(self.slots))
        return self._slot_table

    @property
    def makespan(self) -> int:
        end = self.slot_table.end
        return int(end.max()) if len(end) else 0

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
        """``packb(self.to_obj())``, byte for byte, reusing the program's packed bytes."""
        return _pack_map(
            ("program", self.program.to_msgpack()),
            ("slots", pack(self.slot_table.rows())),
            {"policy": self.policy},
        )

    @staticmethod
    def from_msgpack(raw: bytes) -> ScheduledProgram:
        return ScheduledProgram.from_obj(msgpack.unpackb(raw, raw=False, use_list=True))
