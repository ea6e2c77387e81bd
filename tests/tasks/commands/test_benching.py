"""`kiln bench`: the shape of its table, CSV and JSON for cpu, sim and iree-cpu.

Only structure is pinned (columns, types, relations between fields), never
a time. One project is built once for the module; every bench call after
the first finds the kernels up to date.
"""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import io
import json
import re
import shutil
from pathlib import Path

import pytest

from kiln.tasks.commands.benching import render, time_runner
from tests.conftest import REPO, SMALL_PIPELINE, machines_yaml, run_kiln

KERNELS = ["vector_add.small", "gemm.small", "gemm.wide"]
TIMED = ["kernel", "target", "median_ms", "min_ms", "gflops", "gbps"]
HAS_IREE = importlib.util.find_spec("iree") is not None and (
    importlib.util.find_spec("iree.runtime") is not None
)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bench")
    shutil.copytree(
        REPO / "kernels", root / "kernels", ignore=shutil.ignore_patterns("__pycache__")
    )
    extra = "  iree-cpu: {runner: iree}\n  board: {runner: npu}\n"
    sim = "  sim: {runner: sim, machine: npu-v1}\n"
    (root / "pipeline.yaml").write_text(SMALL_PIPELINE.replace(sim, sim + extra) + machines_yaml())
    run_kiln(root, "compile", "vector_add", "gemm", check=True)
    return root


def bench(root: Path, *args: str, filters=("vector_add", "gemm")) -> str:
    proc = run_kiln(root, "bench", *filters, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def bench_json(root: Path, *args: str, filters=("vector_add", "gemm")) -> list[dict]:
    """The rows of one `kiln bench ... --output-format json` run."""
    out = bench(root, *args, "--output-format", "json", filters=filters)
    return json.loads(after_build_line(out))


def after_build_line(stdout: str) -> str:
    """stdout minus the build summary (`kiln: N tasks: ...`) that precedes the output."""
    lines = stdout.splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("kiln: "))


@pytest.fixture(scope="module")
def sim_json(built) -> str:
    return bench(built, "--target", "sim", "--output-format", "json")


def test_sim_reports_cycles_and_microseconds_as_json(sim_json):
    rows = json.loads(after_build_line(sim_json))
    assert [r["kernel"] for r in rows] == KERNELS
    for r in rows:
        assert set(r) == {"kernel", "target", "cycles", "sim_us", "instructions"}
        assert r["target"] == "sim"
        assert isinstance(r["cycles"], int) and r["cycles"] > 0
        assert r["sim_us"] == pytest.approx(r["cycles"] / 1000)  # npu-v1 runs at 1000 MHz
        assert isinstance(r["instructions"], int) and r["instructions"] > 0


def test_machine_readable_output_is_alone_on_stdout(sim_json):
    json.loads(sim_json)


def test_cpu_reports_times_and_rates_as_csv(built):
    out = after_build_line(
        bench(built, "--target", "cpu", "--output-format", "csv", "--iter", "3", "--warmup", "0")
    )
    reader = csv.DictReader(io.StringIO(out))
    assert reader.fieldnames == TIMED
    rows = list(reader)
    assert [r["kernel"] for r in rows] == KERNELS and {r["target"] for r in rows} == {"cpu"}
    for r in rows:
        median, best = float(r["median_ms"]), float(r["min_ms"])
        assert 0 < best <= median
        assert float(r["gflops"]) > 0 and float(r["gbps"]) > 0
    # gemm 32x32x32: 2*32^3 flops over 3*32*32*4 bytes, whatever the time
    gemm = rows[1]
    ratio = float(gemm["gflops"]) / float(gemm["gbps"])
    assert ratio == pytest.approx(2 * 32**3 / (3 * 32 * 32 * 4), rel=1e-6)


def test_sim_table_is_the_default_format(built):
    out = after_build_line(bench(built, "--target", "sim"))
    assert "kiln bench" in out
    header = next(line for line in out.splitlines() if "kernel" in line)
    for column in ("kernel", "target", "cycles", "sim_us", "instructions"):
        assert column in header
    for kernel in KERNELS:
        assert kernel in out


