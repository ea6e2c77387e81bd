"""Schedule quality: makespan / lower bound and makespan / optimum of every example kernel.

Each kernel of pipeline.yaml, at its first two shape sets (its two sizes,
e.g. small and large), is traced and compiled in this process by calling
the stage modules directly (trace -> visa -> lir), then scheduled twice:
with the ``critical-path`` policy and with the ``in-order`` baseline. The
lower bound and the ratio are ``kiln.summary.summarize``'s, so every figure
matches what ``kiln compile K --dump-summary DIR`` writes.

The optimum: OR-Tools CP-SAT (the ``[bench]`` extra) solves the problem the
scheduler solves (see ``optimum``) for every instance of at most
``--max-instrs`` instructions, within ``--time-limit`` seconds each. Where
it does not prove optimality in time, the row shows its best bound
(``>=``) and the ratio to it (``<=``, an upper estimate of the true ratio).

Targets: makespan / optimum of critical-path, geomean at most 1.03 and
worst at most 1.10; makespan / lower bound, geomean at most 1.10. Each is
printed with ``met`` or ``MISSED``, then ``targets: N met, M missed``. The
optimum's targets say ``not judged`` without OR-Tools, and when an unproven
instance leaves the figure an upper estimate above its target (an estimate
within it is ``met``: the true ratio is lower still). A kernel that fails to
compile is a missed target; the exit status is 1 on any miss.

    python benchmarks/schedule_quality.py [--machine npu-v1|npu-tiny] [--quick | --all-shapes]
        [--time-limit 10] [--max-instrs 1000] [--workers 8]

``--quick`` keeps only the first shape set of each kernel; ``--all-shapes``
takes every shape set (some kernels have more, for apps).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from verdicts import Targets, abort  # noqa: E402

from kiln.errors import KilnError  # noqa: E402
from kiln.ir.lir import Program, ScheduledProgram  # noqa: E402
from kiln.ir.schedule_check import dependency_index  # noqa: E402
from kiln.options import build_options  # noqa: E402
from kiln.pipeline import KernelSpec, Pipeline, load_pipeline  # noqa: E402
from kiln.stages import lir, schedule, trace, visa  # noqa: E402
from kiln.summary import summarize  # noqa: E402
from kiln.tasks.model.discovery import Discovery, KernelSource  # noqa: E402

try:
    from ortools.sat.python import cp_model
except ImportError:  # the [bench] extra is not installed: the optimum is not judged
    cp_model = None

LOWER_TARGET = 1.10  # geomean makespan / lower bound, critical-path
OPT_GEOMEAN_TARGET = 1.03  # makespan / optimum, critical-path
OPT_WORST_TARGET = 1.10
POLICIES = ("critical-path", "in-order")
HEADERS = (
    "kernel",
    "size",
    "instrs",
    "lower bound",
    "critical-path",
    "in-order",
    "optimum",
    "opt / lb",
    "cp / opt",
    "solve s",
)


@dataclass(frozen=True)
class Optimum:
    """CP-SAT's answer for one program: best makespan found, best bound, proven or not."""

    makespan: int
    bound: int
    proven: bool
    wall_s: float
    cpu_s: float


def optimum(sp: ScheduledProgram, lower: int, time_limit: float, workers: int) -> Optimum:
    """The shortest makespan of ``sp.program`` on its machine, by CP-SAT.

    The model is the list scheduler's problem: every instruction runs for its
    latency on one instance of its unit kind (instances of a kind are alike,
    so a kind is a resource of capacity = its count: cumulative, or no-overlap
    for one unit) and starts at or after the end of each dependency, whatever
    its kind (raw, war, waw). The heuristic's schedule is the first solution
    (a hint, and the horizon); ``lower`` bounds the makespan from below. A
    zero-latency instruction takes no unit time in the model (CP-SAT ignores
    empty intervals), which can only lower the optimum.
    """
    program = sp.program
    preds, _ = dependency_index(program)
    lat = program.table.latency.tolist()
    kinds = [i.unit_kind for i in program.instrs]
    horizon = sp.makespan
    m = cp_model.CpModel()
    start = [m.new_int_var(0, horizon - d, f"s{k}") for k, d in enumerate(lat)]
    per_kind: dict[str, list] = {}
    for k, d in enumerate(lat):
        per_kind.setdefault(kinds[k], []).append(m.new_fixed_size_interval_var(start[k], d, ""))
    has_succ = [False] * len(lat)
    for k, ps in enumerate(preds):
        for j in set(ps):
            m.add(start[k] >= start[j] + lat[j])
            has_succ[j] = True
    for kind, intervals in per_kind.items():
        count = int(dict(program.units)[kind])
        if count == 1:
            m.add_no_overlap(intervals)
        else:
            m.add_cumulative(intervals, [1] * len(intervals), count)
    makespan = m.new_int_var(min(lower, horizon), horizon, "makespan")
    for k, d in enumerate(lat):
        if not has_succ[k]:
            m.add(makespan >= start[k] + d)
    m.minimize(makespan)
    for k, slot in enumerate(sp.slots):
        m.add_hint(start[k], slot.start)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = 0
    wall, cpu = time.perf_counter(), time.process_time()
    status = solver.solve(m)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):  # no solution: the hint stands
        return Optimum(horizon, min(lower, horizon), False, wall, cpu)
    best = int(solver.objective_value)
    return Optimum(best, int(solver.best_objective_bound), status == cp_model.OPTIMAL, wall, cpu)


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
) -> tuple[dict, ScheduledProgram]:
    """Trace, lower and schedule one kernel at one shape set under both policies.

    Returns the row's figures and the critical-path schedule.
    """
    request = trace.TraceRequest(
        module=source.module,
        function=source.name,
        bindings=tuple(spec.shape_set(size).items()),
        dtypes=tuple(sorted(spec.dtypes)),
        default_dtype=spec.dtype,
    )
    ir: Program = trace.run(request, trace.Options(), machine)
    for module in (visa, lir):
        options = build_options(
            module.Options, pipeline.stage_options(spec, module.NAME), module.NAME
        )
        ir = module.run(ir, options, machine)
        module.verify(ir, machine)
    row: dict = {"kernel": spec.name, "size": size}
    best = None
    for policy in POLICIES:
        sp = schedule.run(ir, schedule.Options(policy=policy), machine)
        schedule.verify(sp, machine)
        summary = summarize(sp, machine)
        row["instrs"] = summary["instructions"]["total"]
        row["lower bound"] = summary["lower_bound_cycles"]
        row[policy] = summary["ratio"]
        row[policy + " cycles"] = sp.makespan
        best = best or sp
    return row, best


