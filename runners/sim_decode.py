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
from itertools import chain, repeat
from operator import getitem, itemgetter
from typing import Any

import msgpack
import numpy as np
from kiln.runners.sim_exec import Fast, choose

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
)
from kiln.ir.lir import ArgSlot, Instr, Program, ScheduledProgram, instr_from_obj, instr_to_obj

SPACE_CODES = {"sram": 0, "dram": 1}
SLOT_DTYPE = np.dtype([("instr", "<u4"), ("unit", "<u4"), ("start", "<i8"), ("end", "<i8")])
assert SLOT_DTYPE.itemsize == SLOT.size
_TAIL = slice(2, None)  # an operand without its kind and address: (dtype, shape[, strides])


class NotColumnar(ValueError):
    """The binary is not in the canonical form the columnar path reads."""


@dataclass(frozen=True, slots=True)
class Operand:
    """One operand of a template: what every instruction of it shares (not the address)."""

    kind: str  # sram | dram | imm
    dtype: str
    shape: tuple[int, ...] = ()
    strides: tuple[int, ...] | None = None  # elements; None for sram (row-major)
    value: Any = None  # imm only


@dataclass(frozen=True)
class Template:
    """Instructions with one opcode and the same operands and arguments but for addresses."""

    opcode: str
    extra: tuple[tuple[str, Any], ...]  # args other than dst/srcs, sorted by key
    dst: Operand | None
    srcs: tuple[Operand, ...]
    rows: np.ndarray  # positions in the instruction list
    addrs: np.ndarray  # (len(rows), 1 + len(srcs)) byte addresses, 0 for an immediate

    def arg(self, name: str, default: Any = None) -> Any:
        for key, value in self.extra:
            if key == name:
                return value
        return default


@dataclass(frozen=True)
class Columns:
    """Everything the simulator reads from a binary, one array per field."""

    program: Program  # the signature: args, memories, units (instrs left empty)
    metadata: str  # canonical JSON
    units: tuple[str, ...]  # per instruction, its own unit field
    opcodes: tuple[str, ...]
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

    @property
    def count(self) -> int:
        return len(self.opcodes)


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise NotColumnar(what)


def _only(values, *types: type) -> None:
    """Every value has exactly one of ``types`` (bool is not an int here)."""
    _need(set(map(type, values)) <= set(types), f"values of types {types}")


def _ints(values) -> np.ndarray:
    _only(values, int)
    return np.array(values, dtype=np.int64) if values else np.zeros(0, np.int64)


# --------------------------------------------------------------------------- sections


def decode_columns(raw: bytes, layout: Layout) -> Columns:
    """Columns of a binary whose layout and checksums ``read_layout`` has checked."""

    def section(type_id: int) -> bytes:
        sec = layout.section(type_id)
        return raw[sec.offset : sec.offset + sec.size]

    program = _signature(section(SIGNATURE))
    meta = json.loads(section(METADATA).decode("ascii"))
    _need(isinstance(meta, dict), "metadata is an object")
    slots = _schedule(section(SCHEDULE))
    rows = msgpack.unpackb(section(INSTRUCTIONS), raw=False, use_list=False, strict_map_key=False)
    _need(type(rows) is tuple, "an instruction list")
    return _columns(program, canonical_json(meta), rows, *slots)


def _signature(data: bytes) -> Program:
    """As ``kiln.ir.edf`` reads the SIGNATURE section."""
    sig = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=False)
    return Program(
        kernel=sig["kernel"],
        machine=sig["machine"],
        units=tuple((str(k), int(c)) for k, c in sig["units"]),
        args=tuple(
            ArgSlot(name, role, tuple(int(d) for d in shape), dtype, int(off), int(nb))
            for name, role, dtype, shape, off, nb in sig["args"]
        ),
        instrs=(),
        sram_bytes=int(sig["sram_bytes"]),
        sram_peak=int(sig["sram_peak"]),
        dram_bytes=int(sig["dram_bytes"]),
    )


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
    _need(len(data) == at + count * SLOT.size, "slot table size")
    table = np.frombuffer(data, dtype=SLOT_DTYPE, count=count, offset=at)
    _need(count == 0 or int(table["unit"].max()) < nunits, "slot unit index")
    return table, tuple(units), policy


def columns_of(sp: ScheduledProgram, metadata: str = "{}") -> Columns:
    """Columns of decoded objects (``SimBinary.load`` of an ``EdfFile``), same checks."""
    rows = tuple(_row(instr_to_obj(i)) for i in sp.program.instrs)
    units = sorted({s.unit for s in sp.slots})
    index = {u: n for n, u in enumerate(units)}
    table = np.array([(s.instr, index[s.unit], s.start, s.end) for s in sp.slots], dtype=SLOT_DTYPE)
    program = dataclasses.replace(sp.program, instrs=())
    return _columns(program, metadata, rows, table, tuple(units), sp.policy)


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


