"""No-op build overhead: Kiln's `doit compile` vs a bare doit dodo with the same tasks.

Generates a project with KERNELS kernels (one shape set each, the full
stage table: one compile task per instance), builds it once, then times
no-op runs of `doit compile` through Kiln's dodo.py, interleaved with no-op
runs of a bare dodo that has as many tasks with the same file dependencies
(the kernel's module, the package's __init__.py, one stamp file) and as
many targets (five). Prints both medians, their ratio (target: at most
1.3x) and Kiln's time per instance (target: at most 0.15 ms), with met or
MISSED, then ``targets: N met, M missed``; the exit status is 1 when a
target is missed, 2 when a build fails.

    python benchmarks/noop_overhead.py [--kernels 6000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from verdicts import Targets, abort

REPO = Path(__file__).resolve().parent.parent
STAGES = ["trace", "visa", "lir", "schedule", "edf"]
PER_MODULE = 20
RATIO_TARGET = 1.3  # kiln's no-op wall time over the bare dodo's
PER_INSTANCE_MS = 0.15  # kiln's no-op CPU time per kernel instance

BARE_DODO = """
DOIT_CONFIG = {"backend": "sqlite3", "dep_file": ".bare.sqlite3", "verbosity": 0}

def _noop(targets):
    pass

def task_compile():
    for i in range(%(tasks)d):
        yield {
            "name": f"t{i}",
            "actions": [(_noop,)],
            "file_dep": [f"src/f{i // %(per_module)d}.txt", "src/init.txt", "src/stamp.txt"],
            "targets": [f"out/t{i}/{s}" for s in ("a", "b", "c", "d", "e")],
        }
"""


def make_project(root: Path, kernels: int) -> None:
    pkg = root / "bigkernels"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for m in range(0, kernels, PER_MODULE):
        lines = ["from kiln import Tensor, device", ""]
        for k in range(m, min(m + PER_MODULE, kernels)):
            lines += [
                "",
                "@device",
                f'def k{k}(a: Tensor["N"], b: Tensor["N"]):',
                f"    return a * {k % 7 + 1}.0 + b",
                "",
            ]
        (pkg / f"mod{m // PER_MODULE}.py").write_text("\n".join(lines))
    stage_rows = "".join(f"  - {{name: {s}, module: kiln.stages.{s}}}\n" for s in STAGES)
    kernel_rows = "".join(f"  k{k}: {{shapes: {{N: 64}}}}\n" for k in range(kernels))
    machine = (REPO / "pipeline.yaml").read_text().split("machines:\n", 1)[1].split("\ntargets:")[0]
    (root / "pipeline.yaml").write_text(
        "project: noop-bench\npackages: [bigkernels]\nmachine: npu-v1\n"
        f"stages:\n{stage_rows}kernels:\n{kernel_rows}machines:\n{machine}\n"
    )
    (root / "dodo.py").write_text((REPO / "dodo.py").read_text())


def make_bare(root: Path, tasks: int, files: int) -> None:
    (root / "src").mkdir(parents=True)
    for name in ("init", "stamp", *(f"f{i}" for i in range(files))):
        (root / "src" / f"{name}.txt").write_text(name)
    for i in range(tasks):
        (root / "out" / f"t{i}").mkdir(parents=True)
        for s in ("a", "b", "c", "d", "e"):
            (root / "out" / f"t{i}" / s).write_text("")
    (root / "dodo.py").write_text(
        BARE_DODO % {"tasks": tasks, "files": files, "per_module": PER_MODULE}
    )


def doit(cwd: Path, *args: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one doit run in ``cwd``."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONPYCACHEPREFIX=str(cwd.parent / "pyc"))
    # Both sides run from cached bytecode, as an installed tool does: doit's
    # own modules have theirs from pip, Kiln's get theirs on the first run.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "doit", *args], cwd=cwd, env=env, capture_output=True, text=True
    )
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        abort(f"doit failed in {cwd}:\n{proc.stdout}\n{proc.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=6000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    tasks = args.kernels  # one compile task per kernel instance
    with tempfile.TemporaryDirectory() as tmp:
        kiln_dir, bare_dir = Path(tmp) / "kiln", Path(tmp) / "bare"
        make_project(kiln_dir, args.kernels)
        make_bare(bare_dir, tasks, -(-args.kernels // PER_MODULE))
        print(f"building {args.kernels} kernels ({tasks} tasks, {len(STAGES)} stages each) ...")
        first, _ = doit(kiln_dir, "-n", str(os.cpu_count() or 2), "compile")
        print(f"  full build: {first:.1f} s")
        doit(bare_dir)
        doit(kiln_dir, "compile")  # settle: every task recorded
        kiln_times, bare_times = [], []
        for _ in range(args.repeat):
            kiln_times.append(doit(kiln_dir, "compile"))
            bare_times.append(doit(bare_dir))
    print(f"no-op `doit compile`, {tasks} tasks (median of {args.repeat}, interleaved):")
    print(f"  {'':10}{'wall ms':>10}{'cpu ms':>10}")
    for label, samples in (("kiln", kiln_times), ("bare doit", bare_times)):
        wall = statistics.median(s[0] for s in samples) * 1000
        cpu = statistics.median(s[1] for s in samples) * 1000
        print(f"  {label:10}{wall:10.1f}{cpu:10.1f}")
    wall_ratio = statistics.median(s[0] for s in kiln_times) / statistics.median(
        s[0] for s in bare_times
    )
    cpu_ratio = statistics.median(s[1] for s in kiln_times) / statistics.median(
        s[1] for s in bare_times
    )
    targets = Targets()
    verdict = targets.judge("no-op wall time vs bare doit", wall_ratio <= RATIO_TARGET)
    print(
        f"  ratio     {wall_ratio:10.2f}{cpu_ratio:10.2f}   (target: wall <= {RATIO_TARGET:.2f}x: "
        f"{verdict}; CPU time is the steadier figure on a shared machine)"
    )
    per = statistics.median(s[1] for s in kiln_times) * 1000 / args.kernels
    verdict = targets.judge("no-op CPU time per instance", per <= PER_INSTANCE_MS)
    print(f"  kiln CPU per instance {per:.3f} ms (target: <= {PER_INSTANCE_MS} ms: {verdict})")
    return targets.finish()


if __name__ == "__main__":
    sys.exit(main())
