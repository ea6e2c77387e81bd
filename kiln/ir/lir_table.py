"""Columnar LIR instructions and schedule slots: numpy arrays per field, packed once.

A large kernel has ~100k LIR instructions. Held as ``Instr`` objects (each
with tuples of ``Access`` and ``Dep`` objects) they took ~2.5 KB apiece and
every stage walked them in Python, and the program was re-serialised by
every later stage. An ``InstrTable`` keeps the fields a stage walks as
arrays (unit, opcode, latency, bytes; reads, writes and deps in CSR form)
plus each instruction's msgpack bytes, packed once when it is built, so the
LIR, schedule and EDF encoders only concatenate. It is still a
``Sequence[Instr]``: indexing or iterating builds the ``Instr`` objects
once, on first use, for callers that want them (simulator, reports).
``SlotTable`` does the same for the schedule's slots.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import msgpack
import numpy as np

from kiln.ir.lir_records import DEP_KINDS, SPACES, Slot, instr_from_obj

# msgpack's array header for n items (what packb writes before a list's items)
_PACKER = msgpack.Packer(use_bin_type=True)


def array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def map_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x80 | n,))
    if n < 1 << 16:
        return b"\xde" + n.to_bytes(2, "big")
    return b"\xdf" + n.to_bytes(4, "big")


class _Codes:
    """Strings -> small ints, in first-seen order (unit names, opcodes, spaces, dep kinds)."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self.index: dict[str, int] = {}
        for name in names:
            self.code(name)

    def code(self, name: str) -> int:
        c = self.index.get(name)
        if c is None:
            c = self.index[name] = len(self.index)
        return c

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.index)


class InstrTable(Sequence):
    """LIR instructions as columns plus their packed msgpack bytes (see the module doc).

    Columns (numpy, one row per instruction unless said): ``ids``, ``unit``
    and ``opcode`` (codes into ``unit_names``/``opcode_names``), ``nbytes``,
    ``latency``; ``r_off``/``w_off``/``d_off`` (n + 1 offsets) into the
    access arrays ``r_space``/``r_addr``/``r_nbytes`` (writes: ``w_*``) and
    the dependency arrays ``d_src``/``d_kind`` (codes into ``space_names``
    and ``kind_names``). ``blob`` is the instructions' msgpack bytes back to
    back: ``array_header(n) + blob`` is exactly ``packb([instr_to_obj(i) ...])``.
    """

    __slots__ = (
        "ids",
        "unit",
        "opcode",
        "nbytes",
        "latency",
        "r_off",
        "r_space",
        "r_addr",
        "r_nbytes",
        "w_off",
        "w_space",
        "w_addr",
        "w_nbytes",
        "d_off",
        "d_src",
        "d_kind",
        "unit_names",
        "opcode_names",
        "space_names",
        "kind_names",
        "blob",
        "_objs",
    )

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def dense(self) -> bool:
        """True when every instruction's id is its position (what the stages produce)."""
        return bool(np.array_equal(self.ids, np.arange(len(self.ids))))

    def packed_array(self) -> bytes:
        """``msgpack.packb([instr_to_obj(i) for i in self])``, without re-packing anything."""
        return array_header(len(self.ids)) + self.blob

    def objects(self) -> tuple:
        """The instructions as ``Instr`` objects, decoded once from the packed bytes."""
        if self._objs is None:
            unpacker = msgpack.Unpacker(raw=False, use_list=False, max_buffer_size=0)
            unpacker.feed(self.blob)
            self._objs = tuple(instr_from_obj(obj) for obj in unpacker)
        return self._objs

    def __getitem__(self, k: Any) -> Any:
        return self.objects()[k]

    def __iter__(self) -> Iterator:
        return iter(self.objects())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, InstrTable):
            return self.blob == other.blob
        if isinstance(other, tuple | list):
            return self.objects() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.objects())

    def __repr__(self) -> str:
        return f"InstrTable({len(self)} instructions)"

    def __getstate__(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__ if k != "_objs"}

    def __setstate__(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)
        self._objs = None

    @staticmethod
    def from_instrs(instrs: Iterable) -> InstrTable:
        """A table of ``Instr`` objects (programs built by hand, decoded, or edited)."""
        b = TableBuilder()
        for i in instrs:
            b.add(
                i.id,
                i.unit,
                i.opcode,
                [(a.space, a.addr, a.nbytes) for a in i.reads],
                [(a.space, a.addr, a.nbytes) for a in i.writes],
                i.nbytes,
                i.latency,
                [(d.src, d.kind) for d in i.deps],
                i.args,
                i.text,
            )
        return b.finish()


