"""`kiln bench`: time kernels on one or more targets; a table, CSV or JSON."""

from __future__ import annotations

import csv
import io
import json
import statistics
import time

from kiln.errors import TargetError


def instances_at_shape(project, instances: list, text: str) -> list:
    """``--shape M=64,K=32``: each selected kernel at those sizes, as a one-off instance.

    The instance is named after its sizes (``gemm.shape_M64_K32``) like an
    app's JIT call, so it builds, caches and reports like a declared one.
    """
    import re

    from kiln.errors import KilnError

    if not text.strip():
        raise KilnError("--shape needs sizes", expected="NAME=SIZE[,NAME=SIZE...]", found=text)
    sizes: dict[str, int] = {}
    for part in re.split(r"\s*,\s*|\s+", text.strip()):
        if not part:
            raise KilnError(
                "--shape: an empty entry between two commas",
                expected="comma-separated NAME=SIZE pairs, e.g. --shape M=64,K=32,N=16",
                found=text,
            )
        name, eq, value = part.partition("=")
        if not eq or not name.isidentifier() or not value.strip().lstrip("+").isdigit():
            raise KilnError(
                f"--shape: cannot read {part!r}",
                expected="comma-separated NAME=SIZE pairs, e.g. --shape M=64,K=32,N=16",
                found=text,
            )
        size = int(value)
        if size < 1:
            raise KilnError(f"--shape: {name} must be at least 1", found=part)
        if name in sizes:
            raise KilnError(
                f"--shape: {name} is given twice",
                expected="each dim once, e.g. --shape M=64,K=32,N=16",
                found=text,
            )
        sizes[name] = size
    kernels = sorted({inst.kernel for inst in instances})
    if len(kernels) > 1:
        raise KilnError(
            f"--shape sizes one kernel; the selection holds {len(kernels)}",
            expected="one kernel: kiln bench KERNEL --shape ...",
            found=", ".join(kernels[:6]) + (", ..." if len(kernels) > 6 else ""),
            hint="name the kernel to time as the FILTER",
        )
    chosen, seen = [], set()
    for inst in instances:
        if inst.kernel in seen:
            continue
        seen.add(inst.kernel)
        symbols = sorted(
            {d for _, dims in inst.source.params for d in dims or () if isinstance(d, str)}
        )
        missing = [d for d in symbols if d not in sizes]
        extra = sorted(set(sizes) - set(symbols))
        if missing or extra:
            raise KilnError(
                f"--shape does not fit kernel {inst.kernel!r}",
                expected="a size for each of its dims: " + (", ".join(symbols) or "(none)"),
                found=text,
                notes=[f"missing: {', '.join(missing)}"] * bool(missing)
                + [f"unknown: {', '.join(extra)}"] * bool(extra),
            )
        bindings = tuple((d, sizes[d]) for d in symbols)
        shape_set = "shape_" + "_".join(f"{d}{v}" for d, v in bindings)
        try:
            chosen.append(project.add_instance(inst.kernel, inst.source, shape_set, bindings))
        except KilnError as err:  # sizes too large: about --shape, not a pipeline.yaml line
            err.location = None
            err.message = f"--shape {text}: {err.message}"
            err.hint = "pick smaller sizes"
            raise

    return chosen


def check_timing_flags(iters: int, warmup: int, device: int) -> None:
    """``--iter`` >= 1, ``--warmup`` and ``--device`` >= 0, before anything is built or timed."""
    from kiln.errors import KilnError

    for flag, value, least in (
        ("--iter", iters, 1),
        ("--warmup", warmup, 0),
        ("--device", device, 0),
    ):
        if value < least:  # an empty timing table is not a result
            raise KilnError(
                f"{flag} must be at least {least}",
                expected=f"{flag} N with N >= {least}",
                found=str(value),
            )


def time_runner(runner, prepared, inputs, iters: int, warmup: int) -> list[float]:
    """Seconds per call; a runner with its own ``time`` (device-side timing) is preferred."""
    own = getattr(runner, "time", None)
    if own is not None:
        return list(own(prepared, inputs, iters=iters, warmup=warmup))
    for _ in range(warmup):
        runner.run(prepared, inputs)
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        runner.run(prepared, inputs)
        samples.append(time.perf_counter() - start)
    return samples


