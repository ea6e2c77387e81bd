"""`kiln view --compare OTHER`: two builds side by side, for code review.

Both out dirs are scanned the same way (``<kernel>/<shapes>/kernel.sched``),
so the other build need not come from this checkout: a CI artifact of the
main branch works. Per kernel instance: cycles and instruction counts
before/after with the change in percent, whether the binary's bytes
changed, and which instances were added or removed. This build's side is
what its pipeline declares: a leftover build of a removed shape set (or of
a JIT instance) is not "after".
"""

from __future__ import annotations

import hashlib
from pathlib import Path

SCHEDULE = "kernel.sched"
BINARY = "kernel.edf"


def scan(out_dir: Path) -> dict[str, dict]:
    """instance name (``kernel.shapes``) -> {cycles, instructions, binary sha256}."""
    from kiln.errors import KilnError
    from kiln.stages.schedule import read

    found = {}
    for sched in sorted(Path(out_dir).glob(f"*/*/{SCHEDULE}")):
        name = f"{sched.parent.parent.name}.{sched.parent.name}"
        entry: dict = {"cycles": None, "instructions": None, "binary": None}
        try:
            sp = read(sched)
            entry.update(cycles=sp.makespan, instructions=len(sp.program.instrs))
        except KilnError:
            pass
        binary = sched.with_name(BINARY)
        if binary.is_file():
            entry["binary"] = hashlib.sha256(binary.read_bytes()).hexdigest()
        found[name] = entry
    return found


def _change(before, after) -> float | None:
    if before is None or after is None or before == 0:
        return None
    return round(100.0 * (after - before) / before, 2)


def compare(current: Path, other: Path, declared: set[str], keep=None) -> dict:
    """The diff of two out dirs: ``other`` is "before", ``current`` is "after".

    Only the ``declared`` instances (this pipeline's selection) count as "after":
    a leftover build in ``current`` of an instance the pipeline no longer
    declares is "removed". ``keep(name)``, when given, says which instance names
    of ``other`` to compare (a selection).
    """
    now = {k: v for k, v in scan(current).items() if k in declared}
    then = scan(other)
    if keep is not None:
        then = {k: v for k, v in then.items() if keep(k)}
    rows = []
    for name in sorted(set(now) & set(then)):
        a, b = then[name], now[name]
        rows.append(
            {
                "name": name,
                "cycles_before": a["cycles"],
                "cycles_after": b["cycles"],
                "cycles_change": _change(a["cycles"], b["cycles"]),
                "instructions_before": a["instructions"],
                "instructions_after": b["instructions"],
                "instructions_change": _change(a["instructions"], b["instructions"]),
                "bytes_changed": a["binary"] != b["binary"],
            }
        )
    return {
        "before": str(other),
        "after": str(current),
        "rows": rows,
        "added": sorted(set(now) - set(then)),
        "removed": sorted(set(then) - set(now)),
    }


def format_compare(diff: dict) -> str:
    """The diff as a text table (what `kiln view --compare` prints)."""

    def pct(v):
        return "" if v is None else f"{v:+.1f}%"

    head = (
        "kernel",
        "cycles before",
        "after",
        "change",
        "instrs before",
        "after",
        "change",
        "bytes",
    )
    table = [head]
    for r in diff["rows"]:
        table.append(
            (
                r["name"],
                str(r["cycles_before"]),
                str(r["cycles_after"]),
                pct(r["cycles_change"]),
                str(r["instructions_before"]),
                str(r["instructions_after"]),
                pct(r["instructions_change"]),
                "changed" if r["bytes_changed"] else "same",
            )
        )
    widths = [max(len(row[c]) for row in table) for c in range(len(head))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in table
    ]
    lines += [f"added: {name}" for name in diff["added"]]
    lines += [f"removed: {name}" for name in diff["removed"]]
    changed = sum(r["bytes_changed"] for r in diff["rows"])
    lines.append(
        f"kiln: {len(diff['rows'])} kernels compared, {changed} with changed bytes, "
        f"{len(diff['added'])} added, {len(diff['removed'])} removed"
    )
    return "\n".join(lines) + "\n"