def add_optimum(row: dict, sp: ScheduledProgram, args: argparse.Namespace) -> None:
    """Solve ``sp``'s program to optimality when it is small enough; the row's optimum columns."""
    if cp_model is None or row["instrs"] > args.max_instrs:
        return
    opt = optimum(sp, row["lower bound"], args.time_limit, args.workers)
    row["optimum"] = opt
    lower = row["lower bound"] or 1
    # a bound only: opt / lb is at least this, cp / opt at most that
    row["opt / lb"] = (opt.makespan if opt.proven else opt.bound) / lower
    row["cp / opt"] = row["critical-path cycles"] / max(
        opt.makespan if opt.proven else opt.bound, 1
    )


def geomean(values: list[float]) -> float:
    values = [v for v in values if v > 0]
    if not values:
        return float("nan")
    return math.exp(sum(math.log(v) for v in values) / len(values))


def cells_of(r: dict) -> list[str]:
    opt = r.get("optimum")
    exact = opt is None or opt.proven
    return [
        r["kernel"],
        r["size"],
        str(r["instrs"]),
        str(r["lower bound"]),
        f"{r['critical-path']:.3f}",
        f"{r['in-order']:.3f}",
        "-" if opt is None else str(opt.makespan) if opt.proven else f">={opt.bound}",
        "-" if opt is None else f"{'' if exact else '>='}{r['opt / lb']:.3f}",
        "-" if opt is None else f"{'' if exact else '<='}{r['cp / opt']:.3f}",
        "-" if opt is None else f"{opt.wall_s:.2f}",
    ]


def format_table(rows: list[dict], failed: list[tuple[str, str]]) -> str:
    """Rows, the geomean line and the worst line, as aligned text."""
    cells = [list(HEADERS), *(cells_of(r) for r in rows)]
    solved = [r for r in rows if "optimum" in r]
    exact = all(r["optimum"].proven for r in solved)
    mean = {h: geomean([float(r[h]) for r in rows]) for h in HEADERS[2:6]}
    for h in ("opt / lb", "cp / opt"):
        mean[h] = geomean([r[h] for r in solved])
    mark = "" if exact else "<="
    ratio = "-" if not solved else f"{mark}{mean['cp / opt']:.3f}"
    cells.append(["geomean", "", f"{mean['instrs']:.0f}", f"{mean['lower bound']:.0f}"])
    cells[-1] += [f"{mean['critical-path']:.3f}", f"{mean['in-order']:.3f}", "", "", ratio, ""]
    worst = max(solved, key=lambda r: r["cp / opt"], default=None)
    cells.append(["worst", "", "", "", f"{max(r['critical-path'] for r in rows):.3f}"])
    cells[-1] += [f"{max(r['in-order'] for r in rows):.3f}", "", ""]
    cells[-1] += ["-" if worst is None else cells_of(worst)[8], ""]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADERS))]
    rule = "  ".join("-" * w for w in widths)
    lines = []
    for n, row in enumerate(cells):
        if n == len(cells) - 2:
            lines.append(rule)
        text = "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        lines.append(text.rstrip())
        if n == 0:
            lines.append(rule)
    lines.extend(f"{name}: not compiled: {why}" for name, why in failed)
    return "\n".join(lines) + "\n"


