"""One instance checked on targets against the cpu oracle: the reports and how they read.

``check_instance`` is the one check `kiln test`, the `test:` doit tasks and app
tests run; the report cache (report_cache.py) keys its verdicts.
"""

from __future__ import annotations

import os
import time

from kiln.errors import KilnError
from kiln.tasks.model.project import KernelInstance, Project

ORACLE = "cpu"


# What a project that declares no target of its own is tested on: the built-in
# targets that need no extra and no device (the others run with --target).
BUILTIN_TEST_TARGETS = ("sim",)
# why a check of a cpu target is skipped, even when --target asks for it
ORACLE_ITSELF = (
    "cpu is the oracle the other targets are checked against: compared with itself it proves "
    "nothing"
)


def default_targets(project: Project) -> list[str]:
    """The targets `kiln test` and the `test:` tasks check when no --target is given.

    Every non-cpu target pipeline.yaml declares; with none declared, the
    built-in ``sim``, so that the built-in iree targets do not make a
    minimal project's tests need kiln-kernels[iree] and a GPU.
    """
    pipeline = project.pipeline
    checked = [t.name for t in pipeline.targets if t.runner != ORACLE]
    declared = [name for name in checked if not pipeline.is_builtin(f"targets.{name}")]
    return declared or [name for name in checked if name in BUILTIN_TEST_TARGETS]


def merged_tolerance(project: Project, target: str, kernel_tolerance: dict | None):
    """Per-dtype defaults, overridden by the target's tolerance, then by the kernel's."""
    spec = next((t for t in project.pipeline.targets if t.name == target), None)
    merged = dict(spec.tolerance or {}) if spec is not None else {}
    merged.update(kernel_tolerance or {})
    return merged or None


def output_tolerance(dtype: str, tolerance: dict | None) -> dict | None:
    """The override an output of ``dtype`` is compared under: a float's only.

    i32 and bool outputs (indices, counts, masks) always match exactly: a
    tolerance that gives half floats room must not let an index be off by one.
    """
    from kiln.ir.ops import FLOAT_DTYPES

    return tolerance if dtype in FLOAT_DTYPES else None


def is_oracle(project: Project, target: str) -> bool:
    """Whether ``target`` runs the cpu oracle: checking it compares the oracle with itself."""
    spec = next((t for t in project.pipeline.targets if t.name == target), None)
    return (spec.runner if spec is not None else target) == ORACLE


def check_instance(
    project: Project, inst: KernelInstance, targets: list[str], seed: int = 0
) -> list[dict]:
    """Run ``inst`` on each target with the oracle's inputs; one report dict per target.

    A pass or fail whose oracle output checks little (all zeros, constant,
    non-finite: ``kiln.compare.vacuity``) carries ``warnings``;
    ``strict_verdict`` turns them into a failure.
    """
    from kiln.compare import compare
    from kiln.runners.cpu import CpuRunner
    from kiln.tasks.checks.report_cache import report_cache
    from kiln.tasks.checks.results import binary_digest
    from kiln.tasks.checks.targets import (
        instance_inputs,
        kernel_artifacts,
        make_runner,
        runner_errors,
    )

    artifacts = kernel_artifacts(project, inst)
    graph = artifacts.graph
    expected = inputs = oracle_error = None
    warnings: list[str] = []
    kernel_tolerance = project.pipeline.kernel(inst.kernel).tolerance
    binary = binary_digest(project, inst)  # what `kiln view` tells a result of an older build by
    reports = []
    for target in targets:
        runner = make_runner(project, target)
        tolerance = merged_tolerance(project, target, kernel_tolerance)
        report = {
            "kernel": inst.name,
            "path": inst.source.path,
            "target": target,
            "seed": seed,
            "binary": binary,
        }
        reason = ORACLE_ITSELF if is_oracle(project, target) else runner.unavailable()
        if reason:
            reports.append({**report, "status": "skipped", "reason": reason})
            continue
        cache = report_cache(
            project, inst, target, runner, tolerance, seed, function=artifacts.function
        )
        found = cache.fetch() if cache is not None else None
        if found is not None:
            found["warnings"] = _placed(found.get("warnings", []), project, inst)
            if not found["warnings"]:
                del found["warnings"]
            reports.append({**found, **report})
            continue
        if expected is None and oracle_error is None:
            # the oracle runs once, for the first target not in the cache
            inputs = instance_inputs(project, inst, graph, seed)
            oracle = CpuRunner()
            try:
                expected = oracle.run(oracle.prepare(artifacts), inputs).outputs
            except KilnError as err:
                oracle_error = err.render()
            except Exception as exc:  # the kernel's own Python, run eagerly: its problem
                oracle_error = oracle_failure(inst, exc).render()
            else:
                warnings = vacuous_check_warnings(project, inst, expected)
        if oracle_error is not None:  # nothing to compare against: each target errs
            reports.append({**report, "status": "error", "message": oracle_error, "seconds": 0.0})
            continue
        start = time.perf_counter()
        try:
            with runner_errors(target, runner):  # a plugin's crash is this check's error
                result = runner.run(runner.prepare(artifacts), inputs)
        except KilnError as err:
            reports.append(
                {
                    **report,
                    "status": "error",
                    "message": err.render(),
                    "seconds": time.perf_counter() - start,
                }
            )
            continue
        comparisons = []
        if len(result.outputs) != len(expected):
            problem = f"{len(result.outputs)} outputs, expected {len(expected)}"
            comparisons.append({"ok": False, "output": -1, "problem": problem, "text": problem})
        for i, (e, a, node) in enumerate(
            zip(expected, result.outputs, graph.output_nodes, strict=False)
        ):
            c = compare(i, e, a, node.dtype, output_tolerance(node.dtype, tolerance))
            comparisons.append({**c.to_dict(), "text": c.describe()})
        ok = all(c["ok"] for c in comparisons)
        report = {
            **report,
            "status": "pass" if ok else "fail",
            "seconds": time.perf_counter() - start,
            "outputs": comparisons,
            "metrics": {
                k: v for k, v in result.metrics.items() if isinstance(v, (int, float, str))
            },
        }
        if warnings:
            report["warnings"] = list(warnings)
        if cache is not None:  # its warnings name no pipeline file: another may fetch it
            where = _inputs_place(project, inst)
            cache.store({**report, "warnings": [w.replace(where, PLACE) for w in warnings]})
        reports.append(report)
    return reports