def _columns(program, metadata, rows, table, slot_units, policy) -> Columns:
    del policy  # checked by the decoder; the simulator does not use it
    n = len(rows)
    _need(len(table) == n, "one slot per instruction")
    _need(not n or set(map(len, rows)) == {10}, "ten fields per instruction")
    cols = list(zip(*rows, strict=False)) if n else [()] * 10
    ids, units, opcodes, reads, writes, nbytes, latency, deps, args, text = cols
    _need(ids == tuple(range(n)), "dense instruction ids")
    _only(units, str)
    _only(opcodes, str)
    _only(text, str)
    _only(nbytes, int)
    acc = _accesses(reads, writes)
    dep_ptr, dep_src = _deps(deps)
    templates, fast, generic_rows = _templates(opcodes, args)
    generic = {k: _instr(rows[k]) for k in generic_rows}
    return Columns(
        program=program,
        metadata=metadata,
        units=units,
        opcodes=opcodes,
        latency=_ints(latency),
        **acc,
        dep_ptr=dep_ptr,
        dep_src=dep_src,
        slot_instr=table["instr"].astype(np.int64),
        slot_unit=slot_units,
        slot_unit_index=table["unit"].astype(np.int64),
        slot_start=table["start"].astype(np.int64),
        slot_end=table["end"].astype(np.int64),
        templates=templates,
        fast=fast,
        generic=generic,
    )


def _instr(row: tuple) -> Instr:
    return instr_from_obj(row)


