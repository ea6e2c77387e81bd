"""Per-kernel schedule summary: makespan vs. lower bound, unit utilization, memory figures.

``summarize`` returns plain JSON data (ints, floats rounded to 6 digits,
strings, dicts) so ``summary.json`` is canonical; ``format_summary`` prints
the same numbers as an aligned text table for ``summary.txt``.
"""

from __future__ import annotations

import math

from kiln.ir.lir import ScheduledProgram
from kiln.ir.schedule_check import critical_path, kind_sort_key, unit_instances


def summarize(sp: ScheduledProgram, machine: dict) -> dict:
    """Counts, makespan, lower bound, utilization, SRAM peak and DRAM traffic of ``sp``.

    The lower bound is max(critical path, max over unit kinds of ceil(work / count)):
    no schedule on this machine can be shorter, so ``ratio`` >= 1 says how far off it is.
    """
    program = sp.program
    clock = machine.get("clock_mhz")
    units = unit_instances(program.units)
    counts = dict(program.units)
    kinds = sorted(counts, key=kind_sort_key)
    by_kind = dict.fromkeys(kinds, 0)
    work = dict.fromkeys(kinds, 0)
    by_unit = dict.fromkeys(units, 0)
    busy = dict.fromkeys(units, 0)
    dram_moved = 0
    for ins, slot in zip(program.instrs, sp.slots, strict=False):
        kind = ins.unit_kind
        by_kind[kind] = by_kind.get(kind, 0) + 1
        work[kind] = work.get(kind, 0) + ins.latency
        by_unit[slot.unit] = by_unit.get(slot.unit, 0) + 1
        busy[slot.unit] = busy.get(slot.unit, 0) + (slot.end - slot.start)
        if kind == "dma":
            dram_moved += ins.nbytes
    makespan = sp.makespan
    cp = critical_path(program)
    kind_bound = {k: math.ceil(work[k] / max(int(counts.get(k, 1)), 1)) for k in work}
    busiest = max(kind_bound, key=lambda k: (kind_bound[k], k), default=None)
    lower = max([cp, *kind_bound.values()])
    return {
        "kernel": program.kernel,
        "machine": machine.get("name", program.machine),
        "policy": sp.policy,
        "clock_mhz": clock,
        "instructions": {"total": len(program.instrs), "by_kind": by_kind, "by_unit": by_unit},
        "makespan_cycles": makespan,
        "makespan_us": _r(makespan / clock) if _is_clock(clock) else None,
        "critical_path_cycles": cp,
        "work_bound_cycles": kind_bound,
        "busiest_kind": busiest,
        "lower_bound_cycles": lower,
        "ratio": _r(makespan / lower) if lower else 1.0,
        "busy_cycles": busy,
        "utilization": {u: _r(b / makespan) if makespan else 0.0 for u, b in busy.items()},
        "sram": {
            "peak_bytes": program.sram_peak,
            "capacity_bytes": program.sram_bytes,
            "peak_fraction": _r(program.sram_peak / program.sram_bytes)
            if program.sram_bytes
            else 0.0,
        },
        "dram_bytes_moved": dram_moved,
    }


def _r(x: float) -> float:
    return round(x, 6)


def _is_clock(clock) -> bool:
    return isinstance(clock, int | float) and not isinstance(clock, bool) and clock > 0


def format_summary(d: dict) -> str:
    """``summarize``'s dict as an aligned, human-readable text table."""
    us = d.get("makespan_us")
    rows = [
        ("kernel", d["kernel"]),
        ("machine", f"{d['machine']} @ {d['clock_mhz']} MHz"),
        ("policy", d["policy"]),
        ("instructions", str(d["instructions"]["total"])),
        (
            "makespan",
            f"{d['makespan_cycles']} cycles" + (f" ({us:g} us)" if us is not None else ""),
        ),
        ("critical path", f"{d['critical_path_cycles']} cycles"),
        (
            "busiest kind",
            f"{d['busiest_kind']} ({d['work_bound_cycles'].get(d['busiest_kind'], 0)}"
            " cycles of work per unit)",
        ),
        ("lower bound", f"{d['lower_bound_cycles']} cycles"),
        ("ratio", f"{d['ratio']:.3f} (makespan / lower bound)"),
        (
            "SRAM peak",
            f"{d['sram']['peak_bytes']} of {d['sram']['capacity_bytes']} bytes "
            f"({100 * d['sram']['peak_fraction']:.1f}%)",
        ),
        ("DRAM moved", f"{d['dram_bytes_moved']} bytes"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines.append("")
    table = [("unit", "instrs", "busy cycles", "utilization")]
    for unit, util in d["utilization"].items():
        table.append(
            (
                unit,
                str(d["instructions"]["by_unit"].get(unit, 0)),
                str(d["busy_cycles"][unit]),
                f"{100 * util:.1f}%",
            )
        )
    widths = [max(len(r[c]) for r in table) for c in range(4)]
    for n, row in enumerate(table):
        cells = [row[0].ljust(widths[0])] + [row[c].rjust(widths[c]) for c in range(1, 4)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"
