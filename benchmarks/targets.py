"""Execution targets against their performance targets (issue 4), in one run.

1. iree-cpu vs numpy, f32: gemm 1024x1024x1024, softmax 4096x4096,
   layernorm 4096x4096. Inputs are made once; IREE is timed with the
   runner's own ``time`` (inputs handed to the device once, invoke only),
   numpy with the same loop around plain numpy code, in ``RUNS`` interleaved
   runs of ``--repeat`` calls after ``--warmup`` (a run keeps its median, a
   figure is the median of its runs; CPU time per call beside it; a pause
   after numpy, whose OpenBLAS threads spin on after a call). Targets:
   iree-cpu at most 1.0x numpy (OpenBLAS) on gemm, under 0.25x on softmax
   and layernorm. Each IREE result is checked against numpy first.
2. sim throughput (issue 29; benchmarks/sim_figures.py): LIR instructions
   per second on a kernel with many instructions (layernorm 256x1024 on
   npu-tiny, ~16k instructions), executing (``SimRunner.run``) and end to
   end (read + checksum + decode + schedule/race/bounds checks + bind +
   execute) for a first prepare, a cached plan and, as the same-run
   calibration, the object path. Targets: execute >= 1,000,000/s, end to
   end >= 200,000/s.

    python benchmarks/targets.py [--quick] [--repeat N] [--warmup N]

Each figure is printed with ``met`` or ``MISSED``, then ``targets: N met, M
missed``; the exit status is 1 when a target is missed. ``--quick`` uses
small sizes and judges nothing (a smoke test of the script, not a
measurement: at those sizes fixed costs dominate). The IREE compile cache is
``$KILN_CACHE_DIR`` (default ``~/.cache/kiln``), so a second run skips
compiling.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from precision import SETTLE_S, Timed
from verdicts import Targets

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SIZES = {  # mode -> (gemm n, rows, cols, sim layernorm rows, cols)
    "full": (1024, 4096, 4096, 256, 1024),
    "quick": (64, 64, 128, 8, 128),
}
LAYERNORM_EPS = 1e-5
RUNS = 3  # interleaved runs of iree and numpy per kernel


@dataclass
class Row:
    what: str
    value: str
    target: str
    met: bool | None  # None: not measured (printed as 'not judged')


def numpy_softmax(x):
    s = x - x.max(axis=-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def numpy_layernorm(x, gamma, beta):
    mean = x.mean(axis=-1, keepdims=True)
    c = x - mean
    var = (c * c).mean(axis=-1, keepdims=True)
    return c * (1.0 / np.sqrt(var + LAYERNORM_EPS)) * gamma + beta


def seconds(fn, repeat: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def iree_vs_numpy(sizes, repeat: int, warmup: int) -> list[Row]:
    from kernels import linalg, normalization
    from kiln.compare import compare
    from kiln.inputs import random_inputs
    from kiln.lang import trace
    from kiln.runners.base import KernelArtifacts
    from kiln.runners.iree import IreeRunner
    from kiln.tasks.commands.benching import time_runner

    n, rows, cols = sizes[:3]
    cases = [
        ("gemm", linalg.gemm, {"M": n, "K": n, "N": n}, lambda a, b: a @ b, 1.0, f"{n}^3"),
        ("softmax", normalization.softmax, {"R": rows, "C": cols}, numpy_softmax, 0.25, ""),
        ("layernorm", normalization.layernorm, {"R": rows, "C": cols}, numpy_layernorm, 0.25, ""),
    ]
    runner = IreeRunner(options={"device": "llvm-cpu"})
    reason = runner.unavailable()
    if reason:
        return [Row(f"iree-cpu {name}", f"unavailable: {reason}", "", None) for name, *_ in cases]
    out = []
    for name, fn, bindings, reference, limit, label in cases:
        graph = trace(fn, bindings, "f32")
        shape = label or "x".join(str(d) for d in bindings.values())
        inputs = random_inputs(f"targets.{name}", [(a.shape, a.dtype) for a in graph.args])
        start = time.perf_counter()
        prepared = runner.prepare(KernelArtifacts(graph.name, graph, REPO, None))
        prepare_s = time.perf_counter() - start
        want = reference(*inputs)
        got = runner.run(prepared, inputs).outputs[0]
        check = compare(0, want, got, "f32", {"rtol": 1e-3, "atol": 1e-3})
        if not check.ok:
            print(f"warning: iree-cpu {name} differs from numpy: {check.describe()}")
        timed = [
            Timed("iree", lambda p=prepared, i=inputs: time_runner(runner, p, i, repeat, warmup)),
            Timed(
                "numpy",
                lambda r=reference, i=inputs: seconds(lambda: r(*i), repeat, warmup),
                SETTLE_S,  # OpenBLAS's spinning threads would slow the next iree run
            ),
        ]
        for _ in range(RUNS):  # interleaved: a busy spell hits both alike
            for item in timed:
                item.measure(repeat + warmup)
        iree_s, numpy_s = (item.median for item in timed)
        ratio = iree_s / numpy_s
        print(
            f"iree-cpu {name} {shape}: iree {timed[0].text()}, numpy {timed[1].text()}, "
            f"iree/numpy {ratio:.2f}  (prepare {prepare_s:.2f} s, "
            f"{prepared.metrics.get('cache')}, max abs err vs numpy {check.max_abs:.2g})",
            flush=True,
        )
        want_text = f"<= {limit:g}x numpy"
        met = ratio <= limit
        out.append(
            Row(
                f"iree-cpu {name} {shape}",
                f"{iree_s * 1e3:.2f} ms vs {numpy_s * 1e3:.2f} ms = {ratio:.2f}x",
                want_text,
                met and check.ok,
            )
        )
    return out


def sim_throughput(sizes, repeat: int) -> list[Row]:
    import yaml
    from sim_figures import sim_figures

    from kernels import normalization
    from kiln.driver import lower
    from kiln.inputs import random_inputs
    from kiln.ir.edf import encode
    from kiln.lang import trace
    from kiln.runners.base import KernelArtifacts
    from kiln.stages import edf, lir, schedule, visa

    rows, cols = sizes[3:]
    machines = yaml.safe_load((REPO / "pipeline.yaml").read_text())["machines"]
    machine = {"name": "npu-tiny", **machines["npu-tiny"]}
    graph = trace(normalization.layernorm, {"R": rows, "C": cols}, "f32")
    start = time.perf_counter()
    steps = [(stage.__name__, {}) for stage in (visa, lir, schedule, edf)]
    ir = lower(graph, steps, machine, verify=False)
    compile_s = time.perf_counter() - start
    inputs = random_inputs("targets.sim", [(a.shape, a.dtype) for a in graph.args])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.edf"
        path.write_bytes(encode(ir))
        artifacts = KernelArtifacts(graph.name, graph, Path(tmp), path)
        figures = sim_figures(
            artifacts, inputs, machine, max(1, repeat), f"layernorm {rows}x{cols}", compile_s
        )
    return [Row(*figure) for figure in figures]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke test")
    p.add_argument("--repeat", type=int, default=None, help="timed calls (median)")
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args(argv)
    sizes = SIZES["quick" if args.quick else "full"]
    repeat = args.repeat or (3 if args.quick else 20)
    print(f"benchmarks/targets.py ({'quick' if args.quick else 'full'}; median of {repeat})")
    results = iree_vs_numpy(sizes, repeat, args.warmup) + sim_throughput(sizes, min(repeat, 3))
    width = max(len(r.what) for r in results)
    print()
    targets = Targets(judged=not args.quick)  # small sizes measure fixed costs
    for r in results:
        verdict = targets.judge(r.what, r.met)
        print(f"{r.what:<{width}}  {r.value:<36} target {r.target:<22} {verdict}")
    return targets.finish()


if __name__ == "__main__":
    sys.exit(main())