def _ptr(groups) -> np.ndarray:
    counts = np.fromiter(map(len, groups), dtype=np.int64, count=len(groups))
    ptr = np.zeros(len(groups) + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr


def _accesses(reads: tuple, writes: tuple) -> dict[str, np.ndarray]:
    """Reads then writes of each instruction, flattened; ``acc_ptr`` delimits them."""
    _only(reads, tuple)
    _only(writes, tuple)
    both = tuple(map(tuple.__add__, reads, writes))
    flat = tuple(chain.from_iterable(both))
    _only(flat, tuple)
    _need(not flat or set(map(len, flat)) == {3}, "accesses of three fields")
    spaces, addrs, sizes = zip(*flat, strict=False) if flat else ((), (), ())
    _only(spaces, str)
    addr = _ints(addrs)
    ptr = _ptr(both)
    nreads = np.fromiter(map(len, reads), dtype=np.int64, count=len(reads))
    owner = np.repeat(np.arange(len(both)), np.diff(ptr))
    lookup = {s: SPACE_CODES.get(s, -1) for s in set(spaces)}
    return {
        "acc_ptr": ptr,
        "acc_space": np.fromiter(map(lookup.__getitem__, spaces), np.int64, len(spaces)),
        "acc_addr": addr,
        "acc_end": addr + _ints(sizes),
        "acc_write": np.arange(len(flat)) >= (ptr[:-1] + nreads)[owner],
    }


def _deps(deps: tuple) -> tuple[np.ndarray, np.ndarray]:
    _only(deps, tuple)
    flat = tuple(chain.from_iterable(deps))
    _only(flat, tuple)
    _need(not flat or set(map(len, flat)) == {2}, "dependencies of two fields")
    srcs, kinds = zip(*flat, strict=False) if flat else ((), ())
    _only(kinds, str)
    return _ptr(deps), _ints(srcs)


def _templates(opcodes: tuple, args: tuple) -> tuple[tuple[Template, ...], tuple, list[int]]:
    """Group instructions by everything but their addresses; each one's fast path (None:
    it runs generically) and the rows that run generically.

    Each row's key is built column by column (``zip`` over the rows of one
    opcode) rather than instruction by instruction; an irregular group (arg
    names differing between rows of one opcode) is keyed row by row.
    """
    _only(args, tuple)
    n = len(opcodes)
    keys: list = [None] * n
    addrs: list = [None] * n
    by_op: dict[str, list[int]] = {}
    for k, op in enumerate(opcodes):
        by_op.setdefault(op, []).append(k)
    for op, rows in by_op.items():
        group = itemgetter(*rows)(args) if len(rows) > 1 else (args[rows[0]],)
        try:
            gkeys, gaddrs = _group_keys(op, group)
        except _Irregular:
            gkeys, gaddrs = zip(*(_row_key(op, a) for a in group), strict=False)
        for k, key, addr in zip(rows, gkeys, gaddrs, strict=True):
            keys[k] = key
            addrs[k] = addr
    index: dict = {}
    ids = np.fromiter((index.setdefault(key, len(index)) for key in keys), np.int64, n)
    order = np.argsort(ids, kind="stable")
    bounds = np.searchsorted(ids[order], np.arange(len(index) + 1))
    templates, fast, generic = [], [], []
    for t, key in enumerate(index):
        rows = order[bounds[t] : bounds[t + 1]]
        template = _template(key, rows, np.array([addrs[k] for k in rows.tolist()], np.int64))
        templates.append(template)
        fast.append(choose(template))
        if fast[-1] is None:
            generic.extend(rows.tolist())
    return tuple(templates), tuple(fast), generic


class _Irregular(Exception):
    """A group whose rows do not share one argument layout: key it row by row."""


def _plain(values) -> None:
    """Ints, strings and tuples of them only, at any depth: values whose equality is identity.

    Keys merge rows into one template, so ``1`` and ``1.0`` or ``True`` (equal
    and hashed alike) must not meet there.
    """
    level = values
    while level:
        types = set(map(type, level))
        _need(types <= {int, str, tuple}, "ints, strings and tuples")
        if tuple not in types:
            return
        level = tuple(chain.from_iterable(v for v in level if type(v) is tuple))


def _group_keys(op: str, group: tuple) -> tuple[list, list]:
    if len(set(map(len, group))) != 1:
        raise _Irregular
    names, parts, addr_cols = [], [], []
    for col in zip(*group, strict=False):
        _only(col, tuple)
        _need(set(map(len, col)) == {2}, "(key, value) arguments")
        ks, vs = zip(*col, strict=False)
        _only(ks, str)
        if len(set(ks)) != 1:
            raise _Irregular
        name = ks[0]
        if name == "dst":
            key, addr = _operand_col(vs)
            names.append(name)
            parts.append(key)
            addr_cols.append(addr)
        elif name == "srcs":
            _only(vs, tuple)
            if len(set(map(len, vs))) != 1:
                raise _Irregular
            names.append(f"srcs:{len(vs[0])}")
            for operands in zip(*vs, strict=False):
                key, addr = _operand_col(operands)
                parts.append(key)
                addr_cols.append(addr)
        else:
            _plain(vs)
            names.append(name)
            parts.append(vs)
    head = (op, tuple(names))
    return list(zip(repeat(head), *parts)), list(zip(*addr_cols, strict=False)) or [()] * len(group)


def _operand_col(ops: tuple) -> tuple[list, tuple]:
    """Per operand, its key (the operand less its address) and its address (0: immediate)."""
    _only(ops, tuple)
    kinds = tuple(map(itemgetter(0), ops))
    if "imm" in kinds:
        return [_operand_key(o) for o in ops], tuple(_operand_addr(o) for o in ops)
    addrs = tuple(map(itemgetter(1), ops))
    _only(addrs, int)
    tails = tuple(map(getitem, ops, repeat(_TAIL)))
    _plain(tails)
    return list(zip(kinds, tails, strict=False)), addrs


def _operand_key(o: tuple) -> tuple:
    if o[0] != "imm":
        _plain((o[2:],))
        return (o[0], o[2:])
    _need(len(o) == 3 and type(o[1]) in (int, float), "an immediate (value, dtype)")
    # repr tells -0.0 from 0.0 and 1 from 1.0, which compare equal
    return ("imm", o[1], o[2], repr(o[1]))


def _operand_addr(o: tuple) -> int:
    if o[0] == "imm":
        return 0
    _need(type(o[1]) is int, "an int address")
    return o[1]


def _row_key(op: str, args: tuple) -> tuple[tuple, tuple]:
    """The key ``_group_keys`` gives, for one row."""
    names, parts, addrs = [], [], []
    for pair in args:
        _need(type(pair) is tuple and len(pair) == 2, "(key, value) arguments")
        name, value = pair
        _need(type(name) is str, "argument names")
        if name == "dst":
            _need(type(value) is tuple, "an operand")
            names.append(name)
            parts.append(_operand_key(value))
            addrs.append(_operand_addr(value))
        elif name == "srcs":
            _need(type(value) is tuple and set(map(type, value)) <= {tuple}, "operands")
            names.append(f"srcs:{len(value)}")
            parts.extend(map(_operand_key, value))
            addrs.extend(map(_operand_addr, value))
        else:
            _plain((value,))
            names.append(name)
            parts.append(value)
    return ((op, tuple(names)), *parts), tuple(addrs)


def _template(key: tuple, rows: np.ndarray, addrs: np.ndarray) -> Template:
    (opcode, names), *parts = key
    extra, dst, srcs = [], None, ()
    at = 0
    for name in names:
        if name == "dst":
            dst = _operand(parts[at])
            at += 1
        elif name.startswith("srcs:"):
            count = int(name[5:])
            srcs = tuple(_operand(p) for p in parts[at : at + count])
            at += count
        else:
            extra.append((name, parts[at]))
            at += 1
    if len(rows) and addrs.ndim == 1:
        addrs = addrs.reshape(len(rows), -1)
    return Template(opcode, tuple(extra), dst, srcs, rows, addrs)


def _operand(key: tuple) -> Operand:
    """An operand key back to its parts; NotColumnar when it is not one Kiln writes."""
    kind = key[0]
    if kind == "imm":
        _need(type(key[2]) is str, "an immediate's dtype")
        return Operand("imm", key[2], value=key[1])
    tail = key[1]
    _need(kind in SPACE_CODES, "a known operand kind")
    _need(len(tail) == (2 if kind == "sram" else 3), f"a {kind} operand")
    dtype, shape = tail[0], tail[1]
    _need(type(dtype) is str and type(shape) is tuple, "dtype and shape")
    _only(shape, int)
    strides = None
    if kind == "dram":
        strides = tail[2]
        _need(type(strides) is tuple and len(strides) == len(shape), "strides per dim")
        _only(strides, int)
    return Operand(kind, dtype, shape, strides)
