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

from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import itemgetter
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
    """Appends instructions one at a time (plain Python values) and makes an InstrTable.

    ``add`` packs the instruction at once and appends its fields to one list
    per column; ``finish`` turns the lists into arrays with map/chain (C loops:
    a Python loop per row over 100k rows cost more than the rest of finish).
    """

    def __init__(self) -> None:
        self.cols: tuple[list, ...] = tuple([] for _ in range(5))
        # reads, writes and deps flattened as they come (while hot in the cache), with counts
        self.flat: tuple[list, ...] = ([], [], [])
        self.counts: tuple[list, ...] = ([], [], [])
        self.parts: list[bytes] = []
        self.pack = msgpack.Packer(use_bin_type=True).pack

    def add(self, ident, unit, opcode, reads, writes, nbytes, latency, deps, args, text) -> None:
        """One instruction: ``reads``/``writes`` of (space, addr, nbytes), ``deps`` of
        (src, kind), ``args`` of (key, value), sorted by key. Tuples pack as the lists
        ``instr_to_obj`` makes, so these are the very bytes of the LIR format."""
        c, f, k = self.cols, self.flat, self.counts
        c[0].append(ident)
        c[1].append(unit)
        c[2].append(opcode)
        c[3].append(nbytes)
        c[4].append(latency)
        f[0].extend(reads)
        k[0].append(len(reads))
        f[1].extend(writes)
        k[1].append(len(writes))
        f[2].extend(deps)
        k[2].append(len(deps))
        self.parts.append(
            self.pack((ident, unit, opcode, reads, writes, nbytes, latency, deps, args, text))
        )

    def finish(self) -> InstrTable:
        ids, units, opcodes, nbytes, latency = self.cols
        (reads, writes, deps), (r_n, w_n, d_n) = self.flat, self.counts
        t = InstrTable()
        t.ids = _ints(ids)
        t.unit_names, t.unit = _encode(units)
        t.opcode_names, t.opcode = _encode(opcodes)
        t.nbytes = _ints(nbytes)
        t.latency = _ints(latency)
        t.space_names = SPACES
        for prefix, flat, counts in (("r", reads, r_n), ("w", writes, w_n)):
            t.space_names, codes = _encode(list(map(_FIRST, flat)), t.space_names)
            setattr(t, f"{prefix}_off", _offsets(counts))
            setattr(t, f"{prefix}_space", codes)
            setattr(t, f"{prefix}_addr", _ints(flat, _SECOND))
            setattr(t, f"{prefix}_nbytes", _ints(flat, _THIRD))
        t.d_off = _offsets(d_n)
        t.d_src = _ints(deps, _FIRST)
        t.kind_names, t.d_kind = _encode(list(map(_SECOND, deps)), DEP_KINDS)
        t.blob = b"".join(self.parts)
        t._objs = None
        return t


_FIRST, _SECOND, _THIRD = itemgetter(0), itemgetter(1), itemgetter(2)


def _ints(values: Sequence, field: Callable | None = None) -> np.ndarray:
    items = values if field is None else map(field, values)
    return np.fromiter(items, dtype=np.int64, count=len(values))


def _offsets(counts: Sequence[int]) -> np.ndarray:
    off = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(_ints(counts), out=off[1:])
    return off


def _encode(
    values: Sequence[str], first: tuple[str, ...] = ()
) -> tuple[tuple[str, ...], np.ndarray]:
    """(names, codes): ``first`` keeps its codes, other names follow in order of first use."""
    names = dict.fromkeys(first)
    names.update(dict.fromkeys(values))
    index = {name: n for n, name in enumerate(names)}
    codes = np.fromiter(map(index.__getitem__, values), dtype=np.int32, count=len(values))
    return tuple(names), codes


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
        slots = tuple(slots)
        names, unit = _encode([s.unit for s in slots])
        return SlotTable(
            [s.instr for s in slots],
            unit,
            [s.start for s in slots],
            [s.end for s in slots],
            names,
        )


def pack(obj: Any) -> bytes:
    """msgpack bytes of ``obj`` as packb would write them (use_bin_type=True)."""
    return _PACKER.pack(obj)