@pytest.mark.skipif(not HAS_IREE, reason="iree-base-compiler/runtime not installed")
def test_iree_cpu_reports_times_and_rates(built):
    rows = bench_json(
        built, "--target", "iree-cpu", "--iter", "2", "--warmup", "0", filters=("gemm",)
    )
    assert [r["kernel"] for r in rows] == ["gemm.small", "gemm.wide"]
    for r in rows:
        assert set(r) == set(TIMED) and r["target"] == "iree-cpu"
        assert 0 < r["min_ms"] <= r["median_ms"] and r["gflops"] > 0 and r["gbps"] > 0


def test_an_unavailable_target_is_an_error_not_a_traceback(built):
    proc = run_kiln(built, "bench", "vector_add", "--target", "board")
    assert proc.returncode == 2
    said = "--target board was asked for, but it cannot run here: no hardware runner plugin"
    assert said in proc.stderr
    assert "Traceback" not in proc.stderr


def test_each_repeated_target_gets_its_rows_in_the_order_given(built):
    out_dir = built / "build" / "kiln" / "kernel" / "gemm" / "small"
    for old in out_dir.glob("bench-*.json"):
        old.unlink()  # left by the tests before this one
    rows = bench_json(
        built,
        *("--target", "sim", "--target", "cpu", "--target", "sim"),
        *("--iter", "2", "--warmup", "0"),
    )
    assert [(r["kernel"], r["target"]) for r in rows] == [
        *((k, "sim") for k in KERNELS),
        *((k, "cpu") for k in KERNELS),
    ]
    assert all(r["cycles"] > 0 for r in rows[:3]) and all(r["median_ms"] > 0 for r in rows[3:])
    # `kiln view` keeps the last numbers of each target apart, with the binary they are of
    saved = {p.name: json.loads(p.read_text()) for p in out_dir.glob("bench-*.json")}
    binary = hashlib.sha256((out_dir / "kernel.edf").read_bytes()).hexdigest()
    assert saved == {
        "bench-sim.json": {**rows[1], "binary": binary},
        "bench-cpu.json": {**rows[4], "binary": binary},
    }


def test_an_unavailable_target_among_several_builds_and_times_nothing(built):
    saved = built / "build" / "kiln" / "kernel" / "vector_add" / "small" / "bench-cpu.json"
    bench(built, "--target", "cpu", "--iter", "1", "--warmup", "0", filters=("vector_add",))
    before = saved.stat().st_mtime_ns
    proc = run_kiln(built, "bench", "vector_add", "--target", "cpu", "--target", "board")
    assert proc.returncode == 2 and proc.stdout.count("median_ms") == 0
    assert "--target board was asked for, but it cannot run here" in proc.stderr
    assert "tasks:" not in proc.stdout + proc.stderr  # refused before the build
    assert saved.stat().st_mtime_ns == before  # and cpu was not timed either
    assert "Traceback" not in proc.stderr


def test_device_index_goes_only_to_targets_with_a_device_to_choose(built):
    rows = bench_json(
        built,
        *("--target", "cpu", "--target", "sim", "--device", "1", "--iter", "1", "--warmup", "0"),
        filters=("vector_add",),
    )
    assert [r["target"] for r in rows] == ["cpu", "sim"]


def test_render_puts_every_column_of_every_row_in_each_format():
    rows = [
        {"kernel": "a.s", "target": "sim", "cycles": 12, "sim_us": 0.012},
        {"kernel": "b.s", "target": "cpu", "median_ms": 1.23456789, "min_ms": 1.0},
    ]
    as_json = json.loads(render(rows, "json"))
    assert as_json == rows
    as_csv = list(csv.reader(io.StringIO(render(rows, "csv"))))
    assert as_csv[0] == ["kernel", "target", "cycles", "sim_us", "median_ms", "min_ms"]
    assert as_csv[1] == ["a.s", "sim", "12", "0.012", "", ""]
    assert as_csv[2] == ["b.s", "cpu", "", "", "1.23456789", "1.0"]
    table = render(rows, "table")
    assert "kiln bench" in table and "1.235" in table  # floats to 4 significant digits
    assert "cycles" in table and "median_ms" in table
    assert render([], "json") == "[]\n"