def ready_runner(project, target: str, device: int):
    """The target's runner, on device index ``device``; a TargetError if it cannot run here."""
    from kiln.tasks.checks.targets import make_runner

    runner = make_runner(project, target)
    if device and not runner.host_only:  # --target cpu --target iree-cuda --device 1
        runner.options["device_index"] = device
    reason = runner.unavailable()
    if reason:
        raise TargetError(f"target {target!r} is not available here: {reason}")
    return runner


def bench_rows(project, instances, target: str, runner, iters: int, warmup: int):
    from kiln.ir.cost import flops, io_bytes
    from kiln.tasks.checks.targets import instance_inputs, kernel_artifacts, runner_errors

    rows = []
    for inst in instances:
        artifacts = kernel_artifacts(project, inst)
        graph = artifacts.graph
        inputs = instance_inputs(project, inst, graph)
        row = {"kernel": inst.name, "target": target}
        if runner.kind == "sim":
            with runner_errors(target, runner):  # a plugin's crash: one message, no traceback
                metrics = runner.run(runner.prepare(artifacts), inputs).metrics
            row.update(
                cycles=metrics.get("cycles"),
                sim_us=metrics.get("microseconds"),
                instructions=metrics.get("instructions"),
            )
        else:
            with runner_errors(target, runner):
                samples = time_runner(runner, runner.prepare(artifacts), inputs, iters, warmup)
            median, best = statistics.median(samples), min(samples)
            row.update(
                median_ms=median * 1e3,
                min_ms=best * 1e3,
                gflops=flops(graph) / median / 1e9,
                gbps=io_bytes(graph) / median / 1e9,
            )
        rows.append(row)
    return rows


def render(rows: list[dict], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(rows, indent=1, sort_keys=True) + "\n"
    columns = list(dict.fromkeys(k for r in rows for k in r))
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return buf.getvalue()
    from rich.console import Console
    from rich.table import Table

    table = Table(title="kiln bench")
    for c in columns:
        table.add_column(c, justify="left" if c in ("kernel", "target") else "right")
    for r in rows:
        table.add_row(*[_fmt(r.get(c)) for c in columns])
    console = Console(file=io.StringIO(), width=120, force_terminal=False)
    console.print(table)
    return console.file.getvalue()


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def run_bench(project, instances: list, args) -> int:
    import contextlib
    import sys

    from kiln.tasks.commands.running import build_each

    targets = list(dict.fromkeys(args.target))  # in the order given, each once
    # every target is checked before anything is built or timed: an unusable one
    # (no GPU, no plugin) costs no waiting
    runners = {target: ready_runner(project, target, args.device) for target in targets}
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the table/CSV/JSON
        unbuilt = build_each(project, instances, fail_fast=getattr(args, "fail_fast", False))
    built = [inst for inst in instances if inst.name not in unbuilt]
    from kiln.tasks.checks.results import binary_digest, save_bench_row

    rows = []
    for target, runner in runners.items():
        timed = bench_rows(project, built, target, runner, args.iter, args.warmup)
        for inst, row in zip(built, timed, strict=True):
            # the last numbers, for `kiln view`, with the binary they are of
            save_bench_row(inst.out_dir, {**row, "binary": binary_digest(project, inst)})
        rows += timed
    print(render(rows, args.output_format), end="")
    if len(unbuilt) == 1:
        print(f"kiln bench: {next(iter(unbuilt))} not timed: it did not build", file=sys.stderr)
    elif unbuilt:  # their errors were printed once each by the build
        from kiln.logconfig import verbosity
        from kiln.tasks.chain.failure_groups import affected

        not_timed = affected(list(unbuilt), verbosity() >= 2)
        print(f"kiln bench: not timed, as they did not build: {not_timed}", file=sys.stderr)
    return 1 if unbuilt else 0
