"""A schedule as the page's timeline draws it: lanes, bars, dependencies, critical path.

Columns, not records: one list per field (unit lane, kind, start, end,
opcode...), so 100k instructions stay small once compressed (see html.py).
"""

from __future__ import annotations

from kiln.ir.lir import ScheduledProgram
from kiln.ir.schedule_check import kind_sort_key, unit_instances

# the timeline's colour per unit kind (others get the fallback)
KIND_COLOURS = {"dma": "#4e79a7", "tensor": "#e15759", "vector": "#59a14f"}
FALLBACK_COLOUR = "#9c755f"


def schedule_payload(sp: ScheduledProgram, nodes: list[int] | None = None) -> dict:
    """The timeline of ``sp``; ``nodes[i]`` is the graph node instruction i came from."""
    program = sp.program
    lanes = unit_instances(program.units)
    for slot in sp.slots:  # a unit the machine model does not list still gets a lane
        if slot.unit not in lanes:
            lanes.append(slot.unit)
    lane_of = {u: n for n, u in enumerate(lanes)}
    kinds = sorted({i.unit_kind for i in program.instrs}, key=kind_sort_key)
    kind_of = {k: n for n, k in enumerate(kinds)}
    opcodes = sorted({i.opcode for i in program.instrs})
    opcode_of = {o: n for n, o in enumerate(opcodes)}
    slots = sorted(sp.slots, key=lambda s: s.instr)
    instrs = program.instrs
    dep_offsets = [0]
    dep_list: list[int] = []
    for ins in instrs:
        dep_list.extend(d.src for d in ins.deps)
        dep_offsets.append(len(dep_list))
    busy = [0] * len(lanes)
    for s in slots:
        busy[lane_of[s.unit]] += s.end - s.start
    makespan = sp.makespan
    return {
        "kernel": program.kernel,
        "makespan": makespan,
        "lanes": lanes,
        "utilization": [round(b / makespan, 4) if makespan else 0.0 for b in busy],
        "kinds": kinds,
        "colours": [KIND_COLOURS.get(k, FALLBACK_COLOUR) for k in kinds],
        "opcodes": opcodes,
        "lane": [lane_of[s.unit] for s in slots],
        "kind": [kind_of[i.unit_kind] for i in instrs],
        "opcode": [opcode_of[i.opcode] for i in instrs],
        "start": [s.start for s in slots],
        "end": [s.end for s in slots],
        "text": [i.text or f"{i.opcode} {i.unit}" for i in instrs],
        "dep_offsets": dep_offsets,
        "deps": dep_list,
        "node": list(nodes) if nodes is not None and len(nodes) == len(instrs) else [],
        "critical": schedule_critical_path(sp),
    }


def schedule_critical_path(sp: ScheduledProgram) -> list[int]:
    """The chain of instructions that decides the makespan, first to last.

    From the instruction that ends last, step to whatever made it start
    when it did: the latest-ending of its dependencies and of the
    instruction before it on the same unit. Any delay on this chain delays
    the whole kernel.
    """
    slots = {s.instr: s for s in sp.slots}
    if not slots:
        return []
    before_on_unit: dict[int, int] = {}
    by_unit: dict[str, list] = {}
    for s in sp.slots:
        by_unit.setdefault(s.unit, []).append(s)
    for unit_slots in by_unit.values():
        unit_slots.sort(key=lambda s: (s.start, s.instr))
        for prev, cur in zip(unit_slots, unit_slots[1:], strict=False):
            before_on_unit[cur.instr] = prev.instr
    deps = {i.id: [d.src for d in i.deps] for i in sp.program.instrs}
    current = max(slots.values(), key=lambda s: (s.end, -s.instr)).instr
    path = [current]
    while True:
        start = slots[current].start
        candidates = [d for d in deps.get(current, []) if d in slots]
        if current in before_on_unit:
            candidates.append(before_on_unit[current])
        waited = [c for c in candidates if slots[c].end <= start]
        if not waited or start == 0:
            break
        current = max(waited, key=lambda c: (slots[c].end, -c))
        path.append(current)
    path.reverse()
    return path