PLACE = "{inputs}"  # a cached warning's stand-in for where the reader sets the inputs


def _placed(warnings: list[str], project: Project, inst: KernelInstance) -> list[str]:
    """A cached report's warnings, naming this run's pipeline file and key."""
    where = _inputs_place(project, inst)
    return [w.replace(PLACE, where) for w in warnings]


def _inputs_place(project: Project, inst: KernelInstance) -> str:
    """Where a vacuous check's warning tells the user to choose the inputs."""
    try:
        key = project.pipeline.kernel(inst.kernel).key_path + ".inputs"
    except KeyError:  # an instance pipeline.yaml does not declare
        key = f"kernels.{inst.kernel}.inputs"
    return f"`{key}` in {project.pipeline_path.name}"


def vacuous_check_warnings(project: Project, inst: KernelInstance, expected: list) -> list[str]:
    """One warning per oracle output that checks little for these inputs, naming it."""
    from kiln.compare import vacuity

    where = _inputs_place(project, inst)
    found = []
    for index, array in enumerate(expected):
        why = vacuity(array)
        if why is not None:
            found.append(
                f"vacuous check: the oracle's output {index} {why} for these inputs, so "
                f"matching it proves little; choose the arguments' values under {where} "
                "(docs/pipeline.md#inputs)"
            )
    return found


def strict_verdict(report: dict) -> dict:
    """``--strict``: a pass whose check was vacuous is a failure, saying why."""
    if report.get("status") != "pass" or not report.get("warnings"):
        return report
    return {**report, "status": "fail", "strict": True}


def oracle_failure(inst: KernelInstance, exc: Exception) -> KilnError:
    """The error of a kernel whose eager run on the host (the oracle) raised ``exc``.

    Points at the deepest line of the kernel's own file in the traceback.
    """
    import traceback

    from kiln.errors import Location

    where = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if os.path.realpath(frame.filename) == os.path.realpath(inst.source.file):
            where = Location(inst.source.file, frame.lineno, None, source=frame.line)
    return KilnError(
        f"kernel {inst.kernel!r} raised {type(exc).__name__} when run on the host (the oracle "
        f"every target is checked against): {exc}",
        location=where,
        hint="the oracle runs the @device function as plain Python with numpy arrays: "
        "fix the kernel so it runs there too",
    )


def format_report(r: dict) -> str:
    head = f"{r['status'].upper():7} {r['kernel']} @ {r['target']}"
    if r["status"] == "skipped":
        return f"{head}: {r['reason']}"
    if r["status"] == "error":
        return f"{head}\n" + "\n".join("    " + line for line in r["message"].splitlines())
    lines = [head]
    for c in r["outputs"]:
        if c.get("problem") or not c["ok"] or r["status"] == "fail" and not r.get("strict"):
            lines.append("    " + (c.get("text") or c.get("problem", "")))
    if r["status"] == "pass" or r.get("strict"):
        worst = max((c["max_abs"] for c in r["outputs"]), default=0.0)
        lines[0] += f"  (max abs err {worst:.2g}" + (", cached" if r.get("cache") else "") + ")"
    prefix = "error (--strict)" if r.get("strict") else "warning"
    lines += [f"    {prefix}: {w}" for w in r.get("warnings", ())]
    return "\n".join(lines)


def build_error_report(inst: KernelInstance, target: str, seed: int, why: str) -> dict:
    """The report of a target that could not be tested because the kernel did not build."""
    return {
        "kernel": inst.name,
        "path": inst.source.path,
        "target": target,
        "seed": seed,
        "status": "error",
        "stage": "compile",
        "message": why,
        "seconds": 0.0,
    }


def skipped_report(inst: KernelInstance, target: str, seed: int, why: str) -> dict:
    """The report of a check that did not run: its target cannot run here."""
    report = {"kernel": inst.name, "path": inst.source.path, "target": target, "seed": seed}
    return {**report, "status": "skipped", "reason": why}
