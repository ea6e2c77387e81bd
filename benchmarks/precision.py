"""Low precision against f32 on iree-cpu: the same problem, the same run.

Problems (the `kiln bench problem:` kernels): gemm 1024^3, and conv2d NHWC 3x3
pad 1, N16 48x32, C=K=64 and C=K=384 in 6 groups. Each dtype (f32, bf16, f16)
is prepared first (compiled, or read from the vmfb cache), then timed in
``--runs`` interleaved runs: f32, bf16, f16, then the calibration, numpy f32
gemm 1024^3 (OpenBLAS), a fixed workload that shows how busy the machine was
during that run (and a pause after it: ``SETTLE_S``). A run times
``--repeat`` calls after ``--warmup`` and keeps their median; a figure is
the median of its runs, with the process CPU time per call beside it
(IREE's worker threads included). Target: bf16 and f16 at most 1.5x the f32
time, each ratio judged met or MISSED.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import numpy as np

TARGET = 1.5  # low precision time / f32 time, at most
DTYPES = ("f32", "bf16", "f16")
CALIBRATION_N = 1024
# OpenBLAS's threads spin for about 0.1 s after a call before they sleep; an
# IREE call in that window shares the two cores with them and took 2x as long
# (gemm 1024^3: 32 ms right after numpy, 16 ms after a pause). Timings of
# numpy are followed by this pause.
SETTLE_S = 0.3


def cases(quick: bool) -> list[tuple[str, list[str]]]:
    """(name, `kiln bench` argv) of each problem; --quick shrinks them to a smoke test."""
    n, batch, hw, wide = (128, 2, (8, 8), 48) if quick else (1024, 16, (48, 32), 384)
    conv = ["problem:conv", "-N", str(batch), "-H", str(hw[0]), "-W", str(hw[1]), "--pad", "1"]
    return [
        ("gemm", ["problem:gemm", "-M", str(n), "-N", str(n), "-K", str(n)]),
        ("conv", [*conv, "-C", "64", "-K", "64"]),
        ("conv", [*conv, "-C", str(wide), "-K", str(wide), "--groups", "6"]),
    ]


@dataclass
class Timed:
    """One dtype of one problem: what to call, and the medians of its runs."""

    label: str
    call: object  # () -> list[float]: one timed loop of `repeat` calls, per-call seconds
    settle_s: float = 0.0  # pause after each run (SETTLE_S after numpy)
    runs: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def measure(self, calls: int) -> None:
        start = time.process_time()
        self.runs.append(statistics.median(self.call()))
        self.cpu.append((time.process_time() - start) / calls)
        time.sleep(self.settle_s)

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    def text(self) -> str:
        return f"{self.median * 1e3:.2f} ms (cpu {statistics.median(self.cpu) * 1e3:.2f} ms)"


def _prepared(argv: list[str], dtype: str, repeat: int, warmup: int) -> Timed:
    from kiln.inputs import random_inputs
    from kiln.lang import trace
    from kiln.runners.base import KernelArtifacts
    from kiln.runners.iree import IreeRunner
    from kiln.tasks.commands.benching import time_runner
    from kiln.tasks.commands.problems import PROBLEMS, make_kernel, parse

    name, args = parse([*argv, "--dtype", dtype, "--target", "iree-cpu"])
    problem = PROBLEMS[name](args)
    graph = trace(make_kernel(name, problem.body, problem.shapes), {}, problem.dtype)
    inputs = random_inputs(name, [(a.shape, a.dtype) for a in graph.args])
    runner = IreeRunner(options={"device": "llvm-cpu"})
    prepared = runner.prepare(KernelArtifacts(graph.name, graph, None, None))
    return Timed(problem.label, lambda: time_runner(runner, prepared, inputs, repeat, warmup))


def _calibration(repeat: int, warmup: int) -> Timed:
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((CALIBRATION_N,) * 2, np.float32) for _ in range(2))

    def loop() -> list[float]:
        for _ in range(warmup):
            a @ b
        samples = []
        for _ in range(repeat):
            start = time.perf_counter()
            a @ b
            samples.append(time.perf_counter() - start)
        return samples

    return Timed(f"numpy f32 gemm {CALIBRATION_N}^3", loop, SETTLE_S)


def print_precision(targets, quick: bool, runs: int, repeat: int, warmup: int) -> None:
    """Two lines per problem: each dtype's time and the calibration; the judged ratios."""
    reason = _unavailable()
    if reason:
        for dtype in DTYPES[1:]:
            verdict = targets.judge(f"iree-cpu {dtype}/f32", None)
            print(f"low precision vs f32: iree-cpu unavailable: {reason} ({verdict})")
        return
    for _, argv in cases(quick):
        timed = {d: _prepared(argv, d, repeat, warmup) for d in DTYPES}
        calibration = _calibration(repeat, warmup)
        for _ in range(runs):  # interleaved: a busy spell hits every dtype alike
            for item in (*timed.values(), calibration):
                item.measure(repeat + warmup)
        label = timed["f32"].label
        figures = "  ".join(f"{d} {timed[d].text()}" for d in DTYPES)
        verdicts = []
        for dtype in DTYPES[1:]:
            ratio = timed[dtype].median / timed["f32"].median
            ok = targets.judge(f"{label} {dtype}/f32", ratio <= TARGET)
            verdicts.append(f"{dtype}/f32 {ratio:.2f}x ({ok}, <= {TARGET}x)")
        print(f"{label}: {figures}  calibration {calibration.text()}", flush=True)
        print("    " + "  ".join(verdicts), flush=True)


def _unavailable() -> str | None:
    from kiln.runners.iree import IreeRunner

    return IreeRunner(options={"device": "llvm-cpu"}).unavailable()
