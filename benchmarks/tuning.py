"""Tuning: makespan with the default rules (frozen below) vs after `kiln tune`, per kernel.

Copies the example project into a scratch directory and runs, through the
CLI as a user would:

1. `kiln tune` over every kernel instance (``--budget``, ``--seed``, ``-n``);
2. `kiln test --target sim` on the tuned build: every tuned kernel must
   still agree with the oracle;
3. `kiln tune` again: with the records present it must perform 0 trials;
4. trials per second of one matmul instance with ``-n 1`` and ``-n 2``.

The default makespans are frozen as they were when `kiln tune` was
introduced, so a later improvement of a default rule is not counted twice.
Targets: geomean speed-up over the ``large`` shape sets at least 1.2x, no
kernel slower than its frozen default, all sim tests pass, 0 trials on the
second run. Each is printed with met or MISSED, then ``targets: N met, M
missed``; the exit status is 1 when a target is missed (2 when the first
``kiln tune`` fails).

    python benchmarks/tuning.py [--budget 200] [--seed 0] [-n 2] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from verdicts import Targets, abort

REPO = Path(__file__).resolve().parent.parent

# Makespans (cycles) of the example kernels on npu-v1 with the default stage rules.
FROZEN_DEFAULTS = {
    "attention_scores.attention": 626,
    "batched_matmul.large": 10640,
    "batched_matmul.small": 684,
    "gemm.attention": 312,
    "gemm.large": 19940,
    "gemm.mlp": 464,
    "gemm.small": 968,
    "gemm_bias_relu.large": 20460,
    "gemm_bias_relu.mlp": 1236,
    "gemm_bias_relu.small": 1972,
    "layernorm.large": 23292,
    "layernorm.small": 1220,
    "row_max.large": 16800,
    "row_max.small": 526,
    "row_sum.large": 16800,
    "row_sum.small": 526,
    "softmax.attention": 306,
    "softmax.large": 22992,
    "softmax.mlp": 254,
    "softmax.small": 1060,
    "transpose.large": 62108,
    "transpose.small": 780,
    "vector_add.large": 8612,
    "vector_add.small": 780,
}
TARGET_GEOMEAN = 1.2


def kiln(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, KILN_CACHE_DIR=str(project / ".cache"))
    return subprocess.run(
        [sys.executable, "-m", "kiln", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def scratch_project(root: Path) -> Path:
    project = root / "project"
    project.mkdir()
    for name in ("pipeline.yaml",):
        shutil.copy(REPO / name, project / name)
    for name in ("kernels", "apps"):
        shutil.copytree(REPO / name, project / name, ignore=shutil.ignore_patterns("__pycache__"))
    return project


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 1.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-n", "--process", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="budget 24, large sets only")
    args = parser.parse_args()
    budget = 24 if args.quick else args.budget
    targets = Targets()
    with tempfile.TemporaryDirectory(prefix="kiln-tuning-bench-") as tmp:
        project = scratch_project(Path(tmp))
        select = ["*.large"] if args.quick else []
        start = time.perf_counter()
        tuned = kiln(
            project,
            "tune",
            *select,
            "--budget",
            str(budget),
            "--seed",
            str(args.seed),
            "-n",
            str(args.process),
        )
        tune_seconds = time.perf_counter() - start
        if tuned.returncode != 0:
            abort(tuned.stdout + tuned.stderr)
        records = {
            r["instance"]: r
            for r in map(json.loads, (project / "tuning.jsonl").read_text().splitlines())
        }
        print(f"{'instance':28} {'frozen':>8} {'default':>8} {'tuned':>8} {'speed-up':>9}  knobs")
        speedups: dict[str, float] = {}
        slower: list[str] = []
        for name in sorted(records):
            r = records[name]
            frozen = FROZEN_DEFAULTS.get(name, r["default_cycles"])
            speedups[name] = frozen / r["tuned_cycles"]
            knobs = " ".join(
                f"{s}.{k}={v}" for s in sorted(r["knobs"]) for k, v in r["knobs"][s].items()
            )
            if r["tuned_cycles"] > frozen:
                slower.append(name)
            print(
                f"{name:28} {frozen:8} {r['default_cycles']:8} {r['tuned_cycles']:8} "
                f"{speedups[name]:8.3f}x  {knobs or '(defaults)'}"
                + ("  SLOWER" if name in slower else "")
            )
        verdict = targets.judge("no kernel slower than its frozen default", not slower)
        print(f"kernels slower than their frozen default: {', '.join(slower) or 'none'}  {verdict}")
        large = [v for k, v in speedups.items() if k.endswith(".large")]
        small = [v for k, v in speedups.items() if not k.endswith(".large")]
        g_large, g_small = geomean(large), geomean(small)
        trials = sum(r["trials"] for r in records.values())
        verdict = targets.judge("geomean speed-up, large sets", g_large >= TARGET_GEOMEAN)
        print(
            f"\ngeomean speed-up, large sets: {g_large:.3f}x (target >= {TARGET_GEOMEAN}x)  "
            + verdict
        )
        if small:
            print(f"geomean speed-up, other sets: {g_small:.3f}x")
        print(
            f"tuning: {trials} trials in {tune_seconds:.1f} s with -n {args.process} "
            f"({trials / tune_seconds:.0f} trials/s, whole process)"
        )

        tested = kiln(project, "test", *select, "--target", "sim")
        summary = next((x for x in tested.stdout.splitlines() if x.startswith("kiln test:")), "")
        ok = tested.returncode == 0
        print(
            f"sim vs oracle on the tuned build: {summary or tested.stderr.strip()}  "
            + targets.judge("tuned kernels pass on sim", ok)
        )

        again = kiln(project, "tune", *select, "--budget", str(budget), "--seed", str(args.seed))
        zero = " 0 trials" in again.stdout and again.returncode == 0
        print(
            f"second kiln tune: {again.stdout.strip().splitlines()[-1] if again.stdout else ''}  "
            + targets.judge("second tune performs 0 trials", zero)
        )

        rates = {}
        for jobs in (1, 2):
            start = time.perf_counter()
            run = kiln(
                project,
                "tune",
                "gemm.large",
                "--force",
                "--budget",
                "96",
                "--strategy",
                "random",
                "-n",
                str(jobs),
            )
            elapsed = time.perf_counter() - start
            rates[jobs] = 96 / elapsed if run.returncode == 0 else float("nan")
        print(
            f"trials/s on gemm.large: -n 1 {rates[1]:.1f}, -n 2 {rates[2]:.1f} "
            f"(speed-up {rates[2] / rates[1]:.2f}x)"
        )
    return targets.finish()


if __name__ == "__main__":
    sys.exit(main())
