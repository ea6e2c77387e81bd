"""`kiln test` and the `test:<kernel>@<target>` tasks: every target against the oracle."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from kiln.tasks.compile import stage_artifact
from kiln.tasks.digest import ConfigStamps, digest_json
from kiln.tasks.failure_groups import affected
from kiln.tasks.project import KernelInstance, Project

from kiln.errors import KilnError

ORACLE = "cpu"
# What a project that declares no target of its own is tested on: the built-in
# targets that need no extra and no device (the others run with --target).
BUILTIN_TEST_TARGETS = ("sim",)


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


def check_instance(
    project: Project, inst: KernelInstance, targets: list[str], seed: int = 0
) -> list[dict]:
    """Run ``inst`` on each target with the oracle's inputs; one report dict per target.

    A pass or fail whose oracle output checks little (all zeros, constant,
    non-finite: ``kiln.compare.vacuity``) carries ``warnings``;
    ``strict_verdict`` turns them into a failure.
    """
    from kiln.runners.cpu import CpuRunner
    from kiln.tasks.report_cache import report_cache
    from kiln.tasks.running import instance_inputs, kernel_artifacts, make_runner

    from kiln.compare import compare

    artifacts = kernel_artifacts(project, inst)
    graph = artifacts.graph
    expected = inputs = oracle_error = None
    warnings: list[str] = []
    kernel_tolerance = project.pipeline.kernel(inst.kernel).tolerance
    reports = []
    for target in targets:
        runner = make_runner(project, target)
        tolerance = merged_tolerance(project, target, kernel_tolerance)
        report = {"kernel": inst.name, "path": inst.source.path, "target": target, "seed": seed}
        reason = runner.unavailable()
        if reason:
            reports.append({**report, "status": "skipped", "reason": reason})
            continue
        cache = report_cache(
            project, inst, target, runner, tolerance, seed, function=artifacts.function
        )
        found = cache.fetch() if cache is not None else None
        if found is not None:
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
            comparisons.append(
                {
                    "ok": False,
                    "output": -1,
                    "problem": f"{len(result.outputs)} outputs, expected {len(expected)}",
                }
            )
        for i, (e, a, node) in enumerate(
            zip(expected, result.outputs, graph.output_nodes, strict=False)
        ):
            c = compare(i, e, a, node.dtype, tolerance)
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
        if cache is not None:
            cache.store(report)
        reports.append(report)
    return reports


def vacuous_check_warnings(project: Project, inst: KernelInstance, expected: list) -> list[str]:
    """One warning per oracle output that checks little for these inputs, naming it."""
    from kiln.compare import vacuity

    try:
        where = project.pipeline.kernel(inst.kernel).key_path + ".inputs"
    except KeyError:  # an instance pipeline.yaml does not declare
        where = f"kernels.{inst.kernel}.inputs"
    found = []
    for index, array in enumerate(expected):
        why = vacuity(array)
        if why is not None:
            found.append(
                f"vacuous check: the oracle's output {index} {why} for these inputs, so "
                f"matching it proves little; choose the arguments' values under `{where}` "
                f"in {project.pipeline_path.name} (docs/pipeline.md#inputs)"
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


def run_tests(project: Project, instances: list, args) -> int:
    from kiln.tasks.results import save_test_report
    from kiln.tasks.running import build_each

    from kiln.fsutil import write_bytes_atomic

    targets = args.target or default_targets(project)
    # the targets that cannot run here, found before the build (kiln/target_check.py)
    # and said once there: each of their checks is a skip, recorded but not printed
    unavailable = getattr(args, "unavailable", None) or {}
    if not unavailable:
        for t in targets:
            from kiln.tasks.running import make_runner

            make_runner(project, t)  # unknown target: error before building anything
    runnable = [t for t in targets if t not in unavailable]
    # every instance that builds is tested; one that does not is an error of each target
    unbuilt = build_each(project, instances, fail_fast=getattr(args, "fail_fast", False))
    from kiln.logconfig import verbosity

    quiet = verbosity() == 0  # -q: only failures (fail, error) and the summary
    causes = build_error_groups(unbuilt)  # one build error, printed once with what it hit
    errors = ErrorsOnce()  # so is one error of many checks
    reports = []
    for inst in instances:
        if inst.name in unbuilt:
            found = [build_error_report(inst, t, args.seed, unbuilt[inst.name]) for t in runnable]
            same = causes.get(inst.name)
            if same is not None and found:  # the first instance of its error speaks for all
                print(format_report(found[0]), flush=True)
                for report in found[1:]:
                    print(f"ERROR   {inst.name} @ {report['target']}: the same build error")
                if len(same) > 1:
                    print(f"    the same build error: {affected(same, verbosity() >= 2)}")
            for report in found:
                reports.append(report)
                save_test_report(inst.out_dir, report)
            found = []
        else:
            found = check_instance(project, inst, runnable, args.seed)
            if getattr(args, "strict", False):
                found = [strict_verdict(r) for r in found]
        found += [skipped_report(inst, t, args.seed, why) for t, why in unavailable.items()]
        for report in found:
            said = report["status"] == "skipped" and report["target"] in unavailable
            said = said or report["status"] == "error" and errors.seen(report)
            if not said and not (quiet and report["status"] in ("pass", "skipped")):
                print(format_report(report), flush=True)
            reports.append(report)
            save_test_report(inst.out_dir, report)  # the last result, for `kiln view`
    counts = {
        s: sum(r["status"] == s for r in reports) for s in ("pass", "fail", "error", "skipped")
    }
    for line in errors.summary(verbosity() >= 2):
        print(line)
    print("kiln test: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    print_notes(reports, strict=getattr(args, "strict", False))
    report_file = project.out_dir / "test-report.json"
    report_file.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(
        report_file, json.dumps({"reports": reports}, indent=1, sort_keys=True).encode()
    )
    if args.junit:
        from kiln.tasks.junit import write_junit

        write_junit(args.junit, reports)
    if counts["fail"] or counts["error"]:
        return 1
    by_target: dict[str, list[dict]] = {}
    for r in reports:
        by_target.setdefault(r["target"], []).append(r)
    skipped = {
        t: mine[0]["reason"]
        for t, mine in by_target.items()
        if all(r["status"] == "skipped" for r in mine)
    }
    return asked_for_and_unavailable(args.target or [], skipped)


class ErrorsOnce:
    """Check errors with one cause (a kernel the oracle cannot run, at every shape set):
    the first is printed in full, the others counted and named once at the end."""

    def __init__(self) -> None:
        self.checks: dict[str, list[str]] = {}  # cause key -> the checks it hit, first first

    def seen(self, report: dict) -> bool:
        """Record an error report; True when one with its cause was printed already."""
        from kiln.tasks.failure_groups import cause_key

        key = cause_key(f"test:{report['kernel']}", report.get("message", ""))
        hit = self.checks.setdefault(key, [])
        hit.append(f"{report['kernel']} @ {report['target']}")
        return len(hit) > 1

    def summary(self, verbose: bool) -> list[str]:
        return [
            f"ERROR   the same error as {hit[0]} above: {affected(hit, verbose, 'checks')}"
            for hit in self.checks.values()
            if len(hit) > 1
        ]


def build_error_groups(unbuilt: dict[str, str]) -> dict[str, list[str]]:
    """The first unbuilt instance of each build error -> every instance with that error."""
    from kiln.tasks.failure_groups import cause_key
    from kiln.tasks.reporter import last_run_failures

    failed, _ = last_run_failures()
    groups: dict[str, list[str]] = {}
    for name, why in unbuilt.items():
        task = f"compile:{name}"
        groups.setdefault(cause_key(task, failed.get(task, why)), []).append(name)
    return {names[0]: names for names in groups.values()}


def print_notes(reports: list[dict], strict: bool) -> None:
    """What the summary does not say: vacuous checks, and verdicts taken from the cache."""
    warned = sum(bool(r.get("warnings")) for r in reports)
    if warned and not strict:
        print(
            f"kiln test: {warned} check(s) with a vacuous-check warning (see above); "
            "--strict makes them failures"
        )
    checked = [r for r in reports if r["status"] in ("pass", "fail")]
    cached = sum(bool(r.get("cache")) for r in checked)
    if cached:
        everything = "all " if cached == len(checked) else ""
        print(
            f"kiln test: {everything}{cached} of {len(checked)} result(s) taken from the cache: "
            "nothing they depend on changed (graph, binary, kernel code, inputs, tolerance)"
        )


def asked_for_and_unavailable(asked: list[str], skipped: dict[str, str]) -> int:
    """2 when a target named with --target ran nowhere: a CI job asking for it tested nothing.

    ``skipped``: each target that could run nothing here, and why. Targets
    taken from pipeline.yaml are only skipped where they cannot run (a GPU
    target on a laptop); one asked for by name is an error, as it is for
    ``kiln run`` and ``kiln bench``, and for an app's tests (tasks/apps.py).
    """
    for target in dict.fromkeys(asked):
        if target in skipped:
            err = KilnError(
                f"--target {target} was asked for, but it cannot run here: {skipped[target]}",
                hint=f"drop --target {target} to test only the targets that can run here",
            )
            print(err.render(), file=sys.stderr, flush=True)
            return 2
    return 0


def test_tasks(project: Project, instances=None):
    """doit tasks ``test:<instance>@<target>``: a JSON report per pair, failing on mismatch."""
    last = project.pipeline.stages[-1]
    first = project.pipeline.stages[0]
    targets = default_targets(project)
    target_specs = {
        t.name: digest_json([t.runner, t.machine, sorted(t.options), t.tolerance])
        for t in project.pipeline.targets
    }
    stamps = ConfigStamps(project.state_dir / "config")
    from kiln.tasks.running import instance_input_specs

    from kiln.inputs import parse

    for inst in instances if instances is not None else project.instances:
        deps = sorted({stage_artifact(inst, last.module), stage_artifact(inst, first.module)})
        tolerance = digest_json(project.pipeline.kernel(inst.kernel).tolerance)
        specs = instance_input_specs(project, inst)
        # an .npy file is a file_dep of its own; no inputs: the stamp of before
        inputs = {"inputs": digest_json(sorted(specs.items()))} if specs else {}
        npy = [str(project.root / v["npy"]) for v in specs.values() if parse(v)[0].name == "npy"]
        for target in targets:
            report = str(inst.out_dir / f"test-{target}.json")
            yield {
                "name": f"{inst.name}@{target}",
                "actions": [
                    (_test_action, [str(project.pipeline_path), inst.name, target, report])
                ],
                "file_dep": [
                    *deps,
                    *npy,
                    stamps.path(
                        "test", {"target": target_specs[target], "tolerance": tolerance, **inputs}
                    ),
                ],
                "targets": [report],
                "uptodate": [(_report_passed, [report])],
                "clean": True,
                "doc": f"check {inst.name} on {target} against the cpu oracle",
            }


def _report_passed(report_path: str) -> bool:
    """A test task is done only while its report is a pass: `kiln test` writes its skips
    and failures to the same file, and an existing target must not make them look done."""
    from kiln.tasks.results import read_json

    doc = read_json(Path(report_path))
    return isinstance(doc, dict) and doc.get("status") == "pass"


_PROJECTS: dict[str, Project] = {}


def _project(pipeline: str) -> Project:
    """One loaded project per process: a test run's tasks share it instead of reloading."""
    if pipeline not in _PROJECTS:
        _PROJECTS[pipeline] = Project(Path(pipeline))
    return _PROJECTS[pipeline]


def _test_action(pipeline: str, instance: str, target: str, report_path: str):
    from doit.exceptions import TaskFailed
    from kiln.tasks.workers import guard_worker

    guard_worker()  # an -n worker exits when its build dies

    from kiln.fsutil import write_bytes_atomic

    project = _project(pipeline)
    inst = next(i for i in project.instances if i.name == instance)
    try:
        (report,) = check_instance(project, inst, [target])
    except KilnError as err:
        from kiln.tasks.task_failure import failure

        return failure(err)
    print(format_report(report))
    if report["status"] in ("fail", "error"):
        return TaskFailed(format_report(report))
    if report["status"] == "skipped":
        # no report file: the task runs again once the target is available; the
        # reporter counts it as skipped, with the reason, never as a success
        return {"skipped": report.get("reason") or "target unavailable"}
    write_bytes_atomic(Path(report_path), json.dumps(report, indent=1, sort_keys=True).encode())
    return None
