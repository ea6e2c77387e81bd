"""`kiln test KERNEL --fuzz N`: the kernel at N drawn shape bindings, every target checked.

The bindings come from tasks/commands/fuzz.py (seeded, so the same seed gives the
same ones). Each is built as a temporary instance, shape set
``fuzz_M17_N1``, through the compile action's own chain, cache and early
cutoff, in a scratch directory under the state dir (``.kiln/fuzz/``) that
is removed afterwards: nothing lands in the out dir, where a build would
take it for a declared instance. Each target is checked against the oracle
with the kernel's configured ``inputs:`` as `kiln test` checks it.

A binding the kernel's own shape rules refuse (the trace or a stage says
no: a reshape that does not divide, a tile the machine cannot hold) is
skipped and counted, not failed; a wrong result, a target's error or a
stage that breaks its own IR is a failure, reported with the binding, the
seed and the pipeline.yaml line that declares it.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import sys

from kiln.errors import KilnError, StageError, TraceError
from kiln.tasks.commands.fuzz import (
    DEFAULT_HIGH,
    DEFAULT_LOW,
    describe,
    distinct_bindings,
    draw_bindings,
    shape_set_name,
    snippet,
    symbolic_dims,
    tile_sizes,
)
from kiln.tasks.model.project import KernelInstance, Project

FUZZ_DIR = "fuzz"  # under the state dir: the temporary instances' out dirs


def fuzzed_instances(chosen, count: int) -> list[KernelInstance]:
    """The one kernel ``--fuzz`` works on (its instances); an error for an app or several."""
    if chosen.app is not None:
        raise KilnError(
            f"--fuzz draws shapes for one kernel; {chosen.app!r} is an app",
            expected="kiln test KERNEL --fuzz N",
            found=f"kiln test {chosen.app} --fuzz {count}",
            hint="name one of the kernels the app calls",
        )
    kernels = list(dict.fromkeys(inst.kernel for inst in chosen.instances))
    if len(kernels) != 1:
        shown = ", ".join(kernels[:5]) + (", ..." if len(kernels) > 5 else "")
        raise KilnError(
            f"--fuzz draws shapes for one kernel, but the selection holds {len(kernels)}: {shown}",
            expected="kiln test KERNEL --fuzz N, with a FILTER that names one kernel",
            found=f"{len(kernels)} kernels",
            hint=f"run `kiln test {kernels[0]} --fuzz {count}`" if kernels else None,
        )
    return chosen.instances


def fuzz_ranges(project: Project, kernel: str, dims: list[str]) -> dict[str, tuple[int, int]]:
    """pipeline.yaml's ``fuzz:`` ranges of ``kernel``; a dim it does not have is an error."""
    spec = project.pipeline.kernel(kernel)
    ranges = dict(spec.fuzz)
    for dim in ranges:
        if dim not in dims:
            from kiln.pipeline.yamlpos import did_you_mean

            raise project.pipeline.error(
                f"kernel {kernel!r} has no dim {dim!r} to fuzz",
                f"{spec.key_path}.fuzz.{dim}",
                expected="one of its symbolic dims: " + ", ".join(dims),
                found=repr(dim),
                hint=did_you_mean(dim, dims),
            )
    return ranges


def draw_for(
    project: Project, inst: KernelInstance, count: int, seed: int, bounds: dict | None = None
) -> list[dict]:
    """The bindings ``--fuzz count --seed seed`` checks for ``inst``'s kernel;
    ``bounds``: its ``fuzz_bounds`` when the caller has them already."""
    dims = symbolic_dims(inst.source.params)
    if not dims:
        raise KilnError(
            f"kernel {inst.kernel!r} has no symbolic dims to fuzz: every argument's shape is fixed",
            expected='a kernel whose arguments name their dims, as Tensor["M", "K"]',
            found=f"def {inst.source.name}({', '.join(a for a, _ in inst.source.params)})",
            hint=f"`kiln test {inst.kernel}` checks it at its one shape",
        )
    ranges = fuzz_bounds(project, inst, dims) if bounds is None else bounds
    options = [project.pipeline.stage_options(inst.kernel, s.name) for s in project.pipeline.stages]
    tiles = tile_sizes(project.kernel_machine(inst.kernel), options)
    return draw_bindings(dims, ranges, count, seed, tiles, inst.source.params)


def fuzz_bounds(
    project: Project, inst: KernelInstance, dims: list[str], fixed: dict | None = None
) -> dict:
    """Each dim's (low, high): ``fuzz:``'s ranges, a dim read from a ``.npy`` input fixed
    at that file's size (every binding then matches the file; none is skipped for it).
    ``fixed``: ``npy_fixed_dims``, when the caller has read them already."""
    ranges = fuzz_ranges(project, inst.kernel, dims)
    for dim, (size, _) in (npy_fixed_dims(project, inst) if fixed is None else fixed).items():
        ranges[dim] = (size, size)
    return ranges