class CountingRunner:
    def __init__(self):
        self.calls = 0

    def run(self, prepared, inputs):
        self.calls += 1


def test_time_runner_warms_up_then_samples_each_iteration():
    runner = CountingRunner()
    samples = time_runner(runner, None, [], iters=3, warmup=2)
    assert runner.calls == 5 and len(samples) == 3 and all(s >= 0 for s in samples)


def test_time_runner_prefers_the_runners_own_timing():
    class DeviceTimed(CountingRunner):
        def time(self, prepared, inputs, iters, warmup):
            return [0.5] * iters

    runner = DeviceTimed()
    assert time_runner(runner, None, [], iters=4, warmup=9) == [0.5] * 4
    assert runner.calls == 0


def test_targets_benchmark_quick_smoke(tmp_path):
    """benchmarks/targets.py --quick prints every figure and target line (no timing asserts)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "targets.py"),
            "--quick",
            "--repeat",
            "1",
            "--warmup",
            "0",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    # quick sizes measure fixed costs: every figure is printed, none is judged
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    out = proc.stdout
    assert re.fullmatch(r"targets: 0 met, 0 missed, \d+ not judged", out.rstrip().splitlines()[-1])
    for name in ("gemm 64^3", "softmax 64x128", "layernorm 64x128"):
        line = next(
            x for x in out.splitlines() if x.startswith(f"iree-cpu {name}") and "target" in x
        )
        if HAS_IREE:
            assert " ms vs " in line and line.endswith("not judged"), line
        else:
            assert "unavailable" in line and "not judged" in line
    assert "target <= 1x numpy" in out and "target <= 0.25x numpy" in out
    assert "LIR instructions; execute" in out
    sim = [x for x in out.splitlines() if x.startswith("sim ") and "target" in x]
    assert len(sim) == 4 and "target >= 1,000,000/s" in sim[0]
    assert all("target >= 200,000/s" in x for x in sim[1:3])


def test_a_project_kernel_at_explicit_sizes(built):
    out = bench(
        built, "--target", "sim", "--shape", "M=64,K=32,N=16", "--output-format", "json",
        filters=("gemm",),
    )  # fmt: skip
    (row,) = json.loads(after_build_line(out))
    assert row["kernel"] == "gemm.shape_K32_M64_N16" and row["cycles"] > 0
    edf = built / "build" / "kiln" / "kernel" / "gemm" / "shape_K32_M64_N16" / "kernel.edf"
    assert edf.is_file()
    assert "shape_K32" not in (built / "pipeline.yaml").read_text()  # never written back


@pytest.mark.parametrize(
    "shape,message",
    [
        ("M=64,K=32", "missing: N"),
        ("M=64,K=32,N=16,Q=2", "unknown: Q"),
        ("M=0,K=1,N=1", "M must be at least 1"),
        ("M64", "cannot read 'M64'"),
        ("M=64,K=32,N=2000000000", "too large"),
        ("M=64,M=32,K=32,N=16", "M is given twice"),
        ("M=64,,K=32,N=16", "an empty entry"),
        ("", "--shape needs sizes"),
        (" ", "--shape needs sizes"),
    ],
)
def test_bad_explicit_sizes_are_one_message(built, shape, message):
    proc = run_kiln(built, "bench", "gemm", "--target", "cpu", "--shape", shape)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_explicit_sizes_without_one_kernel_named_say_so(built):
    proc = run_kiln(built, "bench", "--target", "cpu", "--shape", "M=64,K=32,N=16")
    assert proc.returncode == 2 and "--shape sizes one kernel" in proc.stderr, proc.stderr
    assert "name the kernel to time" in proc.stderr and "Traceback" not in proc.stderr


def test_a_negative_device_index_is_refused_before_anything_runs(built):
    proc = run_kiln(built, "bench", "vector_add", "--target", "cpu", "--device", "-1")
    assert proc.returncode == 2 and "--device must be at least 0" in proc.stderr
    assert "tasks:" not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr
