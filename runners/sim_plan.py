"""What preparing a binary for the simulator computes, kept per binary's bytes.

A ``Plan`` is a checked binary in columns (``kiln.runners.sim_decode``),
the fast path chosen for each of its templates, its schedule order and the
figures its metrics need. It holds no memory: binding it to a fresh DRAM
and SRAM (``SimBinary``) is cheap, so ``kiln test`` and ``kiln bench``
preparing the same binary in one process decode and check it once. Plans
are kept in a small in-process LRU keyed by the sha256 of the EDF file's
bytes: the same bytes make the same plan, whatever the file is called.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from kiln.ir.edf import EdfFormatError, gc_paused, read_layout
from kiln.ir.lir import Instr, Program, ScheduledProgram
from kiln.runners.sim_checks import operands_bindable, passes
from kiln.runners.sim_decode import Columns, columns_of, decode_columns
from kiln.runners.sim_exec import Fast
from kiln.runners.sim_templates import Template

CACHE_SIZE = 16  # plans kept; a 16k-instruction plan is under a megabyte


@dataclass(frozen=True)
class Plan:
    """What binding needs, and nothing the checks alone needed (a plan is kept)."""

    program: Program  # the signature: arguments and memories
    metadata: str
    templates: tuple[Template, ...]
    fast: tuple[Fast | None, ...]  # per template
    generic: dict[int, Instr]  # Instr objects of the rows that run lir_exec's semantics
    gather: list[int]  # steps in template-row order -> schedule order (start, then position)
    count: int
    makespan: int
    busy: dict[str, int]  # cycles each unit is busy


def plan_of(cols: Columns) -> Plan | None:
    """The plan of columns whose operands can be bound, or None (bind one by one)."""
    if not operands_bindable(cols):
        return None
    order = np.argsort(cols.slot_start, kind="stable")
    rows = np.concatenate([t.rows for t in cols.templates] or [np.zeros(0, np.int64)])
    where = np.empty(cols.count, dtype=np.int64)
    where[rows] = np.arange(len(rows))
    units = cols.slot_unit_index
    cycles = np.bincount(units, weights=cols.latency, minlength=len(cols.slot_unit))
    used = np.bincount(units, minlength=len(cols.slot_unit))
    busy = {name: int(c) for name, c, k in zip(cols.slot_unit, cycles, used, strict=True) if k}
    makespan = int(cols.slot_end.max()) if cols.count else 0
    return Plan(
        cols.program, cols.metadata, cols.templates, cols.fast, cols.generic,
        where[order].tolist(), cols.count, makespan, busy,
    )  # fmt: skip


def plan_of_program(sp: ScheduledProgram, metadata: str) -> Plan | None:
    """The plan of a decoded binary (no checks: ``SimBinary.load`` never made them)."""
    try:
        cols = columns_of(sp, metadata)
    except Exception:  # noqa: BLE001 - anything unusual is the object path's to handle
        return None
    return plan_of(cols)


def checked_plan(raw: bytes, where: str) -> Plan | None:
    """The plan of EDF bytes that pass every check, or None: the object path must decide.

    ``EdfFormatError`` (a bad checksum, a truncated file) is raised as
    ``read_layout`` raises it. None means the binary is refused, not
    canonical, or cannot be bound; the caller then goes the object way,
    which words each problem as it always has.
    """
    key = hashlib.sha256(raw).digest()
    plan = _CACHE.get(key)
    if plan is not None:
        return plan
    layout = read_layout(raw, where)
    with gc_paused():  # about a million short tuples from msgpack: nothing to collect
        try:
            cols = decode_columns(raw, layout)
        except EdfFormatError:
            raise
        except Exception:  # noqa: BLE001 - not the canonical form: the object path decides
            return None
        if not passes(cols):
            return None
        plan = plan_of(cols)
    if plan is not None:
        _CACHE.put(key, plan)
    return plan


class _Lru:
    def __init__(self, size: int):
        self.size = size
        self.items: OrderedDict[bytes, Plan] = OrderedDict()
        self.lock = threading.Lock()  # runners may prepare from a thread pool

    def get(self, key: bytes) -> Plan | None:
        with self.lock:
            plan = self.items.get(key)
            if plan is not None:
                self.items.move_to_end(key)
            return plan

    def put(self, key: bytes, plan: Plan) -> None:
        with self.lock:
            self.items[key] = plan
            self.items.move_to_end(key)
            while len(self.items) > self.size:
                self.items.popitem(last=False)

    def clear(self) -> None:
        with self.lock:
            self.items.clear()


_CACHE = _Lru(CACHE_SIZE)


def clear_cache() -> None:
    """Forget every plan (benchmarks measure a first prepare this way)."""
    _CACHE.clear()
