"""Schedule rules shared by the schedule stage's verify, the EDF stage and the simulator.

``check_schedule`` returns every broken rule as a ``Violation`` instead of
raising, so each caller decides how to report it. The dependency helpers
(``dependency_index``, ``bottom_levels``) are the graph view the scheduler
and the summary use; ``random_program`` makes deterministic random DAG
programs for tests and benchmarks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from kiln.ir.lir import (
    DEP_KINDS,
    Access,
    ArgSlot,
    Dep,
    Instr,
    Program,
    ScheduledProgram,
    unit_kind,
)

KIND_ORDER = ("dma", "tensor", "vector")  # display order; other kinds follow by name

RULES = {
    "slot-count": "one slot per instruction",
    "slot-order": "slot k belongs to instruction k (slots are indexed like instrs)",
    "unit-exists": "a slot's unit is an instance the machine has",
    "unit-kind": "a slot's unit has the instruction's unit kind",
    "latency": "end - start equals the instruction's latency",
    "start": "a slot starts at cycle 0 or later",
    "dep-exists": "a dependency names an instruction of the program",
    "dep-order": "an instruction starts at or after each dependency's end",
    "unit-overlap": "no two slots overlap in time on one unit instance",
}


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken schedule rule, about one instruction (id, or -1 for the whole schedule)."""

    rule: str
    instr: int
    detail: str

    def describe(self, program: Program | None = None) -> str:
        """``instruction 7 (`text`): detail [rule: dep-order]``."""
        who = "schedule" if self.instr < 0 else f"instruction {self.instr}"
        if program is not None and self.instr >= 0:
            text = instr_text(program, self.instr)
            if text:
                who += f" (`{text}`)"
        return f"{who}: {self.detail} [rule {self.rule}: {RULES.get(self.rule, '')}]"


def instr_text(program: Program, ident: int) -> str:
    """The instruction's text, or ``opcode unit`` when it has none ('' if unknown)."""
    for ins in _lookup(program, ident):
        return ins.text or f"{ins.opcode} {ins.unit}"
    return ""


def _lookup(program: Program, ident: int) -> list[Instr]:
    instrs = program.instrs
    if 0 <= ident < len(instrs) and instrs[ident].id == ident:
        return [instrs[ident]]
    return [i for i in instrs if i.id == ident][:1]


def unit_instances(units: tuple[tuple[str, int], ...] | list) -> list[str]:
    """Instance names in display order: dma0, dma1, tensor0, vector0, vector1, then others."""
    kinds = sorted((k for k, _ in units), key=kind_sort_key)
    counts = dict(units)
    return [f"{kind}{i}" for kind in kinds for i in range(int(counts[kind]))]


def kind_sort_key(kind: str) -> tuple[int, str]:
    return (KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER), kind)


def dependency_index(program: Program) -> tuple[list[list[int]], bool]:
    """Predecessor index lists (by position in ``program.instrs``) and whether deps point back.

    Raises ValueError naming the instruction when a dependency names no instruction.
    The bool is True when every dependency points to an earlier position, so
    program order is a topological order.
    """
    table = program.table
    if not table.dense:
        return _dependency_index_by_id(program)
    n = len(table)
    src = table.d_src
    owner = np.repeat(np.arange(n), np.diff(table.d_off))
    outside = (src < 0) | (src >= n)
    if outside.any():
        first = int(np.argmax(outside))
        ident = int(table.ids[owner[first]])
        raise ValueError(f"instruction {ident} depends on unknown instruction {int(src[first])}")
    srcs, off = src.tolist(), table.d_off.tolist()
    preds = [srcs[off[k] : off[k + 1]] for k in range(n)]
    return preds, bool((src < owner).all())


def _dependency_index_by_id(program: Program) -> tuple[list[list[int]], bool]:
    """``dependency_index`` when ids are not positions (hand-made programs)."""
    instrs = program.instrs
    index = {ins.id: k for k, ins in enumerate(instrs)}
    preds: list[list[int]] = []
    backward = True
    for k, ins in enumerate(instrs):
        if not ins.deps:
            preds.append([])
            continue
        try:
            p = [index[d.src] for d in ins.deps]
        except KeyError as exc:
            raise ValueError(
                f"instruction {ins.id} depends on unknown instruction {exc.args[0]}"
            ) from None
        if max(p) >= k:
            backward = False
        preds.append(p)
    return preds, backward