def npy_fixed_dims(project: Project, inst: KernelInstance) -> dict[str, tuple[int, str]]:
    from kiln.inputs import npy_dims

    try:
        specs = project.pipeline.kernel(inst.kernel).input_specs()
    except KeyError:  # an instance pipeline.yaml does not declare
        return {}
    return npy_dims(specs, inst.source.params, project.root)


def run_fuzz(project: Project, instances: list[KernelInstance], args) -> int:
    """Draw, build and check ``args.fuzz`` bindings; 1 when any failed."""
    from kiln.logconfig import verbosity
    from kiln.tasks.checks.verdicts import default_targets

    count, seed = args.fuzz, args.seed
    first = instances[0]
    fixed = npy_fixed_dims(project, first)  # each .npy input read once
    bounds = fuzz_bounds(project, first, symbolic_dims(first.source.params), fixed)
    bindings = draw_for(project, first, count, seed, bounds)
    targets = args.target or default_targets(project)
    unavailable = getattr(args, "unavailable", None) or {}
    runnable = [t for t in dict.fromkeys(targets) if t not in unavailable]
    dims = ", ".join(symbolic_dims(first.source.params))
    if verbosity() > 0:
        print(
            f"kiln test: fuzzing {first.kernel} at {len(bindings)} shape binding(s) of {dims} "
            f"on {', '.join(runnable) or 'no target'} (seed {seed})",
            flush=True,
        )
        for dim, (size, path) in fixed.items():
            print(f"kiln test: {dim} = {size}, as {path} has it (an npy input)", flush=True)
    if len(bindings) < count:
        held = distinct_bindings([bounds.get(d, (DEFAULT_LOW, DEFAULT_HIGH)) for d in bindings[0]])
        why = f"the fuzz ranges hold {held}" if held < count else "no more distinct ones came"
        print(f"kiln test: {len(bindings)} of {count} binding(s) drawn: {why}")
    scratch = project.state_dir / FUZZ_DIR
    shutil.rmtree(scratch, ignore_errors=True)  # a run killed midway left it
    try:
        outcomes = _check_all(project, first, bindings, runnable, args, scratch, verbosity() == 0)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return _finish(project, first, outcomes, args)


def _check_all(project, first, bindings, targets, args, scratch, quiet) -> list[dict]:
    from kiln.tasks.dag.compile import instance_specs

    sandbox = copy.copy(project)  # its stamps and manifests index stay in the scratch dir
    sandbox.state_dir = scratch / "state"
    sandbox.out_dir = scratch
    made = [
        KernelInstance(
            first.kernel,
            shape_set_name(b),
            tuple(b.items()),
            first.source,
            scratch / first.kernel / shape_set_name(b),
        )
        for b in bindings
    ]
    from kiln.tasks.dag.loader import fail_fast_requested

    specs = instance_specs(sandbox, made)
    fail_fast = getattr(args, "fail_fast", False) or fail_fast_requested()
    outcomes = []
    for binding, inst, spec in zip(bindings, made, specs, strict=True):
        outcome = check_binding(project, inst, spec, binding, targets, args)
        outcomes.append(outcome)
        _print_outcome(project, outcome, quiet)
        if fail_fast and outcome["status"] == "fail" and len(outcomes) < len(bindings):
            left = len(bindings) - len(outcomes)
            print(
                f"kiln test: stopped at the first failing binding (--fail-fast); "
                f"{left} binding(s) not checked",
                flush=True,
            )
            break
    return outcomes


def check_binding(project, inst, spec, binding: dict, targets: list[str], args) -> dict:
    """One binding: built, then checked on each target; its outcome and reports."""
    from kiln.tasks.checks.verdicts import (
        build_error_report,
        check_instance,
        skipped_report,
        strict_verdict,
    )

    seed = args.seed
    kernel = project.pipeline.kernel(inst.kernel)
    # a kernel with one flat set of sizes (`shapes: {N: 64}`) takes named sets only with it
    flat = dict(kernel.shapes) if kernel.shape_set_names == ("default",) else {}
    outcome = {
        "kernel": inst.kernel,
        "instance": inst.name,
        "binding": dict(binding),
        "seed": seed,
        "entry": kernel.key_path,
        "snippet": snippet(binding, {name: dict(dims) for name, dims in flat.items()}),
    }
    refused = too_large(project, inst, binding)
    error = None
    if refused is None:
        refused, error = build_binding(inst, spec)
    reports: list[dict] = []
    if refused is None and error is None:
        try:
            reports = check_instance(project, inst, targets, seed)
        except KilnError as err:
            if not hasattr(err, "argument"):  # not the inputs: a real problem
                raise
            refused = f"its inputs cannot be drawn at this size: {err.message}"
        if getattr(args, "strict", False):
            reports = [strict_verdict(r) for r in reports]
    if refused is not None:
        reports = [skipped_report(inst, t, seed, refused) for t in targets]
        status = "skipped"
        outcome["reason"] = refused
    elif error is not None:
        reports = [build_error_report(inst, t, seed, error) for t in targets]
        status = "fail"
    else:
        found = {r["status"] for r in reports}
        status = "fail" if found & {"fail", "error"} else "pass" if "pass" in found else "skipped"
        if status == "skipped":
            outcome["reason"] = "; ".join(sorted({r.get("reason", "") for r in reports}))
    fuzz = {k: outcome[k] for k in ("binding", "seed", "snippet", "entry")}
    outcome["status"] = status
    outcome["reports"] = [{**r, "fuzz": fuzz} for r in reports]
    return outcome


