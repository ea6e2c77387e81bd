"""Parallel builds: does a cold `kiln compile -n 2` beat `-n 1` as two CPUs allow?

Generates a project in a temporary directory: a copy of the example
kernels and the example pipeline's stages and machines, with every shape
set of every kernel repeated ``--copies`` times (each copy is its own
kernel instance, compiled on its own), sized so a cold ``-n 1`` build
takes at least 10 s. In one run it then measures, interleaved and each
the median of ``--repeat`` (whole-process wall time of ``python -m kiln``):

- a cold ``kiln compile -n 1`` and a cold ``kiln compile -n 2`` (the build
  directory and ``.kiln/`` removed before each);
- the calibration: two pure-Python CPU-bound processes side by side vs
  one process doing both halves, on the same machine in the same run,
  i.e. the speed-up a second process can get here at all;
- a no-op ``kiln compile -n 1`` (after a build), for reference.

It also prints the CPU time of both builds (the process and its workers):
their ratio is the parallel overhead, and unlike wall time it hardly
depends on how busy the machine is.

Targets: speed-up (-n 1 time / -n 2 time) at least 1.5x, and at least
85% of the calibration. Each is printed with met or MISSED, then
``targets: N met, M missed``; the exit status is 1 when a target is missed
(2 when a build fails). On a busy machine both figures drop; the calibration shows how
much, so compare the ratio before trusting the speed-up alone.

    python benchmarks/parallel.py [--copies 96] [--repeat 3] [--dir DIR] [--quick]

The project lives on tmpfs when the machine has one (see scratch.py).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml
from scratch import add_dir_option, scratch
from verdicts import Targets, abort

REPO = Path(__file__).resolve().parent.parent
SPEEDUP_TARGET = 1.5
CALIBRATION_SHARE_TARGET = 0.85
MIN_SERIAL_SECONDS = 10.0

# pure-Python CPU work: no I/O, no shared state between the processes
SPIN = """\
import sys
x = 0
for i in range(int(sys.argv[1])):
    x = (x * 31 + i) % 1000003
