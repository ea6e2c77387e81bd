"""An EDF's sections as columns (numpy arrays per field), for the simulator.

``kiln.ir.edf.decode`` builds about ten Python objects per instruction
(``Instr``, ``Access``, ``Dep``, ``Slot``...); at 16k instructions that was
most of the simulator's start-up. Here the schedule section is read with one
``np.frombuffer`` over its fixed-width slot table, and the instruction
section with one msgpack call whose rows are transposed (``zip``) into
columns: ids, latencies, the accesses and dependencies as flat arrays with
per-instruction offsets (CSR), and the operands grouped into *templates*,
the instructions that differ only in their addresses (what
``kiln.runners.sim_exec`` binds in bulk).

Only the form ``kiln.ir.edf.encode`` writes is accepted: exact types, dense
ids, known spaces. Anything else raises ``NotColumnar`` and the simulator
takes its object path (``decode`` and the checks on ``Instr`` objects), so
an unusual or damaged binary gets exactly the messages it got before.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from dataclasses import dataclass
from itertools import chain, count

import msgpack
import numpy as np

from kiln.ir.edf import (
    ALIGN,
    INSTRUCTIONS,
    METADATA,
    SCHED_HEAD,
    SCHEDULE,
    SIGNATURE,
    SLOT,
    Layout,
    canonical_json,
    decode_signature,
)
from kiln.ir.lir import Instr, Program, ScheduledProgram, instr_to_obj
from kiln.runners.sim_exec import Fast
from kiln.runners.sim_msgpack import read_instructions
from kiln.runners.sim_templates import SPACE_CODES, NotColumnar, Template, Templates, need, only

SLOT_DTYPE = np.dtype([("instr", "<u4"), ("unit", "<u4"), ("start", "<i8"), ("end", "<i8")])
assert SLOT_DTYPE.itemsize == SLOT.size
CHUNK = 512  # rows decoded and put in columns at a time: their objects stay in the CPU cache
# below this many instructions msgpack's objects cost less than the numpy reader's fixed
# cost (layernorm: 210 instructions 2.2 vs 3.1 ms; 1,092: 8.4 vs 5.1 ms)
NUMPY_FROM = 512


@dataclass(frozen=True)
class Columns:
    """Everything the simulator reads from a binary, one array per field."""

    program: Program  # the signature: args, memories, units (instrs left empty)
    metadata: str  # canonical JSON
    unit_names: tuple[str, ...]  # the distinct unit fields of the instructions
    unit: np.ndarray  # per instruction, its unit field as an index into unit_names
    latency: np.ndarray  # int64 per instruction
    acc_ptr: np.ndarray  # accesses of instruction k: [acc_ptr[k], acc_ptr[k + 1])
    acc_space: np.ndarray  # SPACE_CODES, -1 for any other space
    acc_addr: np.ndarray
    acc_end: np.ndarray
    acc_write: np.ndarray  # bool
    dep_ptr: np.ndarray
    dep_src: np.ndarray
    slot_instr: np.ndarray
    slot_unit: tuple[str, ...]  # the unit table of the schedule section
    slot_unit_index: np.ndarray
    slot_start: np.ndarray
    slot_end: np.ndarray
    templates: tuple[Template, ...]
    fast: tuple[Fast | None, ...]  # per template: its fast path, None: lir_exec semantics
    generic: dict[int, Instr]  # Instr objects for the rows whose templates run generically
    reader: str = "numpy"  # how the instructions were read: numpy, chunks (msgpack objects)

    @property
    def count(self) -> int:
        return len(self.latency)


def _ints(values) -> np.ndarray:
    values = tuple(values)
    only(values, int)
    return np.array(values, dtype=np.int64) if values else np.zeros(0, np.int64)


# --------------------------------------------------------------------------- sections


def decode_columns(raw: bytes, layout: Layout) -> Columns:
    """Columns of a binary whose layout and checksums ``read_layout`` has checked."""

    def section(type_id: int) -> bytes:
        sec = layout.section(type_id)
        return raw[sec.offset : sec.offset + sec.size]

    program = decode_signature(section(SIGNATURE))
    meta = json.loads(section(METADATA).decode("ascii"))
    need(isinstance(meta, dict), "metadata is an object")
    table, units, _ = _schedule(section(SCHEDULE))
    data = section(INSTRUCTIONS)
    metadata = canonical_json(meta)
    try:  # every instruction at once, in numpy (past a few hundred: its fixed cost pays)
        need(len(table) >= NUMPY_FROM, "enough instructions for the numpy reader")
        templates = Templates()
        fields = read_instructions(data, templates)
        need(len(fields["latency"]) == len(table), "one slot per instruction")
        found, fast = templates.finish()
        return Columns(
            program=program,
            metadata=metadata,
            **fields,
            **_slots(table, units),
            templates=found,
            fast=fast,
            generic=templates.generic,
        )
    except NotColumnar:
        pass  # small, or something only msgpack reads: a chunk of objects at a time
    unpacker = msgpack.Unpacker(
        raw=False, use_list=False, strict_map_key=False, max_buffer_size=max(len(data), 1)
    )
    unpacker.feed(data)
    n = unpacker.read_array_header()
    need(n == len(table), "one slot per instruction")
    builder = _Builder()
    for offset in range(0, n, CHUNK):
        rows = tuple([unpacker.unpack() for _ in range(min(CHUNK, n - offset))])
        builder.add(rows, offset)
    try:
        unpacker.unpack()
    except msgpack.OutOfData:
        return builder.finish(program, metadata, table, units)
    raise NotColumnar("bytes after the instruction list")


def _schedule(data: bytes) -> tuple[np.ndarray, tuple[str, ...], str]:
    """The SCHEDULE section: the slot table as one structured array, the unit names, policy."""
    count, nunits, plen = SCHED_HEAD.unpack_from(data, 0)
    at = SCHED_HEAD.size
    policy = data[at : at + plen].decode("utf-8")
    at += plen
    units = []
    for _ in range(nunits):
        (length,) = struct.unpack_from("<H", data, at)
        units.append(data[at + 2 : at + 2 + length].decode("utf-8"))
        at += 2 + length
    at = (at + ALIGN - 1) // ALIGN * ALIGN
    need(len(data) == at + count * SLOT.size, "slot table size")
    table = np.frombuffer(data, dtype=SLOT_DTYPE, count=count, offset=at)
    need(count == 0 or int(table["unit"].max()) < nunits, "slot unit index")
    return table, tuple(units), policy


def columns_of(sp: ScheduledProgram, metadata: str = "{}") -> Columns:
    """Columns of decoded objects (``SimBinary.load`` of an ``EdfFile``), same checks."""
    units = sorted({s.unit for s in sp.slots})
    index = {u: n for n, u in enumerate(units)}
    slots = [(s.instr, index[s.unit], s.start, s.end) for s in sp.slots]
    table = np.array(slots, dtype=SLOT_DTYPE)
    instrs = sp.program.instrs
    need(len(instrs) == len(table), "one slot per instruction")
    builder = _Builder()
    for offset in range(0, len(instrs), CHUNK):
        builder.add(tuple(_row(instr_to_obj(i)) for i in instrs[offset : offset + CHUNK]), offset)
    program = dataclasses.replace(sp.program, instrs=())
    return builder.finish(program, metadata, table, tuple(units))


def _row(obj: list) -> tuple:
    """instr_to_obj's lists as the tuples msgpack gives back (``use_list=False``)."""
    ident, unit, opcode, reads, writes, nbytes, latency, deps, args, text = obj
    return (
        ident,
        unit,
        opcode,
        tuple(map(tuple, reads)),
        tuple(map(tuple, writes)),
        nbytes,
        latency,
        tuple(map(tuple, deps)),
        tuple(map(tuple, args)),
        text,
    )