def build_binding(inst: KernelInstance, spec) -> tuple[str | None, str | None]:
    """Build one binding's instance: (why its shape rules refuse it, or the failure), or neither.

    A stage that says no to the sizes (a TraceError or StageError: a reshape
    that does not divide, a tile the machine cannot hold) refuses; a stage
    that breaks its own IR (VerifyError), any other error and a crash fail.
    """
    from kiln.driver import StageFailed
    from kiln.tasks.dag.chain_action import build_chain

    try:
        build_chain(spec)
    except StageFailed as failed:
        err = failed.error
        if isinstance(err, (TraceError, StageError)) and not failed.options:
            return f"stage {failed.stage.name!r} refuses it: {err.message}", None
        err.notes.append(f"while running stage {failed.stage.name!r} of {inst.name}")
        return None, err.render()
    except KilnError as err:
        return None, err.render()
    except Exception as exc:  # a bug in a stage: a failure the fuzzer found
        return None, f"internal error building {inst.name}: {type(exc).__name__}: {exc}"
    return None, None


def too_large(project: Project, inst: KernelInstance, binding: dict) -> str | None:
    """Why an argument at ``binding`` is too large to exist (as pipeline.yaml refuses it)."""
    from kiln.ir.graph import ITEMSIZE, MAX_TENSOR_BYTES

    spec = project.pipeline.kernel(inst.kernel)
    for arg, dims in inst.source.params:
        sizes = [binding.get(d, 1) if isinstance(d, str) else d for d in dims or ()]
        size = math.prod(sizes) * ITEMSIZE[spec.arg_dtype(arg)]
        if size > MAX_TENSOR_BYTES:
            return f"argument {arg!r} would take {size:,} bytes, above the limit per argument"
    return None


def _print_outcome(project: Project, outcome: dict, quiet: bool) -> None:
    from kiln.tasks.checks.verdicts import format_report

    if outcome["status"] == "skipped":
        if not quiet:
            print(
                f"SKIPPED {outcome['instance']} ({describe(outcome['binding'])}): "
                f"{outcome['reason']}",
                flush=True,
            )
        return
    for report in outcome["reports"]:
        if quiet and report["status"] in ("pass", "skipped"):
            continue
        print(format_report(report), flush=True)
    if outcome["status"] == "fail":
        print(reproduce_lines(project, outcome), flush=True)


def reproduce_lines(project: Project, outcome: dict) -> str:
    """How to check a failing binding again: the binding, the seed, the line to declare it."""
    seed = outcome["seed"]
    return "\n".join(
        [
            f"    binding: {describe(outcome['binding'])} (--seed {seed})",
            f"    declare it under {outcome['entry']} in {project.pipeline_path.name} "
            "(beside its shape sets): "
            f"{outcome['snippet']}",
            f"    then: kiln test {outcome['instance']} --seed {seed}",
        ]
    )


def _finish(project: Project, first: KernelInstance, outcomes: list[dict], args) -> int:
    from kiln.fsutil import write_bytes_atomic

    counts = {s: sum(o["status"] == s for o in outcomes) for s in ("pass", "fail", "skipped")}
    seed = args.seed
    print(
        f"fuzz: {len(outcomes)} bindings, {counts['pass']} passed, {counts['fail']} failed, "
        f"{counts['skipped']} skipped (seed {seed})"
    )
    if outcomes and counts["skipped"] == len(outcomes):
        print(
            f"kiln test: every binding was skipped: {first.kernel} was checked at no size",
            file=sys.stderr,
        )
    reports = [r for o in outcomes for r in o["reports"]]
    summary = {
        "kernel": first.kernel,
        "seed": seed,
        "asked": args.fuzz,
        "bindings": [{k: v for k, v in o.items() if k != "reports"} for o in outcomes],
        "passed": counts["pass"],
        "failed": counts["fail"],
        "skipped": counts["skipped"],
    }
    report_file = project.out_dir / "test-report.json"
    report_file.parent.mkdir(parents=True, exist_ok=True)
    doc = {"reports": reports, "fuzz": summary}
    write_bytes_atomic(report_file, json.dumps(doc, indent=1, sort_keys=True).encode())
    if args.junit:
        from kiln.tasks.checks.junit import write_junit

        write_junit(args.junit, reports)
    return 1 if counts["fail"] else 0
