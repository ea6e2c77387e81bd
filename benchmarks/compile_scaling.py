"""Compile scaling: per-stage time, memory and LIR instruction count of gemm as it grows.

gemm (f32, M = N = K) on npu-v1, compiled in this process by calling the
stage modules directly, in pipeline order (trace, visa, lir, schedule,
edf): no build tool, no cache. A stage's time is what the compiler driver
does for it short of writing files: ``run`` (the visa stage's
``run_with_side_artifacts``, as the driver calls it) + ``verify`` +
``serialize`` (so "edf" includes encoding the binary), in wall seconds;
"(cpu)" is the process CPU time of the whole compile, close to "total"
unless the machine is busy. Each point is the median of ``--repeat`` runs,
interleaved (every size once, then again), after one untimed warm-up.
A same-run calibration (a fixed pure-Python loop, timed between the
rounds) shows how fast the machine was while the figures were taken.

Two series:

- ``default tiles``: pipeline.yaml's visa options (128x128x128 tiles),
  gemm 256 .. 4096 (28 .. 99,328 LIR instructions): what `kiln compile`
  builds. Judged here: gemm 4096 under 3 s, and its peak memory (the
  resident set of a fresh process that compiles it once) under 250 MB.
  The peak traced memory of each stage (tracemalloc, Python and numpy
  allocations, everything alive at the time) is printed per size.
- ``small tiles``: visa tile_m = tile_n = tile_k = 32 (``--small-tile``),
  gemm 256 .. 1024: 1,600 / 12,544 / 99,328 instructions, the counts of
  default-tile gemm 1024 .. 4096, so every size measures per-instruction
  work (at default tiles gemm 256 has 28 instructions and fixed costs
  dominate). Judged here: time per LIR instruction, max / min across the
  sizes, at most 1.3x.

Each figure is printed with ``met`` or ``MISSED``, then ``targets: N met,
M missed``; the exit status is 1 when a target is missed.

    python benchmarks/compile_scaling.py [--repeat 3] [--small-tile 32] [--quick]

``--quick`` runs gemm at 64 and 128 with one run per point (a smoke test;
the memory figure is printed, not judged).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from verdicts import Targets  # noqa: E402

from kiln.options import build_options  # noqa: E402
from kiln.pipeline import load_pipeline  # noqa: E402
from kiln.stages import edf, lir, schedule, trace, visa  # noqa: E402

STAGES = (trace, visa, lir, schedule, edf)
SIZES = (256, 512, 1024, 2048, 4096)
SMALL_SIZES = (256, 512, 1024)
QUICK_SIZES = (64, 128)
RATIO_TARGET = 1.3
FULL_TARGET_S = 3.0
MEMORY_TARGET_MB = 250
MACHINE = "npu-v1"


def setup(small_tile: int) -> tuple[dict, dict, dict]:
    """(machine model, default stage options, small-tile stage options) from pipeline.yaml."""
    pipeline = load_pipeline(REPO / "pipeline.yaml")
    machine = {"name": MACHINE, **pipeline.machine_model(MACHINE)}
    default = {s.name: dict(s.options) for s in pipeline.stages}
    t = small_tile
    small = {**default, "visa": {**default.get("visa", {}), "tile_m": t, "tile_n": t, "tile_k": t}}
    return machine, default, small


def compile_once(n: int, stage_options: dict[str, dict], machine: dict, traced: bool = False):
    """One gemm n^3 compile: per stage wall seconds (or, ``traced``, peak traced MB), the
    LIR instruction count and the CPU seconds of the whole compile."""
    ir = trace.TraceRequest("kernels.linalg", "gemm", (("M", n), ("K", n), ("N", n)))
    figures, count = [], 0
    cpu = time.process_time()
    for module in STAGES:
        options = build_options(module.Options, stage_options.get(module.NAME), module.NAME)
        if traced:
            tracemalloc.reset_peak()
        start = time.perf_counter()
        run = getattr(module, "run_with_side_artifacts", None)
        ir = run(ir, options, machine)[0] if run else module.run(ir, options, machine)
        module.verify(ir, machine)
        module.serialize(ir)
        took = time.perf_counter() - start
        figures.append(tracemalloc.get_traced_memory()[1] / 2**20 if traced else took)
        if module is lir:
            count = len(ir.instrs)
    return figures, count, time.process_time() - cpu


def calibrate(loops: int = 400_000) -> float:
    """Seconds of a fixed pure-Python loop: the machine's speed at this moment."""
    start = time.perf_counter()
    total = 0
    for i in range(loops):
        total += i * i % 7
    return time.perf_counter() - start


def measure(sizes, repeat: int, stage_options: dict, machine: dict, calib: list) -> list[dict]:
    """Median per-stage seconds of ``repeat`` interleaved rounds over ``sizes``."""
    runs: dict[int, list] = {n: [] for n in sizes}
    for _ in range(repeat):
        calib.append(calibrate())
        for n in sizes:
            runs[n].append(compile_once(n, stage_options, machine))
    points = []
    for n in sizes:
        r = runs[n]
        points.append(
            {
                "n": n,
                "instrs": r[0][1],
                "stages": [statistics.median(x[0][i] for x in r) for i in range(len(STAGES))],
                "total": statistics.median(sum(x[0]) for x in r),
                "cpu": statistics.median(x[2] for x in r),
            }
        )
    return points