# --------------------------------------------------------------------------- instructions


class _Builder:
    """Columns made a chunk of rows at a time, joined by ``finish``."""

    def __init__(self) -> None:
        self.n = 0
        self.ids = count()  # first-seen numbers: sparse codes, made dense at the end
        self.unit_codes: dict[str, int] = {}
        self.units: list[np.ndarray] = []
        self.latency: list[np.ndarray] = []
        self.acc: list[tuple] = []
        self.deps: list[tuple] = []
        self.templates = Templates()

    def add(self, rows: tuple, offset: int) -> None:
        m = len(rows)
        only(rows, tuple)  # of ten fields each: the strict zip says so
        ids, units, opcodes, reads, writes, nbytes, latency, deps, args, _ = zip(*rows, strict=True)
        need(ids == tuple(range(offset, offset + m)), "dense instruction ids")
        only(units, str)
        only(opcodes, str)
        only(nbytes, int)
        codes = map(self.unit_codes.setdefault, units, self.ids)
        self.units.append(np.fromiter(codes, np.int64, m))
        self.latency.append(_ints(latency))
        self.acc.append(_accesses(reads, writes))
        self.deps.append(_deps(deps))
        self.templates.add(rows, opcodes, args, offset)
        self.n += m

    def finish(self, program: Program, metadata: str, table, slot_units) -> Columns:
        need(self.n == len(table), "one slot per instruction")
        names = tuple(self.unit_codes)
        dense = np.zeros(max(self.unit_codes.values(), default=0) + 1, np.int64)
        dense[list(self.unit_codes.values())] = np.arange(len(names))
        unit = _cat(self.units)
        templates, fast = self.templates.finish()
        counts = [len(part[1]) for part in self.acc]  # accesses per chunk
        acc_ptr = _join_ptr([part[0] for part in self.acc], counts)
        dep_ptr = _join_ptr([part[0] for part in self.deps], [len(p[1]) for p in self.deps])
        return Columns(
            program=program,
            metadata=metadata,
            unit_names=names,
            unit=dense[unit] if len(unit) else unit,
            latency=_cat(self.latency),
            acc_ptr=acc_ptr,
            acc_space=_cat([part[1] for part in self.acc]),
            acc_addr=_cat([part[2] for part in self.acc]),
            acc_end=_cat([part[3] for part in self.acc]),
            acc_write=_cat([part[4] for part in self.acc], bool),
            dep_ptr=dep_ptr,
            dep_src=_cat([part[1] for part in self.deps]),
            **_slots(table, slot_units),
            templates=templates,
            fast=fast,
            generic=self.templates.generic,
            reader="chunks",
        )


