"""Instructions grouped into templates: the same opcode, operands and arguments but addresses.

A layernorm of 16k instructions has 14 templates. The simulator decides
how to run a template once (``kiln.runners.sim_exec.choose``) and binds its
instructions together. Keys are built column by column over the rows of
one opcode (``zip``, ``map``: no Python code per instruction), a chunk of
rows at a time, while msgpack's freshly made objects are still in the
CPU's cache (walking a million of them afterwards cost more than making
them).

Only values whose equality is identity go into a key (ints, strings,
tuples of them; an immediate with its ``repr``), so that ``1``, ``1.0`` and
``True`` never share a template; any other value raises ``NotColumnar``.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain, count, repeat
from operator import itemgetter
from typing import Any

import msgpack
import numpy as np

from kiln.ir.lir import Instr, instr_from_obj
from kiln.runners.sim_exec import Fast, choose

SPACE_CODES = {"sram": 0, "dram": 1}


class NotColumnar(ValueError):
    """The binary is not in the canonical form the columnar path reads."""


def need(ok: bool, what: str) -> None:
    if not ok:
        raise NotColumnar(what)


def only(values, *types: type) -> None:
    """Every value has exactly one of ``types`` (bool is not an int here)."""
    need(set(map(type, values)) <= set(types), f"values of types {types}")


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


class Templates:
    """Collects templates chunk by chunk; ``finish`` gives them with their fast paths."""

    def __init__(self) -> None:
        self.index: dict[tuple, int] = {}
        self.shapes: list[Template] = []  # rows and addrs empty until finish
        self.fast: list[Fast | None] = []
        self.rows: list[list[np.ndarray]] = []
        self.addrs: list[list[np.ndarray]] = []
        self.generic: dict[int, Instr] = {}  # Instr objects for rows that run generically

    def add(self, rows: tuple, opcodes: tuple, args: tuple, offset: int) -> None:
        """Key the instructions ``rows`` (positions from ``offset``) by template."""
        m = len(rows)
        first: dict[str, int] = {}
        group_of = np.fromiter(map(first.setdefault, opcodes, count()), np.int64, m)
        order = np.argsort(group_of, kind="stable")
        _, starts = np.unique(group_of[order], return_index=True)
        for lo, hi in zip(starts.tolist(), [*starts[1:].tolist(), m], strict=True):
            at = order[lo:hi]
            op = opcodes[at[0]]
            group = itemgetter(*at.tolist())(args) if hi - lo > 1 else (args[at[0]],)
            try:
                keys, addr_cols = _group_keys(op, group)
            except _Irregular:
                keys, addr_cols = row_keys(op, group)
            addrs = np.array(addr_cols, dtype=np.int64).reshape(len(addr_cols), hi - lo).T
            self._place(keys, addrs, at, rows, offset)

    def _place(self, keys: list, addrs: np.ndarray, at: np.ndarray, rows: tuple, offset: int):
        seen: dict[tuple, int] = {}
        sparse = np.fromiter(map(seen.setdefault, keys, count()), np.int64, len(keys))
        firsts, inverse = np.unique(sparse, return_inverse=True)
        for u, pos in enumerate(firsts.tolist()):
            t = self.index.get(keys[pos])
            if t is None:
                t = self._new(keys[pos])
            mine = inverse == u
            self.rows[t].append(at[mine] + offset)
            self.addrs[t].append(addrs[mine])
            if self.fast[t] is None:  # runs lir_exec's semantics, which take an Instr
                for k in at[mine].tolist():
                    self.generic[k + offset] = instr_from_obj(rows[k])

    def place(self, key: tuple, first: list[int], memory: np.ndarray, rows, data, starts):
        """A whole template's rows at once (``sim_msgpack``): ``memory`` holds the address
        of each memory operand, row by row; ``first`` the first row's operand addresses."""
        t = self.index.get(key)
        if t is None:
            t = self._new(key)
        shape = self.shapes[t]
        operands = (shape.dst, *shape.srcs)
        need(shape.dst is not None, "a destination")
        at = [k for k, o in enumerate(operands) if o.kind != "imm"]
        need(len(at) == memory.shape[1], "an address per memory operand")
        need(memory[0].tolist() == [first[k] for k in at], "addresses where operands have them")
        addrs = np.zeros((len(rows), len(operands)), np.int64)
        addrs[:, at] = memory
        self.rows[t].append(rows)
        self.addrs[t].append(addrs)
        if self.fast[t] is None:
            for k in rows.tolist():
                row = msgpack.unpackb(data[starts[k] : starts[k + 1]], raw=False, use_list=False)
                self.generic[k] = instr_from_obj(row)

    def _new(self, key: tuple) -> int:
        t = len(self.shapes)
        self.index[key] = t
        shape = _template(key)
        self.shapes.append(shape)
        self.fast.append(choose(shape))
        self.rows.append([])
        self.addrs.append([])
        return t

    def finish(self) -> tuple[tuple[Template, ...], tuple[Fast | None, ...]]:
        out = []
        for shape, rows, addrs in zip(self.shapes, self.rows, self.addrs, strict=True):
            out.append(
                Template(
                    shape.opcode,
                    shape.extra,
                    shape.dst,
                    shape.srcs,
                    np.concatenate(rows),
                    np.concatenate(addrs),
                )
            )
        return tuple(out), tuple(self.fast)