def topological_order(preds: list[list[int]], backward: bool) -> list[int]:
    """Positions in dependency order; ValueError naming a position on a cycle."""
    n = len(preds)
    if backward:
        return list(range(n))
    succs: list[list[int]] = [[] for _ in range(n)]
    indeg = [len(p) for p in preds]
    for k, p in enumerate(preds):
        for s in p:
            succs[s].append(k)
    order = [k for k in range(n) if indeg[k] == 0]
    for k in order:  # grows while iterating (Kahn)
        for s in succs[k]:
            indeg[s] -= 1
            if indeg[s] == 0:
                order.append(s)
    if len(order) != n:
        stuck = min(k for k in range(n) if indeg[k] > 0)
        raise ValueError(f"dependency cycle through instruction at position {stuck}")
    return order


def bottom_levels(program: Program, preds=None, order=None) -> list[int]:
    """Per position: the longest latency-weighted path from the instruction to a sink."""
    if preds is None:
        preds, backward = dependency_index(program)
        order = topological_order(preds, backward)
    lat = program.table.latency.tolist()
    best = [0] * len(lat)  # longest bottom level among successors
    bl = [0] * len(lat)
    for k in reversed(order):
        b = lat[k] + best[k]
        bl[k] = b
        for p in preds[k]:
            if best[p] < b:
                best[p] = b
    return bl


def critical_path(program: Program) -> int:
    """Length in cycles of the longest dependency chain (0 for an empty program)."""
    return max(bottom_levels(program), default=0)


def check_schedule(sp: ScheduledProgram) -> list[Violation]:
    """Every broken rule of ``sp`` (empty when the schedule is valid), in instruction order."""
    if _valid_at_a_glance(sp):
        return []
    program, slots = sp.program, sp.slots
    instrs = program.instrs
    out: list[Violation] = []
    if len(slots) != len(instrs):
        out.append(
            Violation("slot-count", -1, f"{len(slots)} slots for {len(instrs)} instructions")
        )
    known = set(unit_instances(program.units))
    by_id = {ins.id: ins for ins in instrs}
    slot_of = {}
    for k, ins in enumerate(instrs):
        if k >= len(slots):
            out.append(Violation("slot-count", ins.id, "has no slot"))
            continue
        s = slots[k]
        if s.instr != ins.id:
            out.append(Violation("slot-order", ins.id, f"slot {k} is for instruction {s.instr}"))
            continue
        slot_of[ins.id] = s
        if s.unit not in known:
            out.append(
                Violation(
                    "unit-exists",
                    ins.id,
                    f"runs on {s.unit!r}, not a unit of the machine ({', '.join(sorted(known))})",
                )
            )
        elif s.unit.rstrip("0123456789") != ins.unit_kind:
            out.append(
                Violation("unit-kind", ins.id, f"is a {ins.unit_kind} instruction on {s.unit}")
            )
        if s.end - s.start != ins.latency:
            out.append(
                Violation(
                    "latency",
                    ins.id,
                    f"slot [{s.start}, {s.end}) lasts {s.end - s.start} cycles, "
                    f"latency is {ins.latency}",
                )
            )
        if s.start < 0:
            out.append(Violation("start", ins.id, f"starts at cycle {s.start}"))
    for ins in instrs:
        s = slot_of.get(ins.id)
        if s is None:
            continue
        for d in ins.deps:
            if d.src not in by_id:
                out.append(
                    Violation("dep-exists", ins.id, f"depends on unknown instruction {d.src}")
                )
                continue
            ds = slot_of.get(d.src)
            if ds is not None and s.start < ds.end:
                out.append(
                    Violation(
                        "dep-order",
                        ins.id,
                        f"starts at cycle {s.start}, before its {d.kind} dependency "
                        f"{d.src} ends at cycle {ds.end}",
                    )
                )
    out.extend(_overlaps(slot_of.values()))
    return out


