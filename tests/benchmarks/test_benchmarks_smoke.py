"""The benchmarks run (with --quick) and print their figures.

No timing is asserted: only that each benchmark finishes and reports
every figure it promises, in the form its README describes. A missed target
is not a failure here (a noisy machine misses them): the exit status may be
0 or 1, but it must agree with the final ``targets: N met, M missed`` line,
and a traceback or any other status fails.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NUMBER = r"\d+(?:\.\d+)?"
SUMMARY = re.compile(r"targets: (\d+) met, (\d+) missed(?:, (\d+) not judged)?(?: \(missed: .+\))?")


def judged_run(proc: subprocess.CompletedProcess) -> tuple[int, int, int]:
    """(met, missed, not judged) of a finished benchmark, checked against its exit status."""
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output, output
    assert proc.returncode in (0, 1), output
    last = proc.stdout.rstrip().splitlines()[-1]
    match = SUMMARY.fullmatch(last)
    assert match, f"last line is not the targets summary: {last!r}\n{output}"
    met, missed, not_judged = (int(g or 0) for g in match.groups())
    assert proc.returncode == (1 if missed else 0), output  # a miss is visible to CI
    return met, missed, not_judged


def run_benchmark(name: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / name), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    judged_run(proc)
    return proc.stdout


def test_schedule_quality_quick_prints_a_row_per_kernel_and_the_geomeans():
    out = run_benchmark("schedule_quality.py", "--quick")
    header = next(line for line in out.splitlines() if line.startswith("kernel"))
    for column in ("size", "instrs", "lower bound", "critical-path", "in-order", "optimum"):
        assert column in header, header
    assert "cp / opt" in header, header
    # the optimum's columns: solved (>= / <= where CP-SAT proved no optimum in time) or "-"
    optimum = rf"(?:(?:>=)?\d+\s+(?:>=)?{NUMBER}\s+(?:<=)?{NUMBER}\s+{NUMBER}|-\s+-\s+-\s+-)"
    for kernel in ("vector_add", "gemm", "softmax", "layernorm", "row_max"):
        row = rf"^{kernel}\s+\S+\s+\d+\s+\d+\s+{NUMBER}\s+{NUMBER}\s+{optimum}$"
        assert re.search(row, out, re.M), out
    assert re.search(
        rf"^geomean\s+\d+\s+\d+\s+{NUMBER}\s+{NUMBER}\s+(?:<=)?(?:{NUMBER}|-)$", out, re.M
    ), out
    match = re.search(
        rf"geomean makespan / lower bound: critical-path ({NUMBER}) \(target <= 1\.10: "
        rf"(met|MISSED)\), in-order ({NUMBER})",
        out,
    )
    assert match, out
    assert float(match[1]) >= 1.0 and float(match[3]) >= 1.0  # a ratio to a lower bound
    verdict = r"(?:met|MISSED|not judged)"
    assert re.search(
        rf"^makespan / optimum, critical-path: (?:not judged \(.+\)|geomean (?:<=)?{NUMBER} "
        rf"\(target <= 1\.03: {verdict}\), worst (?:<=)?{NUMBER} \(.+\) \(target <= 1\.10: "
        rf"{verdict}\))$",
        out,
        re.M,
    ), out
    met, missed, not_judged = judged_run_counts(out)
    assert met + missed + not_judged == 3, out


def judged_run_counts(out: str) -> tuple[int, int, int]:
    match = SUMMARY.fullmatch(out.rstrip().splitlines()[-1])
    assert match, out
    return tuple(int(g or 0) for g in match.groups())


def test_schedule_quality_on_the_tiny_machine():
    out = run_benchmark("schedule_quality.py", "--quick", "--machine", "npu-tiny")
    assert "schedule quality on npu-tiny" in out and "geomean makespan / lower bound" in out


def test_compile_scaling_quick_prints_both_series_and_both_targets():
    out = run_benchmark("compile_scaling.py", "--quick")
    assert "series 1: default tiles" in out and "series 2: small tiles" in out, out
    for stage in ("trace", "visa", "lir", "schedule", "edf"):
        assert stage in out
    rows = re.findall(
        rf"^\s*(\d+)\^3\s+(\d+)(?:\s+{NUMBER}){{6}}\s+\({NUMBER}\)\s+{NUMBER}$", out, re.M
    )
    assert [n for n, _ in rows] == ["64", "128"] * 2, out
    assert int(rows[3][1]) > int(rows[1][1])  # small tiles: more instructions
    assert len(re.findall(r"time per instruction max/min across sizes: \d+\.\d+x", out)) == 2
    assert len(re.findall(r"full pipeline, gemm 128\^3: \d+\.\d+ s", out)) == 2
    assert re.search(r"judged: time per instruction on series 2 .*: \d+\.\d+x", out), out
    assert re.search(r"full gemm 128 pipeline on series 1 \(default tiles\): \d+\.\d+ s", out)
    assert len(re.findall(r": (?:met|MISSED)\)$", out, re.M)) == 2, out  # one judged per series
    assert len(re.findall(r"not judged here, would (?:meet|miss) it\)$", out, re.M)) == 2, out


def test_parallel_quick_prints_both_builds_the_calibration_and_the_ratio():
    out = run_benchmark("parallel.py", "--quick")
    for label in ("cold -n 1", "cold -n 2", "no-op -n 1"):
        assert re.search(rf"^{label}: {NUMBER} s  \(runs: {NUMBER}\)$", out, re.M), out
    assert re.search(
        rf"^calibration: one process {NUMBER} s, two side by side {NUMBER} s$", out, re.M
    )
    for label in ("speed-up -n 2 over -n 1", "calibration speed-up"):
        assert re.search(rf"^{label}\s+{NUMBER}x", out, re.M), out
    assert re.search(r"^speed-up / calibration\s+\d+%\s+>= 85%", out, re.M), out
    assert "targets not judged" in out and "MISSED" not in out
    assert out.rstrip().endswith("targets: 0 met, 0 missed, 2 not judged"), out


def test_a_missed_target_exits_1_and_says_so_last():
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from verdicts import Targets\n"
            "t = Targets(); print(t.judge('fast', True), t.judge('small', False))\n"
            "sys.exit(t.finish())",
        ],
        cwd=REPO / "benchmarks",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.splitlines() == ["met MISSED", "targets: 1 met, 1 missed (missed: small)"]
    assert judged_run(proc) == (1, 1, 0) and proc.returncode == 1
