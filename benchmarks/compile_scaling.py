"""Compile scaling: per-stage time and LIR instruction count of gemm as it grows.

gemm (f32, M = N = K) at 256, 512 and 1024 on npu-v1, compiled in this
process by calling the stage modules directly. A stage's time is what its
build task does short of writing the file: ``run`` + ``verify`` +
``serialize`` (so "edf" includes encoding the binary), in wall seconds;
"(cpu)" is the process CPU time of the whole compile, which is close to
"total" unless the machine is busy. Each point is the median of
``--repeat`` runs.

Two series are printed:

- ``default tiles``: the visa options of pipeline.yaml. Tiles are 128x128x128,
  so gemm 1024 has only ~1,600 LIR instructions and fixed per-stage costs
  dominate the small sizes. The full-pipeline target is judged here:
  gemm 1024 under 3 s (this is what `doit compile` builds).
- ``small tiles``: visa tile_m = tile_n = tile_k = 32 (``--small-tile``), so
  every size has thousands of instructions (1,600 / 12,544 / 99,328). The
  scaling target is judged here: time per LIR instruction, max / min
  across sizes, at most 1.5x.

Both figures are printed for both series; each target is judged on its
own series (``met`` or ``MISSED``), then ``targets: N met, M missed``. The
exit status is 1 when a target is missed.

    python benchmarks/compile_scaling.py [--repeat 3] [--small-tile 32] [--quick]

``--quick`` runs gemm at 64 and 128 with one run per point (a smoke test).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from kiln.stages import edf, lir, schedule, trace, visa  # noqa: E402
from verdicts import Targets  # noqa: E402

from kiln.options import build_options  # noqa: E402
from kiln.pipeline import load_pipeline  # noqa: E402

STAGES = (trace, visa, lir, schedule, edf)
SIZES = (256, 512, 1024)
QUICK_SIZES = (64, 128)
RATIO_TARGET = 1.5
FULL_TARGET_S = 3.0
MACHINE = "npu-v1"


def compile_once(n: int, stage_options: dict[str, dict], machine: dict):
    """One gemm n^3 compile: wall seconds per stage (run + verify + serialize), LIR
    instructions, and the CPU seconds of the whole compile (to spot a busy machine)."""
    ir = trace.TraceRequest("kernels.linalg", "gemm", (("M", n), ("K", n), ("N", n)))
    times, count = [], 0
    cpu = time.process_time()
    for module in STAGES:
        options = build_options(module.Options, stage_options.get(module.NAME), module.NAME)
        start = time.perf_counter()
        ir = module.run(ir, options, machine)
        module.verify(ir, machine)
        module.serialize(ir)
        times.append(time.perf_counter() - start)
        if module is lir:
            count = len(ir.instrs)
    return times, count, time.process_time() - cpu


def measure(sizes, repeat: int, stage_options: dict[str, dict], machine: dict) -> list[dict]:
    """Median per-stage seconds of ``repeat`` compiles at each size."""
    points = []
    for n in sizes:
        runs, cpus, count = [], [], 0
        for _ in range(repeat):
            times, count, cpu = compile_once(n, stage_options, machine)
            runs.append(times)
            cpus.append(cpu)
        stage_s = [statistics.median(r[i] for r in runs) for i in range(len(STAGES))]
        total = statistics.median(sum(r) for r in runs)
        cpu = statistics.median(cpus)
        points.append({"n": n, "instrs": count, "stages": stage_s, "total": total, "cpu": cpu})
    return points


def report(title: str, points: list[dict], judged: str, targets: Targets) -> tuple[float, float]:
    """Print one series; returns (max/min time per instruction, total seconds at the largest)."""
    head = ["gemm", "LIR instrs", *(m.NAME for m in STAGES), "total", "(cpu)", "us/instr"]
    rows = [head]
    for p in points:
        rows.append(
            [
                f"{p['n']}^3",
                str(p["instrs"]),
                *(f"{s * 1e3:.1f}" for s in p["stages"]),
                f"{p['total'] * 1e3:.1f}",
                f"({p['cpu'] * 1e3:.1f})",
                f"{p['total'] / max(p['instrs'], 1) * 1e6:.1f}",
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    print(f"\n{title} (stage times in ms, median)")
    for k, row in enumerate(rows):
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
        if k == 0:
            print("  ".join("-" * w for w in widths))
    per = [p["total"] / max(p["instrs"], 1) for p in points]
    ratio = max(per) / min(per)
    per_cpu = [p["cpu"] / max(p["instrs"], 1) for p in points]
    ratio_cpu = max(per_cpu) / min(per_cpu)
    largest = points[-1]

    def verdict(what: str, label: str, ok: bool) -> str:
        if judged == what:
            return targets.judge(label, ok)
        return f"not judged here, would {'meet' if ok else 'miss'} it"

    ratio_ok, full_ok = ratio <= RATIO_TARGET, largest["total"] < FULL_TARGET_S
    full_label = f"full gemm {largest['n']} pipeline"
    print(
        f"time per instruction max/min across sizes: {ratio:.2f}x (cpu time: {ratio_cpu:.2f}x) "
        f"(target <= {RATIO_TARGET}x: {verdict('ratio', 'time per instruction', ratio_ok)})"
    )
    print(
        f"full pipeline, gemm {largest['n']}^3: {largest['total']:.3f} s "
        f"(target < {FULL_TARGET_S:g} s: "
        f"{verdict('full', full_label, full_ok)})"
    )
    return ratio, largest["total"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per point (median)")
    parser.add_argument("--small-tile", type=int, default=32, help="visa tile size, series 2")
    parser.add_argument("--quick", action="store_true", help="sizes 64 and 128, one run each")
    args = parser.parse_args(argv)
    sizes = QUICK_SIZES if args.quick else SIZES
    repeat = 1 if args.quick else args.repeat

    pipeline = load_pipeline(REPO / "pipeline.yaml")
    machine = {"name": MACHINE, **pipeline.machine_model(MACHINE)}
    default = {s.name: dict(s.options) for s in pipeline.stages}
    t = args.small_tile
    small = {**default, "visa": {**default.get("visa", {}), "tile_m": t, "tile_n": t, "tile_k": t}}

    targets = Targets()
    compile_once(QUICK_SIZES[0], default, machine)  # warm up: imports, first trace
    print(
        f"compile scaling: gemm f32 M=N=K on {MACHINE}; stage time = run + verify + serialize; "
        f"median of {repeat} run(s) per point"
    )
    ratio_d, full_d = report(
        "series 1: default tiles (pipeline.yaml visa options)",
        measure(sizes, repeat, default, machine),
        judged="full",
        targets=targets,
    )
    ratio_s, full_s = report(
        f"series 2: small tiles (visa tile_m=tile_n=tile_k={t})",
        measure(sizes, repeat, small, machine),
        judged="ratio",
        targets=targets,
    )
    print(
        f"\njudged: time per instruction on series 2 (small tiles): {ratio_s:.2f}x "
        f"(target <= {RATIO_TARGET}x); full gemm {sizes[-1]} pipeline on series 1 "
        f"(default tiles): {full_d:.3f} s (target < {FULL_TARGET_S:g} s)"
    )
    print(
        f"also: series 1 time per instruction {ratio_d:.2f}x (fixed per-stage cost dominates "
        f"its small sizes); series 2 full pipeline {full_s:.3f} s"
    )
    return targets.finish()


if __name__ == "__main__":
    sys.exit(main())
