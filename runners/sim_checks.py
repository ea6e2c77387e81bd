"""The simulator's checks, over columns: schedule rules, races, access and operand bounds.

Each function answers "would the object path (``check_schedule``,
``find_races``, ``bounds_errors`` in kiln.runners.sim, ``operand_array`` in
lir_exec) find nothing wrong?" with numpy over the whole program at once.
They only ever say yes or no: a binary that fails any of them goes back to
the object path, which finds the same problems and words them as it always
has. So each must accept exactly what that path accepts (never more);
tests/runners/test_sim_checks.py holds them to it on broken binaries.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.ir.interp import NUMPY_DTYPES
from kiln.ir.lir_exec import OPCODES
from kiln.ir.schedule_check import unit_instances
from kiln.runners.sim_decode import Columns
from kiln.runners.sim_exec import extent
from kiln.runners.sim_templates import SPACE_CODES

_DIGITS = "0123456789"


def passes(cols: Columns) -> bool:
    """No schedule violation, no access out of bounds and no race (the refusals of prepare)."""
    return schedule_ok(cols) and accesses_in_bounds(cols) and not any_race(cols)


def schedule_ok(cols: Columns) -> bool:
    """Every rule of ``kiln.ir.schedule_check.check_schedule`` holds (ids are dense here)."""
    n = cols.count
    start, end = cols.slot_start, cols.slot_end
    if not np.array_equal(cols.slot_instr, np.arange(n)):  # slot-order
        return False
    known = set(unit_instances(cols.program.units))
    names = cols.slot_unit
    if not all(names[u] in known for u in np.unique(cols.slot_unit_index).tolist()):
        return False  # unit-exists
    kinds: dict[str, int] = {}
    slot_kind = np.array([kinds.setdefault(u.rstrip(_DIGITS), len(kinds)) for u in names] or [0])
    own = np.array([kinds.setdefault(u.rstrip(_DIGITS), len(kinds)) for u in cols.unit_names])
    if n and not np.array_equal(slot_kind[cols.slot_unit_index], own[cols.unit]):
        return False  # unit-kind
    if not np.array_equal(end - start, cols.latency) or (n and start.min() < 0):
        return False  # latency, start
    src = cols.dep_src
    if len(src):
        if src.min() < 0 or src.max() >= n:
            return False  # dep-exists
        owner = np.repeat(np.arange(n), np.diff(cols.dep_ptr))
        if (start[owner] < end[src]).any():
            return False  # dep-order
    return not _unit_overlap(cols)


def _unit_overlap(cols: Columns) -> bool:
    """On some unit, a slot starts before every slot sorted ahead of it has ended."""
    start, end = cols.slot_start, cols.slot_end
    ids = np.arange(cols.count)
    for u in np.unique(cols.slot_unit_index).tolist():
        on = np.flatnonzero(cols.slot_unit_index == u)
        order = on[np.lexsort((ids[on], end[on], start[on]))]
        busy = np.maximum.accumulate(end[order])[:-1]  # the furthest end so far
        if (start[order][1:] < busy).any():
            return True
    return False


def accesses_in_bounds(cols: Columns) -> bool:
    """What ``bounds_errors`` checks: known space, address >= 0, end within the memory."""
    space, addr, end = cols.acc_space, cols.acc_addr, cols.acc_end
    if (space < 0).any() or (addr < 0).any():
        return False
    limit = np.where(space == SPACE_CODES["sram"], cols.program.sram_bytes, cols.program.dram_bytes)
    return not (end > limit).any()


def any_race(cols: Columns) -> bool:
    """Whether ``find_races`` would find a race; assumes ``schedule_ok`` held.

    ``find_races`` pairs each instruction k (taken by start, then position)
    with every earlier one still running when k starts. With no overlap on a
    unit, the only one of a unit that can still run is the last slot of
    nonzero length sorted ahead of k there, so the pairs are one search per
    unit away; their accesses are then compared all at once.
    """
    n = cols.count
    start, end = cols.slot_start, cols.slot_end
    if n < 2:
        return False
    if int(start.max()) >= (1 << 62) // n:
        return True  # the sort key below would overflow: let the object path decide
    key = start * n + np.arange(n)  # the sweep's order: start, then position
    js, ks = [], []
    everyone = np.arange(n)
    for u in np.unique(cols.slot_unit_index).tolist():
        cand = np.flatnonzero((cols.slot_unit_index == u) & (end > start))
        if not len(cand):
            continue
        cand = cand[np.argsort(key[cand])]
        at = np.searchsorted(key[cand], key, side="left") - 1
        has = at >= 0
        j, k = cand[at[has]], everyone[has]
        running = end[j] > start[k]
        js.append(j[running])
        ks.append(k[running])
    if not js:
        return False
    return _conflicts(cols, np.concatenate(js), np.concatenate(ks))


def _conflicts(cols: Columns, j: np.ndarray, k: np.ndarray) -> bool:
    """Whether any pair (j, k) touches one range, at least one of the two accesses a write."""
    ptr = cols.acc_ptr
    cj, ck = ptr[j + 1] - ptr[j], ptr[k + 1] - ptr[k]
    per_pair = cj * ck
    total = int(per_pair.sum())
    if not total:
        return False
    pair = np.repeat(np.arange(len(j)), per_pair)
    local = np.arange(total) - np.repeat(np.cumsum(per_pair) - per_pair, per_pair)
    x = ptr[j][pair] + local // ck[pair]
    y = ptr[k][pair] + local % ck[pair]
    write = cols.acc_write
    hit = (
        (write[x] | write[y])
        & (cols.acc_space[x] == cols.acc_space[y])
        & (cols.acc_addr[x] < cols.acc_end[y])
        & (cols.acc_addr[y] < cols.acc_end[x])
    )
    return bool(hit.any())


def operands_bindable(cols: Columns) -> bool:
    """What binding checks (``bind_operands``/``operand_array``): known opcode, a memory
    destination, known operand kinds and dtypes, every view inside its memory."""
    sizes = {"sram": cols.program.sram_bytes, "dram": cols.program.dram_bytes}
    for t in cols.templates:
        if t.opcode not in OPCODES or t.dst is None or t.dst.kind == "imm":
            return False
        for k, op in enumerate((t.dst, *t.srcs)):
            try:
                NUMPY_DTYPES[op.dtype]
            except KeyError:
                return False
            if op.kind == "imm":
                continue
            if min(op.shape, default=0) < 0 or min(op.strides or (), default=0) < 0:
                return False
            if math.prod(op.shape) == 0:
                continue  # an empty view is a fresh array, touching no memory
            addrs = t.addrs[:, k]
            if (addrs < 0).any() or (addrs + extent(op) > sizes[op.kind]).any():
                return False
    return True