def _slots(table: np.ndarray, units: tuple[str, ...]) -> dict:
    return {
        "slot_instr": table["instr"].astype(np.int64),
        "slot_unit": units,
        "slot_unit_index": table["unit"].astype(np.int64),
        "slot_start": table["start"].astype(np.int64),
        "slot_end": table["end"].astype(np.int64),
    }


def _cat(parts: list[np.ndarray], dtype=np.int64) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def _join_ptr(ptrs: list[np.ndarray], counts: list[int]) -> np.ndarray:
    """Per-chunk offsets (each from 0) as one offset array over all rows."""
    if not ptrs:
        return np.zeros(1, np.int64)
    base = np.cumsum([0, *counts[:-1]])
    return np.concatenate([ptrs[0][:1]] + [p[1:] + b for p, b in zip(ptrs, base, strict=True)])


def _ptr(groups: tuple) -> np.ndarray:
    ptr = np.zeros(len(groups) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, groups), np.int64, len(groups)), out=ptr[1:])
    return ptr


def _accesses(reads: tuple, writes: tuple) -> tuple[np.ndarray, ...]:
    """(ptr, space, addr, end, is-write): reads then writes of each instruction, flattened."""
    both = tuple(map(tuple.__add__, reads, writes))  # TypeError unless both are tuples
    flat = tuple(chain.from_iterable(both))
    # a strict zip: three fields each; anything but (str, int, int) fails a type check below
    spaces, addrs, sizes = zip(*flat, strict=True) if flat else ((), (), ())
    only(spaces, str)
    addr = _ints(addrs)
    ptr = _ptr(both)
    nreads = np.fromiter(map(len, reads), np.int64, len(reads))
    owner = np.repeat(np.arange(len(both)), np.diff(ptr))
    lookup = {s: SPACE_CODES.get(s, -1) for s in set(spaces)}
    space = np.fromiter(map(lookup.__getitem__, spaces), np.int64, len(spaces))
    write = np.arange(len(flat)) >= (ptr[:-1] + nreads)[owner]
    return ptr, space, addr, addr + _ints(sizes), write


def _deps(deps: tuple) -> tuple[np.ndarray, np.ndarray]:
    only(deps, tuple)
    flat = tuple(chain.from_iterable(deps))
    srcs, kinds = zip(*flat, strict=True) if flat else ((), ())
    only(kinds, str)
    return _ptr(deps), _ints(srcs)
