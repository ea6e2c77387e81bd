"""`kiln bench problem:NAME`: time a built-in problem without editing pipeline.yaml.

Problems: conv (fwd, dgrad, wgrad in any layout), gemm, layernorm, softmax,
attention. Each is a @device kernel made at the sizes given on the command
line, traced, and run on the chosen target the way `kiln bench` runs a
project kernel (sim: through every stage in-process; iree: compiled and
cached; cpu: the numpy oracle). GFLOP/s counts the problem's nominal work
(2 per multiply-add), not the extra ops of its lowering.
"""

from __future__ import annotations

import argparse
import inspect
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from kiln.errors import KilnError, TargetError, TraceError

PREFIX = "problem:"


@dataclass
class Problem:
    label: str
    body: Callable
    shapes: list[tuple[int, ...]]
    dtype: str
    flops: float


def conv_problem(a: argparse.Namespace) -> Problem:
    """A convolution at the sizes of ``a`` (-N -C -D -H -W -K -T -R -S and the rest)."""
    import kiln

    dims = a.dims
    spatial = {1: (a.W,), 2: (a.H, a.W), 3: (a.D, a.H, a.W)}[dims]
    taps = {1: (a.S,), 2: (a.R, a.S), 3: (a.T, a.R, a.S)}[dims]
    last = a.layout.lower() in ("nhwc", "nwc", "ndhwc")
    kw = dict(
        stride=_spread(a.stride, dims), padding=_spread(a.pad, dims),
        dilation=_spread(a.dilation, dims), groups=a.groups, layout="NHWC" if last else "NCHW",
    )  # fmt: skip
    from kiln.lang.conv import ConvGeometry  # the shape rules conv itself uses

    geo = ConvGeometry((a.N, *spatial, a.C), (*taps, a.C // a.groups, a.K), **_geo(kw))
    x = (a.N, *spatial, a.C) if last else (a.N, a.C, *spatial)
    w = (a.K, *taps, a.C // a.groups) if last else (a.K, a.C // a.groups, *taps)
    y = (a.N, *geo.out, a.K) if last else (a.N, a.K, *geo.out)
    work = 2.0 * a.N * a.K * (a.C // a.groups) * math.prod(geo.out) * math.prod(taps)
    label = f"conv{dims}d-{a.mode} {a.layout} N{a.N} C{a.C} {'x'.join(map(str, spatial))} K{a.K}"
    label += f" f{'x'.join(map(str, taps))}" + "".join(
        f" {short}{','.join(map(str, v)) if isinstance(v, tuple) else v}"
        for short, v, plain in (
            ("s", kw["stride"], 1), ("p", kw["padding"], 0), ("d", kw["dilation"], 1),
        )
        if v != plain and set(v if isinstance(v, tuple) else (v,)) != {plain}
    ) + (f" g{a.groups}" if a.groups > 1 else "")  # fmt: skip
    if a.mode == "fwd":
        return Problem(label, lambda p, q: kiln.conv(p, q, **kw), [x, w], a.dtype, work)
    if a.mode == "dgrad":
        return Problem(label, lambda p, q: kiln.conv_dgrad(p, q, x, **kw), [y, w], a.dtype, work)
    return Problem(label, lambda p, q: kiln.conv_wgrad(p, q, w, **kw), [x, y], a.dtype, work)


def _spread(value, dims: int):
    """One value per spatial dim (or 'same'/'valid'): a single value stands for every dim."""
    if isinstance(value, str) or len(value) != 1:
        return value
    return value * dims


def per_dim(text: str) -> tuple[int, ...] | str:
    """argparse ``type=`` of --stride, --dilation and --pad: ``2``, ``2,1,1`` (one per
    spatial dim, depth first) or, for --pad, ``same`` / ``valid``."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.lstrip("+-").isdigit() for p in parts):
        return text  # 'same', 'valid' or unreadable: check_per_dim says which
    return tuple(int(p) for p in parts)


def _geo(kw: dict) -> dict:
    return {k: kw[k] for k in ("stride", "padding", "dilation", "groups")}


def _gemm(a: argparse.Namespace) -> Problem:
    return Problem(
        f"gemm {a.M}x{a.N}x{a.K}",
        lambda p, q: p @ q,
        [(a.M, a.K), (a.K, a.N)],
        a.dtype,
        2.0 * a.M * a.N * a.K,
    )


def _layernorm(a: argparse.Namespace) -> Problem:
    def body(x, g, b):
        mean = x.mean(axis=-1, keepdims=True)
        centered = x - mean
        var = (centered * centered).mean(axis=-1, keepdims=True)
        return centered * (var + 1e-5).rsqrt() * g + b

    shapes = [(a.M, a.N), (a.N,), (a.N,)]
    return Problem(f"layernorm {a.M}x{a.N}", body, shapes, a.dtype, 8.0 * a.M * a.N)


def _softmax(a: argparse.Namespace) -> Problem:
    import kiln

    return Problem(
        f"softmax {a.M}x{a.N}", lambda x: kiln.softmax(x), [(a.M, a.N)], a.dtype, 5.0 * a.M * a.N
    )


def _attention(a: argparse.Namespace) -> Problem:
    import kiln

    scale = 1.0 / math.sqrt(a.D)

    def body(q, k, v):
        return kiln.softmax((q @ k.mT) * scale) @ v

    shape = (a.B, a.S, a.D)
    work = 4.0 * a.B * a.S * a.S * a.D
    return Problem(f"attention B{a.B} S{a.S} D{a.D}", body, [shape] * 3, a.dtype, work)


def _flags(p: argparse.ArgumentParser, name: str) -> None:
    add = p.add_argument
    if name == "conv":
        add("--dims", type=int, choices=(1, 2, 3), default=2)
        add("--layout", default="nhwc", choices=("nhwc", "nchw", "nwc", "ncw", "ndhwc", "ncdhw"))
        for flag, default in (("N", 1), ("C", 16), ("D", 8), ("H", 16), ("W", 16), ("K", 16)):
            add(f"-{flag}", type=int, default=default)
        for flag in ("T", "R", "S"):
            add(f"-{flag}", type=int, default=3, help="filter depth/height/width")
        each = "one value for every spatial dim, or one per dim (depth, height, width)"
        add("--stride", type=per_dim, default=(1,), metavar="S[,S...]", help=each)
        add("--dilation", type=per_dim, default=(1,), metavar="L[,L...]", help=each)
        add("--pad", type=per_dim, default=(0,), metavar="P[,P...]", help=each + "; or same, valid")
        add("--groups", type=int, default=1)
        add("--mode", choices=("fwd", "dgrad", "wgrad"), default="fwd")
    elif name == "gemm":
        for flag in ("M", "N", "K"):
            add(f"-{flag}", type=int, default=256)
    elif name in ("layernorm", "softmax"):
        add("-M", type=int, default=1024)
        add("-N", type=int, default=1024)
    elif name == "attention":
        add("-B", type=int, default=4, help="batch x heads")
        add("-S", type=int, default=128, help="sequence length")
        add("-D", type=int, default=64, help="head dim")


PROBLEMS: dict[str, Callable[[argparse.Namespace], Problem]] = {
    "conv": conv_problem,
    "gemm": _gemm,
    "layernorm": _layernorm,
    "softmax": _softmax,
    "attention": _attention,
}


def parse(argv: list[str]) -> tuple[str, argparse.Namespace]:
    """``problem:NAME`` and its flags (plus --target, --iter, ...) from `kiln bench` argv."""
    names = [a for a in argv if a.startswith(PREFIX)]
    name = names[0][len(PREFIX) :] if names else ""
    if name not in PROBLEMS or len(names) != 1:
        raise KilnError(
            f"unknown benchmark problem {names[0] if names else ''!r}",
            expected="one of: " + ", ".join(PREFIX + n for n in PROBLEMS),
            found=" ".join(names) or "(none)",
        )
    p = argparse.ArgumentParser(prog=f"kiln bench {PREFIX}{name}", add_help=True)
    p.add_argument("--target", action="append", metavar="T")
    p.add_argument("--iter", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--output-format", choices=["table", "csv", "json"], default="table")
    p.add_argument("--dtype", default="f32", choices=("f32", "f16", "bf16"))
    _flags(p, name)
    rest = [a for a in argv if a != names[0]]
    args = p.parse_args(rest)
    targets = list(dict.fromkeys(args.target or ["cpu"]))
    if len(targets) > 1:  # rather than the last one silently winning
        raise KilnError(
            f"kiln bench {PREFIX}{name} times one target at a time",
            expected="one --target",
            found=" ".join(f"--target {t}" for t in targets),
            hint="run it once per target",
        )
    args.target = targets[0]
    from kiln.tasks.commands.benching import check_timing_flags

    check_timing_flags(args.iter, args.warmup, args.device)
    _check_sizes(p, args)
    return name, args


SIZE_FLAGS = ("B", "S", "D", "M", "N", "K", "C", "H", "W", "T", "R", "stride", "dilation", "groups")
PER_DIM = {"stride": 1, "dilation": 1, "pad": 0}  # flag -> its least value


def _check_sizes(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every size flag of the problem is at least 1 (0 made an empty tensor or a division by 0)."""
    for dest in SIZE_FLAGS:
        value = getattr(args, dest, None)
        if isinstance(value, int) and value < 1:
            flag = f"-{dest}" if len(dest) == 1 else f"--{dest}"
            raise KilnError(
                f"{p.prog}: {flag} must be at least 1",
                expected="a whole number >= 1",
                found=str(value),
            )
    check_per_dim(p.prog, args)


def check_per_dim(prog: str, args: argparse.Namespace, flags: dict | None = None) -> None:
    """--stride, --dilation, --pad: one value or one per spatial dim, each in range.

    ``flags``: the name to say for each (a driver line's ``-u/-v``), default ``--stride`` ...
    """
    dims = getattr(args, "dims", None)
    for dest, least in PER_DIM.items():
        value = getattr(args, dest, None)
        flag = (flags or {}).get(dest, f"--{dest}")
        if value is None or dest == "pad" and value in ("same", "valid"):
            continue
        if isinstance(value, str):
            raise KilnError(
                f"{prog}: {flag}: cannot read {value!r}",
                expected=f"a whole number >= {least}, or one per spatial dim (e.g. 2,1,1)"
                + (", 'same' or 'valid'" if dest == "pad" else ""),
                found=value,
            )
        shown = ",".join(map(str, value))
        if len(value) not in (1, dims):
            raise KilnError(
                f"{prog}: {flag} has {len(value)} values for a {dims}-D convolution",
                expected=f"one value, or {dims} (one per spatial dim: depth, height, width)",
                found=shown,
            )
        if min(value) < least:
            raise KilnError(
                f"{prog}: {flag} must be at least {least}",
                expected=f"whole numbers >= {least}",
                found=shown,
            )


def _check_bytes(name: str, graph) -> None:
    """Refuse an argument or result too large to allocate, as `--shape` and pipeline.yaml do."""
    from kiln.ir.graph import ITEMSIZE, MAX_TENSOR_BYTES

    arrays = [("an argument", a.shape, a.dtype) for a in graph.args]
    arrays += [("the result", n.shape, n.dtype) for n in graph.output_nodes]
    for what, shape, dtype in arrays:
        size = math.prod(shape) * ITEMSIZE[dtype]
        if size > MAX_TENSOR_BYTES:
            raise KilnError(
                f"kiln bench {PREFIX}{name}: {what} is too large: "
                f"{size / 2**30:.1f} GiB ({'x'.join(map(str, shape))} {dtype})",
                expected=f"at most {MAX_TENSOR_BYTES // 2**30} GiB per array",
                found=f"{size:,} bytes",
                hint="pick smaller sizes",
            )


def problem_runner(target: str, device: int):
    """A pipeline target when a project is here, else a built-in cpu / sim / iree-cpu."""
    from kiln.runners.base import load_runner_class
    from kiln.tasks.model.project import Project

    try:
        project = Project.find()
        project.pipeline  # noqa: B018  (loads and validates pipeline.yaml)
    except (KilnError, OSError):
        project = None
    if project is not None and any(t.name == target for t in project.pipeline.targets):
        from kiln.tasks.checks.targets import make_runner

        runner = make_runner(project, target)
    elif target in ("iree-cpu", "iree"):
        runner = load_runner_class("iree")(options={"device": "llvm-cpu"})
    elif target == "cpu" or (target == "sim" and project is not None):
        runner = load_runner_class(target)(machine=project.machine() if project else None)
    else:
        raise TargetError(
            f"unknown target {target!r} for a benchmark problem",
            expected="cpu, sim (inside a project), iree-cpu, or a target of pipeline.yaml",
            found=target,
        )
    if device:
        runner.options["device_index"] = device
    reason = runner.unavailable()
    if reason:
        raise TargetError(f"target {target!r} is not available here: {reason}")
    return runner


def bench_problem(name: str, args: argparse.Namespace) -> list[dict]:
    return [time_problem(name, PROBLEMS[name](args), args)]


def time_problem(name: str, problem: Problem, args: argparse.Namespace) -> dict:
    """One row: ``problem`` traced, checked and timed on ``args.target`` (--iter, --warmup)."""
    from kiln.inputs import random_inputs
    from kiln.ir.cost import io_bytes
    from kiln.lang import trace
    from kiln.runners.base import KernelArtifacts
    from kiln.tasks.checks.targets import runner_errors
    from kiln.tasks.commands.benching import time_runner

    kernel = make_kernel(name, problem.body, problem.shapes)
    try:
        graph = trace(kernel, {}, problem.dtype)
    except TraceError as err:
        # the body is Kiln's own: what failed is the sizes the flags gave, not a kernel line
        raise KilnError(
            f"kiln bench {PREFIX}{name}: {err.message}",
            expected=err.expected,
            found=err.found,
            hint="pick smaller sizes",
        ) from None
    _check_bytes(name, graph)
    inputs = random_inputs(name, [(a.shape, a.dtype) for a in graph.args])
    runner = problem_runner(args.target, args.device)
    row: dict = {"problem": problem.label, "target": args.target, "dtype": problem.dtype}
    if runner.kind == "sim":
        metrics = runner.run(compile_for_sim(graph, runner.machine), inputs).metrics
        row.update(cycles=metrics.get("cycles"), sim_us=metrics.get("microseconds"))
        return row
    artifacts = KernelArtifacts(graph.name, graph, None, None, kernel)
    with runner_errors(args.target, runner):  # a plugin's crash: one message, no traceback
        samples = time_runner(runner, runner.prepare(artifacts), inputs, args.iter, args.warmup)
    median = statistics.median(samples)
    row.update(
        median_ms=median * 1e3,
        min_ms=min(samples) * 1e3,
        gflops=problem.flops / median / 1e9,
        gbps=io_bytes(graph) / median / 1e9,
    )
    return row


def make_kernel(name: str, body: Callable, shapes: list[tuple[int, ...]]):
    """A @device kernel named ``name`` over fixed-shape arguments that returns ``body(*args)``."""
    from kiln import Tensor, device

    def kernel(*args):
        return body(*args)

    params = [
        inspect.Parameter(f"a{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for i in range(len(shapes))
    ]
    kernel.__signature__ = inspect.Signature(params)
    kernel.__annotations__ = {p.name: Tensor[s] for p, s in zip(params, shapes, strict=True)}
    kernel.__name__ = kernel.__qualname__ = name
    return device(kernel)


def compile_for_sim(graph, machine: dict):
    """graph -> decoded EDF through every stage with default options (as `kiln compile`)."""
    from kiln.driver import lower
    from kiln.ir.edf import decode, encode

    steps = [(f"kiln.stages.{name}", {}) for name in ("visa", "lir", "schedule", "edf")]
    return decode(encode(lower(graph, steps, machine)))


def check_run(options: argparse.Namespace, prog: str) -> None:
    """One target, timing flags in range: before anything is traced or timed."""
    from kiln.tasks.commands.benching import check_timing_flags

    targets = list(dict.fromkeys(options.targets))
    if len(targets) > 1:
        raise KilnError(
            f"{prog} times one target at a time",
            expected="one --target",
            found=" ".join(f"--target {t}" for t in targets),
            hint="run it once per target",
        )
    check_timing_flags(options.iter, options.warmup, options.device)