def verdicts(rows: list[dict], failed: list, args: argparse.Namespace, targets: Targets) -> str:
    """The judged lines: the lower-bound geomean, then the optimum's geomean and worst."""
    for name, _ in failed:
        targets.judge(f"{name} compiles", False)
    cp = geomean([float(r["critical-path"]) for r in rows])
    io = geomean([float(r["in-order"]) for r in rows])
    word = targets.judge("geomean critical-path / lower bound", cp <= LOWER_TARGET)
    lines = [
        "",
        f"geomean makespan / lower bound: critical-path {cp:.3f} (target <= {LOWER_TARGET:.2f}: "
        f"{word}), in-order {io:.3f}",
    ]
    solved = [r for r in rows if "optimum" in r]
    if cp_model is None or not solved:
        why = (
            "OR-Tools not installed: pip install -e '.[bench]'"
            if cp_model is None
            else (f"no instance of at most {args.max_instrs} instructions")
        )
        targets.judge("geomean critical-path / optimum", None)
        targets.judge("worst critical-path / optimum", None)
        lines.append(f"makespan / optimum, critical-path: not judged ({why})")
        return "\n".join(lines) + "\n"
    exact = all(r["optimum"].proven for r in solved)
    mean = geomean([r["cp / opt"] for r in solved])
    worst = max(solved, key=lambda r: r["cp / opt"])
    # the largest estimate is exact when proven: every other true ratio is below it
    worst_exact = worst["optimum"].proven

    def judge(label: str, value: float, target: float, exact: bool) -> str:
        if value <= target:  # exact, or an upper estimate: the true ratio is lower still
            return targets.judge(label, True)
        return targets.judge(label, False if exact else None)

    w1 = judge("geomean critical-path / optimum", mean, OPT_GEOMEAN_TARGET, exact)
    w2 = judge("worst critical-path / optimum", worst["cp / opt"], OPT_WORST_TARGET, worst_exact)
    lines.append(
        f"makespan / optimum, critical-path: geomean {'' if exact else '<='}{mean:.3f} "
        f"(target <= {OPT_GEOMEAN_TARGET:.2f}: {w1}), worst {'' if worst_exact else '<='}"
        f"{worst['cp / opt']:.3f} ({worst['kernel']} {worst['size']}) "
        f"(target <= {OPT_WORST_TARGET:.2f}: {w2})"
    )
    proven = sum(r["optimum"].proven for r in solved)
    lines.append(
        f"optimum: CP-SAT {cp_model_version()}, {args.workers} workers, {args.time_limit:g} s "
        f"limit each: {proven} of {len(solved)} proven optimal"
        + (
            ""
            if exact
            else " (unproven: "
            + ", ".join(
                f"{r['kernel']} {r['size']} >= {r['optimum'].bound}"
                for r in solved
                if not r["optimum"].proven
            )
            + ")"
        )
        + (
            f"; {len(rows) - len(solved)} over {args.max_instrs} instructions not solved"
            if len(solved) < len(rows)
            else ""
        )
    )
    return "\n".join(lines) + "\n"


def cp_model_version() -> str:
    import ortools

    return ortools.__version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machine", default="npu-v1", help="machine model of pipeline.yaml")
    parser.add_argument("--pipeline", type=Path, default=REPO / "pipeline.yaml")
    sets = parser.add_mutually_exclusive_group()
    sets.add_argument("--quick", action="store_true", help="first shape set of each kernel only")
    sets.add_argument("--all-shapes", action="store_true", help="every shape set of each kernel")
    parser.add_argument("--time-limit", type=float, default=10.0, help="CP-SAT seconds each")
    parser.add_argument("--max-instrs", type=int, default=1000, help="largest instance solved")
    parser.add_argument("--workers", type=int, default=8, help="CP-SAT search workers")
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
        f"schedule quality on {args.machine}: makespan / lower bound (lower bound = max(critical "
        "path, busiest unit kind's work / count)) and makespan / optimum (OR-Tools CP-SAT)"
    )
    wall, cpu = time.perf_counter(), time.process_time()
    rows, failed, schedules = [], [], []
    for spec in pipeline.kernels:
        sizes = spec.shape_set_names[: 1 if args.quick else None if args.all_shapes else 2]
        for size in sizes:
            try:
                row, sp = compile_row(pipeline, spec, sources[spec.name], size, machine)
            except KilnError as err:
                failed.append((f"{spec.name}.{size}", err.message))
                continue
            rows.append(row)
            schedules.append(sp)
    if not rows:
        abort("no kernel instance compiled: " + "; ".join(f"{n}: {why}" for n, why in failed))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    for row, sp in zip(rows, schedules, strict=True):
        add_optimum(row, sp, args)
    targets = Targets()
    print(format_table(rows, failed), end="")
    print(verdicts(rows, failed, args, targets), end="")
    solved = [r["optimum"] for r in rows if "optimum" in r]
    print(
        f"({len(rows)} kernel instances compiled and scheduled in {wall:.1f} s, cpu {cpu:.1f} s"
        + (
            f"; CP-SAT {sum(o.wall_s for o in solved):.1f} s, "
            f"cpu {sum(o.cpu_s for o in solved):.1f} s)"
            if solved
            else ")"
        )
    )
    return targets.finish()


if __name__ == "__main__":
    sys.exit(main())