"""


def make_project(root: Path, copies: int, sets: int | None = None) -> int:
    """Write the generated project under ``root``; returns its number of kernel instances.

    ``sets`` keeps only the first shape sets of each kernel (for --quick).
    """
    shutil.copytree(
        REPO / "kernels", root / "kernels", ignore=shutil.ignore_patterns("__pycache__")
    )
    example = yaml.safe_load((REPO / "pipeline.yaml").read_text())
    kernels = {}
    instances = 0
    for name, spec in example["kernels"].items():
        shapes = {
            f"{set_name}_{copy}": dims
            for copy in range(copies)
            for set_name, dims in list(spec["shapes"].items())[:sets]
        }
        kernels[name] = {**spec, "shapes": shapes}
        instances += len(shapes)
    pipeline = {
        key: example[key]
        for key in ("project", "packages", "machine", "stages", "machines", "targets")
        if key in example
    }
    pipeline["kernels"] = kernels
    (root / "pipeline.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
    return instances


CPU_SECONDS: dict[str, list[float]] = {}  # label -> CPU seconds of each run (process + workers)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def kiln(root: Path, *args: str) -> float:
    """Wall seconds of one `python -m kiln` run in ``root`` (it must succeed)."""
    env = dict(os.environ, KILN_CACHE_DIR=str(root / ".cache"))
    env.pop("KILN_OUT_DIR", None)
    env.pop("KILN_PIPELINE", None)
    cpu, start = children_cpu(), time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "kiln", *args], cwd=root, env=env, capture_output=True, text=True
    )
    seconds = time.perf_counter() - start
    CPU_SECONDS.setdefault(" ".join(args), []).append(children_cpu() - cpu)
    if proc.returncode != 0:
        abort(f"kiln {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return seconds


def cold_build(root: Path, jobs: int) -> float:
    # the artifact cache too: a build served from it measures fetching, not compiling
    for path in (root / "build", root / ".kiln", root / ".cache"):
        shutil.rmtree(path, ignore_errors=True)
    return kiln(root, "compile", "-n", str(jobs))


def spin(procs: int, loops: int) -> float:
    """Wall seconds of ``procs`` processes each running ``loops`` pure-Python iterations."""
    start = time.perf_counter()
    running = [subprocess.Popen([sys.executable, "-c", SPIN, str(loops)]) for _ in range(procs)]
    for p in running:
        p.wait()
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copies", type=int, default=96, help="copies of each shape set")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--loops", type=int, default=15_000_000, help="calibration work per half")
    ap.add_argument("--quick", action="store_true", help="a tiny run that checks the script")
    add_dir_option(ap)
    args = ap.parse_args()
    if args.quick:
        args.copies, args.repeat, args.loops = 1, 1, 1_000_000

    with scratch("kiln-parallel-", args.dir) as tmp:
        root = Path(tmp)
        instances = make_project(root, args.copies, 1 if args.quick else None)
        print(
            f"project: {instances} kernel instances ({args.copies} copies of each shape set), "
            f"in {root.parent}"
        )
        if not args.quick:
            cold_build(root, 1)  # warm-up: byte-compiles the sources, fills the OS file cache
        serial, parallel, one, two = [], [], [], []
        for _ in range(args.repeat):
            serial.append(cold_build(root, 1))
            parallel.append(cold_build(root, 2))
            one.append(spin(1, 2 * args.loops))  # one process doing both halves
            two.append(spin(2, args.loops))
        noop = [kiln(root, "compile") for _ in range(args.repeat)]

    t1, t2 = statistics.median(serial), statistics.median(parallel)
    c1, c2 = statistics.median(one), statistics.median(two)
    speedup, calibration = t1 / t2, c1 / c2
    share = speedup / calibration
    print(f"cold -n 1: {t1:.2f} s  (runs: {_runs(serial)})")
    print(f"cold -n 2: {t2:.2f} s  (runs: {_runs(parallel)})")
    cpu1 = statistics.median(CPU_SECONDS["compile -n 1"][-len(serial) :])
    cpu2 = statistics.median(CPU_SECONDS["compile -n 2"])
    print(
        f"cpu time: -n 1 {cpu1:.2f} s, -n 2 {cpu2:.2f} s (all processes; "
        f"-n 2 spends {cpu2 / cpu1 - 1:+.0%})"
    )
    print(f"calibration: one process {c1:.2f} s, two side by side {c2:.2f} s")
    print(f"no-op -n 1: {statistics.median(noop):.2f} s  (runs: {_runs(noop)})")
    print()
    targets = Targets(judged=not args.quick)
    if args.quick:
        print("(--quick: figures printed, targets not judged)")
    size_ok = t1 >= MIN_SERIAL_SECONDS
    verdicts = [
        (
            "speed-up -n 2 over -n 1",
            f"{speedup:.2f}x",
            f">= {SPEEDUP_TARGET}x",
            speedup >= SPEEDUP_TARGET,
        ),
        ("calibration speed-up", f"{calibration:.2f}x", "(what two processes get here)", None),
        (
            "speed-up / calibration",
            f"{share:.0%}",
            f">= {CALIBRATION_SHARE_TARGET:.0%}",
            share >= CALIBRATION_SHARE_TARGET,
        ),
    ]
    for label, value, target, ok in verdicts:
        verdict = "" if ok is None else targets.judge(label, ok)
        print(f"{label:26} {value:>7}  {target:30} {verdict}".rstrip())
    if not size_ok and not args.quick:
        print(
            f"note: the -n 1 build took {t1:.1f} s, under the {MIN_SERIAL_SECONDS:.0f} s "
            "this benchmark is sized for; raise --copies"
        )
    return targets.finish()


def _runs(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


if __name__ == "__main__":
    sys.exit(main())
