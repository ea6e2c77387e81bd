"""Schedule quality: makespan / lower bound of every example kernel, critical-path vs in-order.

Each kernel of pipeline.yaml, at its first two shape sets (its two sizes,
e.g. small and large), is traced and compiled in this process by calling
the stage modules directly (trace -> visa -> lir), then scheduled
twice: with the ``critical-path`` policy and with the ``in-order``
baseline. The lower bound and the ratio are ``kiln.summary.summarize``'s,
so every figure matches what ``kiln compile K --dump-summary DIR`` writes.
Prints one row per kernel and shape set, then the geomean of each column.
Target: geomean of the critical-path ratio at most 1.10, printed with
``met`` or ``MISSED``, then ``targets: N met, M missed``. A kernel that fails
to compile is a missed target too; the exit status is 1 on any miss.

    python benchmarks/schedule_quality.py [--machine npu-v1|npu-tiny] [--quick | --all-shapes]

``--quick`` keeps only the first shape set of each kernel; ``--all-shapes``
takes every shape set (some kernels have more, for apps).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from kiln.stages import lir, schedule, trace, visa  # noqa: E402
from kiln.tasks.discovery import Discovery, KernelSource  # noqa: E402
from verdicts import Targets, abort  # noqa: E402

from kiln.errors import KilnError  # noqa: E402
from kiln.options import build_options  # noqa: E402
from kiln.pipeline import KernelSpec, Pipeline, load_pipeline  # noqa: E402
from kiln.summary import summarize  # noqa: E402

TARGET = 1.10
POLICIES = ("critical-path", "in-order")
HEADERS = ("kernel", "size", "instrs", "lower bound", "critical-path", "in-order")


def find_kernels(pipeline: Pipeline) -> dict[str, KernelSource]:
    """Kernel name -> its @device function, found by reading the packages (no cache written)."""
    found: dict[str, KernelSource] = {}
    for info in Discovery(pipeline.path.parent).scan_packages(pipeline.packages):
        for k in info.kernels:
            found.setdefault(k.name, k)
            found[k.path] = k
    missing = [s.name for s in pipeline.kernels if (s.function or s.name) not in found]
    if missing:
        abort(f"kernels not found in {', '.join(pipeline.packages)}: {missing}")
    return {s.name: found[s.function or s.name] for s in pipeline.kernels}


def compile_row(
    pipeline: Pipeline, spec: KernelSpec, source: KernelSource, size: str, machine: dict
) -> dict:
    """Trace, lower and schedule one kernel at one shape set under both policies."""
    request = trace.TraceRequest(
        module=source.module,
        function=source.name,
        bindings=tuple(spec.shape_set(size).items()),
        dtypes=tuple(sorted(spec.dtypes)),
        default_dtype=spec.dtype,
    )
    ir = trace.run(request, trace.Options(), machine)
    for module in (visa, lir):
        options = build_options(
            module.Options, pipeline.stage_options(spec, module.NAME), module.NAME
        )
        ir = module.run(ir, options, machine)
        module.verify(ir, machine)
    row = {"kernel": spec.name, "size": size}
    for policy in POLICIES:
        sp = schedule.run(ir, schedule.Options(policy=policy), machine)
        schedule.verify(sp, machine)
        summary = summarize(sp, machine)
        row["instrs"] = summary["instructions"]["total"]
        row["lower bound"] = summary["lower_bound_cycles"]
        row[policy] = summary["ratio"]
    return row


def geomean(values: list[float]) -> float:
    values = [v for v in values if v > 0]
    if not values:
        return float("nan")
    return math.exp(sum(math.log(v) for v in values) / len(values))


def format_table(rows: list[dict], failed: list[tuple[str, str]], targets: Targets) -> str:
    """Rows, the geomean line and the verdict, as aligned text."""
    cells = [list(HEADERS)]
    for r in rows:
        cells.append(
            [
                r["kernel"],
                r["size"],
                str(r["instrs"]),
                str(r["lower bound"]),
                f"{r['critical-path']:.3f}",
                f"{r['in-order']:.3f}",
            ]
        )
    means = {h: geomean([float(r[h]) for r in rows]) for h in HEADERS[2:]}
    cells.append(
        [
            "geomean",
            "",
            f"{means['instrs']:.0f}",
            f"{means['lower bound']:.0f}",
            f"{means['critical-path']:.3f}",
            f"{means['in-order']:.3f}",
        ]
    )
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADERS))]
    lines = []
    for n, row in enumerate(cells):
        if n == len(cells) - 1:
            lines.append("  ".join("-" * w for w in widths))
        lines.append(
            "  ".join(
                c.ljust(w) if i < 2 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    for name, why in failed:
        lines.append(f"{name}: not compiled: {why}")
        targets.judge(f"{name} compiles", False)
    cp = means["critical-path"]
    verdict = targets.judge("geomean critical-path ratio", cp <= TARGET)
    lines.append("")
    lines.append(
        f"geomean makespan / lower bound: critical-path {cp:.3f} (target <= {TARGET:.2f}: "
        f"{verdict}), in-order {means['in-order']:.3f}"
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machine", default="npu-v1", help="machine model of pipeline.yaml")
    parser.add_argument("--pipeline", type=Path, default=REPO / "pipeline.yaml")
    sets = parser.add_mutually_exclusive_group()
    sets.add_argument("--quick", action="store_true", help="first shape set of each kernel only")
    sets.add_argument("--all-shapes", action="store_true", help="every shape set of each kernel")
    args = parser.parse_args(argv)

    pipeline = load_pipeline(args.pipeline)
    if str(pipeline.path.parent) not in sys.path:
        sys.path.insert(0, str(pipeline.path.parent))
    if args.machine not in pipeline.machines:
        parser.error(
            f"unknown machine {args.machine!r}; pipeline has: {', '.join(pipeline.machines)}"
        )
    machine = {"name": args.machine, **pipeline.machines[args.machine]}
    sources = find_kernels(pipeline)

    print(
        f"schedule quality on {args.machine}: makespan / lower bound "
        f"(lower bound = max(critical path, busiest unit kind's work / count))"
    )
    start = time.perf_counter()
    rows, failed = [], []
    for spec in pipeline.kernels:
        sizes = spec.shape_set_names[: 1 if args.quick else None if args.all_shapes else 2]
        for size in sizes:
            try:
                rows.append(compile_row(pipeline, spec, sources[spec.name], size, machine))
            except KilnError as err:
                failed.append((f"{spec.name}.{size}", err.message))
    if not rows:
        abort("no kernel instance compiled: " + "; ".join(f"{n}: {why}" for n, why in failed))
    targets = Targets()
    print(format_table(rows, failed, targets), end="")
    print(f"({len(rows)} kernel instances compiled in {time.perf_counter() - start:.1f} s)")
    return targets.finish()


if __name__ == "__main__":
    sys.exit(main())