def table(head: list[str], rows: list[list[str]]) -> None:
    rows = [head, *rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for k, row in enumerate(rows):
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
        if k == 0:
            print("  ".join("-" * w for w in widths))


def report(title: str, points: list[dict], judged: str, targets: Targets) -> tuple[float, float]:
    """Print one series; returns (max/min time per instruction, total seconds at the largest)."""
    print(f"\n{title} (stage times in ms, median)")
    table(
        ["gemm", "LIR instrs", *(m.NAME for m in STAGES), "total", "(cpu)", "us/instr"],
        [
            [
                f"{p['n']}^3",
                str(p["instrs"]),
                *(f"{s * 1e3:.1f}" for s in p["stages"]),
                f"{p['total'] * 1e3:.1f}",
                f"({p['cpu'] * 1e3:.1f})",
                f"{p['total'] / max(p['instrs'], 1) * 1e6:.1f}",
            ]
            for p in points
        ],
    )
    ratio, ratio_cpu = per_instruction_ratio(points)
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


def per_instruction_ratio(points: list[dict]) -> tuple[float, float]:
    """Max/min time per LIR instruction across ``points``, on wall and on CPU time."""
    per = [p["total"] / max(p["instrs"], 1) for p in points]
    per_cpu = [p["cpu"] / max(p["instrs"], 1) for p in points]
    return max(per) / min(per), max(per_cpu) / min(per_cpu)


def memory_table(sizes, stage_options: dict, machine: dict) -> None:
    """Peak traced MB per stage (one traced compile per size: tracemalloc slows it down)."""
    print("\npeak traced memory per stage, MB (tracemalloc: Python and numpy allocations)")
    tracemalloc.start()
    try:
        rows = []
        for n in sizes:
            peaks, count, _ = compile_once(n, stage_options, machine, traced=True)
            rows.append([f"{n}^3", str(count), *(f"{mb:.1f}" for mb in peaks), f"{max(peaks):.1f}"])
    finally:
        tracemalloc.stop()
    table(["gemm", "LIR instrs", *(m.NAME for m in STAGES), "peak"], rows)


def fresh_process_peak(n: int, small_tile: int) -> float:
    """Peak resident MB of a new Python process that compiles gemm n^3 once."""
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(n), "--small-tile", str(small_tile)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])["peak_mb"]


def child(n: int, small_tile: int) -> int:
    machine, default, _ = setup(small_tile)
    compile_once(n, default, machine)
    print(json.dumps({"peak_mb": _peak_rss_kib() / 1024}))
    return 0


def _peak_rss_kib() -> int:
    """This process's peak resident set, KiB. VmHWM belongs to the process image; Linux
    carries ru_maxrss over exec, so there it would report the (larger) benchmark that
    forked this child, not the child."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per point (median)")
    parser.add_argument("--small-tile", type=int, default=32, help="visa tile size, series 2")
    parser.add_argument("--quick", action="store_true", help="sizes 64 and 128, one run each")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)  # fresh-process peak
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args.small_tile)
    sizes = QUICK_SIZES if args.quick else SIZES
    small_sizes = QUICK_SIZES if args.quick else SMALL_SIZES
    repeat = 1 if args.quick else args.repeat
    machine, default, small = setup(args.small_tile)

    targets = Targets()
    compile_once(QUICK_SIZES[0], default, machine)  # warm up: imports, first trace
    print(
        f"compile scaling: gemm f32 M=N=K on {MACHINE}; stage time = run + verify + serialize; "
        f"median of {repeat} interleaved run(s) per point"
    )
    calib: list[float] = []
    points_d = measure(sizes, repeat, default, machine, calib)
    ratio_d, full_d = report(
        "series 1: default tiles (pipeline.yaml visa options)", points_d, "full", targets
    )
    ratio_s, full_s = report(
        f"series 2: small tiles (visa tile_m=tile_n=tile_k={args.small_tile})",
        measure(small_sizes, repeat, small, machine, calib),
        judged="ratio",
        targets=targets,
    )
    memory_table(sizes, default, machine)
    peak = fresh_process_peak(sizes[-1], args.small_tile)
    mem_ok = None if args.quick else peak < MEMORY_TARGET_MB
    print(
        f"peak memory, gemm {sizes[-1]}^3 compiled once in a fresh process: {peak:.0f} MB "
        f"(target < {MEMORY_TARGET_MB} MB): "
        + targets.judge(f"peak memory gemm {sizes[-1]}", mem_ok)
    )
    print(
        f"calibration (fixed pure-Python loop, once per round): "
        f"{statistics.median(calib) * 1e3:.1f} ms "
        f"(runs: {', '.join(f'{c * 1e3:.1f}' for c in calib)})"
    )
    big = [p for p in points_d if p["instrs"] >= 1000]
    big_ratio = f"{per_instruction_ratio(big)[0]:.2f}x" if len(big) > 1 else "n/a"
    print(
        f"\njudged: time per instruction on series 2 (small tiles): {ratio_s:.2f}x "
        f"(target <= {RATIO_TARGET}x); full gemm {sizes[-1]} pipeline on series 1 "
        f"(default tiles): {full_d:.3f} s (target < {FULL_TARGET_S:g} s); "
        f"peak memory {peak:.0f} MB (target < {MEMORY_TARGET_MB} MB)"
    )
    print(
        f"also: series 1 time per instruction {ratio_d:.2f}x over every size, "
        f"{big_ratio} over those with >= 1000 instructions (fixed per-stage cost "
        f"dominates the small ones); series 2 full pipeline {full_s:.3f} s"
    )
    return targets.finish()


if __name__ == "__main__":
    sys.exit(main())
