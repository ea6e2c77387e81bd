"""Benchmark problems side by side: iree-cpu vs numpy (the cpu oracle) vs PyTorch CPU eager.

Problems (f32): gemm 1024^3; three ResNet-50 conv2d layers, NHWC, batch 1,
each fwd/dgrad/wgrad; layernorm and softmax 4096x4096. Each problem is the
`kiln bench problem:NAME` kernel (kiln.tasks.commands.problems), timed with the
runner's own timer (median of --repeat after --warmup). PyTorch is used
when installed (`pip install -e '.[bench]'`), else its column is empty.

Targets: gemm within 1.5x of torch, conv within 2.5x (IREE's CPU
convolutions trail oneDNN), fused layernorm/softmax faster than torch.
Then low precision against f32 on iree-cpu (benchmarks/precision.py): bf16
and f16 gemm 1024^3 and two NHWC convolutions, each at most 1.5x the f32
time of the same problem, measured in the same run (``--runs`` interleaved
runs, with CPU time and a numpy calibration beside them).
Each is printed with met or MISSED (not judged without torch, nor under
``--quick``), then ``targets: N met, M missed``; the exit status is 1 when a
target is missed.

    python benchmarks/problems.py [--quick] [--repeat N] [--warmup N] [--runs N]
                                  [--precision-only]
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

from precision import SETTLE_S, print_precision  # noqa: E402
from verdicts import Targets  # noqa: E402

RESNET50 = [  # (C, H, K, R, stride): conv2_x 3x3, conv3_x 3x3 s2 entry, conv4_x 1x1
    (64, 56, 64, 3, 1),
    (128, 56, 128, 3, 2),
    (256, 14, 1024, 1, 1),
]
TARGET_RATIO = {"gemm": 1.5, "conv": 2.5, "layernorm": 1.0, "softmax": 1.0}


def problems(quick: bool) -> list[tuple[str, list[str]]]:
    n, rows = (128, 256) if quick else (1024, 4096)
    out = [("gemm", ["problem:gemm", "-M", str(n), "-N", str(n), "-K", str(n)])]
    for c, h, k, r, s in RESNET50:
        if quick:
            c, h, k = c // 8, h // 4, k // 8
        for mode in ("fwd", "dgrad", "wgrad"):
            out.append(("conv", ["problem:conv", "-N", "1", "-C", str(c), "-H", str(h),
                                 "-W", str(h), "-K", str(k), "-R", str(r), "-S", str(r),
                                 "--stride", str(s), "--pad", "same", "--mode", mode]))  # fmt: skip
    for name in ("layernorm", "softmax"):
        out.append((name, [f"problem:{name}", "-M", str(rows), "-N", str(rows)]))
    return out


def torch_seconds(name: str, args, repeat: int, warmup: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    torch.manual_seed(0)
    if name == "gemm":
        a, b = torch.randn(args.M, args.K), torch.randn(args.K, args.N)
        fn = lambda: a @ b  # noqa: E731
    elif name in ("layernorm", "softmax"):
        x = torch.randn(args.M, args.N)
        g, bias = torch.randn(args.N), torch.randn(args.N)
        if name == "softmax":
            fn = lambda: torch.softmax(x, -1)  # noqa: E731
        else:
            fn = lambda: torch.nn.functional.layer_norm(x, (args.N,), g, bias)  # noqa: E731
    else:
        x = torch.randn(args.N, args.C, args.H, args.W).to(memory_format=torch.channels_last)
        w = torch.randn(args.K, args.C, args.R, args.S)
        pad = args.R // 2
        y = torch.nn.functional.conv2d(x, w, stride=args.stride, padding=pad)
        if args.mode == "fwd":
            fn = lambda: torch.nn.functional.conv2d(x, w, stride=args.stride, padding=pad)  # noqa: E731
        elif args.mode == "dgrad":
            fn = lambda: torch.nn.grad.conv2d_input(x.shape, w, y, stride=args.stride, padding=pad)  # noqa: E731
        else:
            fn = lambda: torch.nn.grad.conv2d_weight(x, w.shape, y, stride=args.stride, padding=pad)  # noqa: E731
    with torch.no_grad():
        for _ in range(warmup):
            fn()
        samples = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke test")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3, help="interleaved runs per dtype (median)")
    ap.add_argument("--precision-only", action="store_true", help="only bf16/f16 vs f32")
    opts = ap.parse_args()
    targets = Targets(judged=not opts.quick)  # small sizes measure fixed costs
    if not opts.precision_only:
        print_problems(targets, opts)
    print("\nlow precision vs f32, iree-cpu (median of runs; target <= 1.5x f32):")
    print_precision(targets, opts.quick, opts.runs, opts.repeat, opts.warmup)
    return targets.finish()


def print_problems(targets: Targets, opts) -> None:
    from kiln.tasks.commands.problems import bench_problem, parse

    print(f"{'problem':44} {'iree ms':>9} {'numpy ms':>9} {'torch ms':>9}  target")
    for name, argv in problems(opts.quick):
        timing = ["--iter", str(opts.repeat), "--warmup", str(opts.warmup)]
        time.sleep(SETTLE_S)  # numpy's and torch's threads spin on after the last problem
        _, args = parse([*argv, *timing, "--target", "iree-cpu"])
        (iree,) = bench_problem(name, args)
        (cpu,) = bench_problem(name, parse([*argv, *timing, "--target", "cpu"])[1])
        torch_s = torch_seconds(name, args, opts.repeat, opts.warmup)
        if torch_s is None:
            verdict = f"n/a (no torch): {targets.judge(iree['problem'], None)}"
        else:
            ratio = iree["median_ms"] / (torch_s * 1e3)
            ok = targets.judge(iree["problem"], ratio <= TARGET_RATIO[name])
            verdict = f"{ratio:.2f}x torch ({ok}, <= {TARGET_RATIO[name]}x)"
        torch_ms = f"{torch_s * 1e3:9.3f}" if torch_s is not None else f"{'-':>9}"
        print(
            f"{iree['problem']:44} {iree['median_ms']:9.3f} {cpu['median_ms']:9.3f} "
            f"{torch_ms}  {verdict}"
        )


if __name__ == "__main__":
    sys.exit(main())