def _valid_at_a_glance(sp: ScheduledProgram) -> bool:
    """True when ``check_schedule`` would find nothing, judged over columns at once.

    False only means "look closer": the per-instruction rules then run and name
    each violation. Hand-made programs whose ids are not positions always look closer.
    """
    table, slots = sp.program.table, sp.slot_table
    n = len(table)
    if len(slots) != n or not table.dense or not np.array_equal(slots.instr, table.ids):
        return False
    if n == 0:
        return True
    known = set(unit_instances(sp.program.units))
    kinds = [unit_kind(u) for u in table.unit_names]
    # per (slot unit, instruction unit) pair: the slot's unit exists and has the right kind
    ok = np.array(
        [[u in known and unit_kind(u) == k for k in kinds] for u in slots.unit_names],
        dtype=bool,
    ).reshape(len(slots.unit_names), len(kinds))
    start, end = slots.start, slots.end
    if not ok[slots.unit, table.unit].all() or (start < 0).any():
        return False
    if not np.array_equal(end - start, table.latency) or (end < start).any():
        return False
    src = table.d_src
    if len(src):
        owner = np.repeat(np.arange(n), np.diff(table.d_off))
        if ((src < 0) | (src >= n)).any() or (start[owner] < end[src]).any():
            return False
    # one unit's slots sorted by start: each starts at or after the furthest end before it
    order = np.lexsort((slots.instr, end, start, slots.unit))
    unit = slots.unit[order]
    span = int(end.max()) + 1
    shifted_end = end[order] + unit.astype(np.int64) * span  # keeps units apart in one scan
    reach = np.maximum.accumulate(shifted_end)
    shifted_start = start[order] + unit.astype(np.int64) * span
    return not (shifted_start[1:] < reach[:-1]).any()


def _overlaps(slots) -> list[Violation]:
    per_unit: dict[str, list] = {}
    for s in slots:
        per_unit.setdefault(s.unit, []).append(s)
    out = []
    for unit in sorted(per_unit):
        busy = None  # the slot reaching furthest so far
        for s in sorted(per_unit[unit], key=lambda s: (s.start, s.end, s.instr)):
            if busy is not None and s.start < busy.end:
                out.append(
                    Violation(
                        "unit-overlap",
                        s.instr,
                        f"[{s.start}, {s.end}) on {unit} overlaps instruction "
                        f"{busy.instr} [{busy.start}, {busy.end})",
                    )
                )
            if busy is None or s.end > busy.end:
                busy = s
    return out


_OPCODES = {"dma": ("load", "store"), "tensor": ("matmul",), "vector": ("add", "exp", "max")}


def random_program(
    seed: int,
    n: int = 50,
    units: tuple[tuple[str, int], ...] = (("dma", 2), ("tensor", 1), ("vector", 2)),
    max_deps: int = 3,
    window: int = 16,
    max_latency: int = 40,
    kernel: str = "random",
) -> Program:
    """A random DAG program, the same for the same arguments (deps point to earlier ids)."""
    rng = random.Random(seed)
    units = tuple(sorted(units))
    kinds = [k for k, _ in units]
    counts = dict(units)
    instrs = []
    for i in range(n):
        kind = rng.choice(kinds)
        unit = f"{kind}{rng.randrange(counts[kind])}"
        opcode = rng.choice(_OPCODES.get(kind, ("op",)))
        latency = 0 if rng.random() < 0.02 else rng.randint(1, max_latency)
        lo = max(0, i - window)
        srcs = sorted(rng.sample(range(lo, i), min(i - lo, rng.randint(0, max_deps))))
        deps = tuple(Dep(s, rng.choice(DEP_KINDS)) for s in srcs)
        nbytes = 64 * rng.randint(1, 64)
        addr = 64 * rng.randrange(1024)
        space = "dram" if opcode == "load" else "sram"
        reads = (Access(space, addr, nbytes),)
        writes = (
            Access("dram" if opcode == "store" else "sram", 64 * rng.randrange(1024), nbytes),
        )
        args = (("tile", (32, 32)),) if kind == "tensor" else ()
        text = f"{opcode}.{unit} #{i} {nbytes}B"
        instrs.append(Instr(i, unit, opcode, reads, writes, nbytes, latency, deps, args, text))
    args = (
        ArgSlot("a", "input", (64, 64), "f32", 0, 16384),
        ArgSlot("b", "input", (64,), "f32", 16384, 256),
        ArgSlot("out", "output", (64, 64), "f32", 16640, 16384),
    )
    return Program(
        kernel=kernel,
        machine="random-machine",
        units=units,
        args=args,
        instrs=tuple(instrs),
        sram_bytes=1 << 20,
        sram_peak=64 * 1024,
        dram_bytes=33024,
    )