class _Irregular(Exception):
    """A group whose rows do not share one argument layout: key it row by row."""


def plain(values) -> None:
    """Ints, strings and tuples of them only, at any depth: values whose equality is identity."""
    level = values
    while level:
        types = set(map(type, level))
        need(types <= {int, str, tuple}, "ints, strings and tuples")
        if tuple not in types:
            return
        level = tuple(chain.from_iterable(v for v in level if type(v) is tuple))


def _group_keys(op: str, group: tuple) -> tuple[list, list]:
    """Each row's key and its operands' addresses (one tuple per operand), column by column."""
    if len(set(map(len, group))) != 1:
        raise _Irregular
    names, parts, addr_cols = [], [], []
    for col in zip(*group, strict=True):
        only(col, tuple)
        need(set(map(len, col)) == {2}, "(key, value) arguments")
        ks, vs = zip(*col, strict=True)
        only(ks, str)
        if len(set(ks)) != 1:
            raise _Irregular
        name = ks[0]
        if name == "dst":
            key, addr = _operand_col(vs)
            names.append(name)
            parts.append(key)
            addr_cols.append(addr)
        elif name == "srcs":
            only(vs, tuple)
            if len(set(map(len, vs))) != 1:
                raise _Irregular
            names.append(f"srcs:{len(vs[0])}")
            for operands in zip(*vs, strict=True):
                key, addr = _operand_col(operands)
                parts.append(key)
                addr_cols.append(addr)
        else:
            plain(vs)
            names.append(name)
            parts.append(vs)
    head = (op, tuple(names))
    if not parts:  # no arguments at all (zip would repeat the head forever)
        return [(head,)] * len(group), addr_cols
    return list(zip(repeat(head), *parts, strict=False)), addr_cols


_SRAM = itemgetter(0, 2, 3)  # an operand's key: all but its address
_DRAM = itemgetter(0, 2, 3, 4)


