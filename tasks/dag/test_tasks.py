"""The `test:<instance>@<target>` doit tasks: a JSON report per pair, failing on mismatch."""

from __future__ import annotations

import json
from pathlib import Path

from kiln.errors import KilnError
from kiln.tasks.checks.verdicts import check_instance, default_targets, format_report
from kiln.tasks.model.artifacts import binary_stage, stage_artifact
from kiln.tasks.model.digest import ConfigStamps, digest_json
from kiln.tasks.model.project import Project


def test_tasks(project: Project, instances=None):
    """doit tasks ``test:<instance>@<target>``: a JSON report per pair, failing on mismatch."""
    # what a check reads: the traced graph (for the oracle) and the binary (the edf row's
    # artifact, wherever it is; without one, the last artifact: the chain is built)
    stages = project.pipeline.stages
    modules = {stages[0].module, (binary_stage(project) or stages[-1]).module}
    targets = default_targets(project)
    target_specs = {
        t.name: digest_json([t.runner, t.machine, sorted(t.options), t.tolerance])
        for t in project.pipeline.targets
    }
    stamps = ConfigStamps(project.state_dir / "config")
    from kiln.inputs import parse
    from kiln.tasks.checks.targets import instance_input_specs

    for inst in instances if instances is not None else project.instances:
        deps = sorted({stage_artifact(inst, module) for module in modules})
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
    from kiln.tasks.checks.results import read_json

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

    from kiln.tasks.execution.workers import guard_worker

    guard_worker()  # an -n worker exits when its build dies

    from kiln.fsutil import write_bytes_atomic

    project = _project(pipeline)
    inst = next(i for i in project.instances if i.name == instance)
    try:
        (report,) = check_instance(project, inst, [target])
    except KilnError as err:
        from kiln.tasks.chain.task_failure import failure

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