class TableBuilder:
    """Appends instructions one at a time (plain Python values) and makes an InstrTable."""

    def __init__(self) -> None:
        self.units, self.opcodes = _Codes(), _Codes()
        self.spaces, self.kinds = _Codes(SPACES), _Codes(DEP_KINDS)
        self.ids: list[int] = []
        self.unit: list[int] = []
        self.opcode: list[int] = []
        self.nbytes: list[int] = []
        self.latency: list[int] = []
        self.reads: list[list[int]] = [[0], [], [], []]  # offsets, space, addr, nbytes
        self.writes: list[list[int]] = [[0], [], [], []]
        self.d_off, self.d_src, self.d_kind = [0], [], []
        self.parts: list[bytes] = []
        self.pack = msgpack.Packer(use_bin_type=True).pack

    def _accesses(self, into: list[list[int]], accesses) -> list[list]:
        off, space, addr, nbytes = into
        code = self.spaces.code
        out = []
        for s, a, n in accesses:
            space.append(code(s))
            addr.append(a)
            nbytes.append(n)
            out.append([s, a, n])
        off.append(len(addr))
        return out

    def add(self, ident, unit, opcode, reads, writes, nbytes, latency, deps, args, text) -> None:
        """One instruction; ``reads``/``writes``: (space, addr, nbytes); ``deps``: (src, kind)."""
        self.ids.append(ident)
        self.unit.append(self.units.code(unit))
        self.opcode.append(self.opcodes.code(opcode))
        self.nbytes.append(nbytes)
        self.latency.append(latency)
        r = self._accesses(self.reads, reads)
        w = self._accesses(self.writes, writes)
        kind = self.kinds.code
        for src, k in deps:
            self.d_src.append(src)
            self.d_kind.append(kind(k))
        self.d_off.append(len(self.d_src))
        # the same list instr_to_obj makes, packed now and never again
        self.parts.append(
            self.pack(
                [
                    ident,
                    unit,
                    opcode,
                    r,
                    w,
                    nbytes,
                    latency,
                    [[s, k] for s, k in deps],
                    [[k, v] for k, v in args],
                    text,
                ]
            )
        )

    def finish(self) -> InstrTable:
        t = InstrTable()
        i64 = np.int64
        t.ids = np.array(self.ids, dtype=i64)
        t.unit = np.array(self.unit, dtype=np.int32)
        t.opcode = np.array(self.opcode, dtype=np.int32)
        t.nbytes = np.array(self.nbytes, dtype=i64)
        t.latency = np.array(self.latency, dtype=i64)
        for prefix, (off, space, addr, nb) in (("r", self.reads), ("w", self.writes)):
            setattr(t, f"{prefix}_off", np.array(off, dtype=i64))
            setattr(t, f"{prefix}_space", np.array(space, dtype=np.int32))
            setattr(t, f"{prefix}_addr", np.array(addr, dtype=i64))
            setattr(t, f"{prefix}_nbytes", np.array(nb, dtype=i64))
        t.d_off = np.array(self.d_off, dtype=i64)
        t.d_src = np.array(self.d_src, dtype=i64)
        t.d_kind = np.array(self.d_kind, dtype=np.int32)
        t.unit_names = self.units.names
        t.opcode_names = self.opcodes.names
        t.space_names = self.spaces.names
        t.kind_names = self.kinds.names
        t.blob = b"".join(self.parts)
        t._objs = None
        return t


class SlotTable(Sequence):
    """Schedule slots as columns: ``instr``, ``unit`` (codes into ``unit_names``), ``start``,
    ``end``; a ``Sequence[Slot]`` whose ``Slot`` objects are built once, on first use."""

    __slots__ = ("instr", "unit", "start", "end", "unit_names", "_objs")

    def __init__(self, instr, unit, start, end, unit_names: Sequence[str]) -> None:
        self.instr = np.asarray(instr, dtype=np.int64)
        self.unit = np.asarray(unit, dtype=np.int32)
        self.start = np.asarray(start, dtype=np.int64)
        self.end = np.asarray(end, dtype=np.int64)
        self.unit_names = tuple(unit_names)
        self._objs: tuple | None = None

    def __len__(self) -> int:
        return len(self.instr)

    def objects(self) -> tuple:
        if self._objs is None:
            names = self.unit_names
            self._objs = tuple(
                map(
                    Slot,
                    self.instr.tolist(),
                    [names[u] for u in self.unit.tolist()],
                    self.start.tolist(),
                    self.end.tolist(),
                )
            )
        return self._objs

    def rows(self) -> list[list]:
        """``[instr, unit, start, end]`` per slot: the msgpack form of the slot list."""
        names = self.unit_names
        return [
            [i, names[u], s, e]
            for i, u, s, e in zip(
                self.instr.tolist(),
                self.unit.tolist(),
                self.start.tolist(),
                self.end.tolist(),
                strict=True,
            )
        ]

    def __getitem__(self, k: Any) -> Any:
        return self.objects()[k]

    def __iter__(self) -> Iterator:
        return iter(self.objects())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SlotTable | tuple | list):
            return self.objects() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.objects())

    def __repr__(self) -> str:
        return f"SlotTable({len(self)} slots)"

    def __getstate__(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__ if k != "_objs"}

    def __setstate__(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)
        self._objs = None

    @staticmethod
    def from_slots(slots: Iterable) -> SlotTable:
        codes = _Codes()
        instr, unit, start, end = [], [], [], []
        for s in slots:
            instr.append(s.instr)
            unit.append(codes.code(s.unit))
            start.append(s.start)
            end.append(s.end)
        return SlotTable(instr, unit, start, end, codes.names)


def pack(obj: Any) -> bytes:
    """msgpack bytes of ``obj`` as packb would write them (use_bin_type=True)."""
    return _PACKER.pack(obj)