def _operand_col(ops: tuple) -> tuple[list, tuple]:
    """Per operand, its key (the operand less its address) and its address (0: immediate)."""
    only(ops, tuple)
    kinds = set(map(itemgetter(0), ops))
    if kinds == {"imm"}:
        need(set(map(len, ops)) == {3}, "an immediate (value, dtype)")
        only(map(itemgetter(1), ops), int, float)
        return list(zip(ops, map(repr, map(itemgetter(1), ops)), strict=True)), (0,) * len(ops)
    if len(kinds) != 1 or not kinds <= {"sram", "dram"}:  # mixed: immediates and memory
        return [_operand_key(o) for o in ops], tuple(_operand_addr(o) for o in ops)
    dram = kinds == {"dram"}
    need(set(map(len, ops)) == {5 if dram else 4}, "a memory operand")
    addrs = tuple(map(itemgetter(1), ops))
    only(addrs, int)
    only(map(itemgetter(2), ops), str)
    for field in (3, 4) if dram else (3,):  # shape, strides: tuples of ints
        values = tuple(map(itemgetter(field), ops))
        only(values, tuple)
        only(chain.from_iterable(values), int)
    return list(map(_DRAM if dram else _SRAM, ops)), addrs


def _operand_key(o: tuple) -> tuple:
    if o[0] != "imm":
        plain((o[2:],))
        return (o[0], *o[2:])
    need(len(o) == 3 and type(o[1]) in (int, float), "an immediate (value, dtype)")
    return (o, repr(o[1]))  # repr tells -0.0 from 0.0 and 1 from 1.0, which compare equal


def _operand_addr(o: tuple) -> int:
    if o[0] == "imm":
        return 0
    need(type(o[1]) is int, "an int address")
    return o[1]


def row_keys(op: str, group: tuple) -> tuple[list, list]:
    """What ``_group_keys`` gives, row by row (rows of one opcode with different args)."""
    keys, addrs = [], []
    for args in group:
        names, parts, row_addrs = [], [], []
        for pair in args:
            need(type(pair) is tuple and len(pair) == 2, "(key, value) arguments")
            name, value = pair
            need(type(name) is str, "argument names")
            if name == "dst":
                need(type(value) is tuple, "an operand")
                names.append(name)
                parts.append(_operand_key(value))
                row_addrs.append(_operand_addr(value))
            elif name == "srcs":
                need(type(value) is tuple and set(map(type, value)) <= {tuple}, "operands")
                names.append(f"srcs:{len(value)}")
                parts.extend(map(_operand_key, value))
                row_addrs.extend(map(_operand_addr, value))
            else:
                plain((value,))
                names.append(name)
                parts.append(value)
        keys.append(((op, tuple(names)), *parts))
        addrs.append(row_addrs)
    # rows of different operand counts cannot share an address matrix
    need(len(set(map(len, addrs))) <= 1, "one operand count per opcode")
    return keys, list(zip(*addrs, strict=True)) if addrs and addrs[0] else []


def _template(key: tuple) -> Template:
    """A key back to the template it names (rows and addresses left empty)."""
    (opcode, names), *parts = key
    extra, dst, srcs = [], None, ()
    at = 0
    for name in names:
        if name == "dst":
            dst = _operand(parts[at])
            at += 1
        elif name.startswith("srcs:"):
            n = int(name[5:])
            srcs = tuple(_operand(p) for p in parts[at : at + n])
            at += n
        else:
            extra.append((name, parts[at]))
            at += 1
    empty = np.zeros(0, np.int64)
    return Template(opcode, tuple(extra), dst, srcs, empty, empty.reshape(0, 1 + len(srcs)))


def _operand(key: tuple) -> Operand:
    """An operand key back to its parts; NotColumnar when it is not one Kiln writes."""
    if type(key[0]) is tuple:  # an immediate: (the operand, repr of its value)
        (_, value, dtype), _ = key
        need(type(dtype) is str, "an immediate's dtype")
        return Operand("imm", dtype, value=value)
    kind = key[0]
    need(kind in SPACE_CODES, "a known operand kind")
    need(len(key) == (3 if kind == "sram" else 4), f"a {kind} operand")
    dtype, shape = key[1], key[2]
    need(type(dtype) is str and type(shape) is tuple, "dtype and shape")
    only(shape, int)
    strides = None
    if kind == "dram":
        strides = key[3]
        need(type(strides) is tuple and len(strides) == len(shape), "strides per dim")
        only(strides, int)
    return Operand(kind, dtype, shape, strides)
