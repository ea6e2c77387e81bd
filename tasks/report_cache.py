"""Test reports in the artifact cache: a reproducible target is checked once per content.

A report of a reproducible target (the instruction-level simulator, the
numpy oracle) is decided by bytes alone: the binary, the traced graph, the
kernel's sources (the oracle runs the Python function), the target's
runner, options and machine, the tolerance, the seed and the instance name
(they seed the inputs), and the code of the runner, the oracle, the input
generator and the comparison. Keyed on all of them, a report lives in the
same content-addressed store as the stage artifacts, so a clean CI runner
with a warm remote checks nothing again. Targets that run other code or
hardware (IREE, device plugins) declare themselves not reproducible and
always run.
"""

from __future__ import annotations

import json
import os

from kiln.tasks.compile import stage_artifact
from kiln.tasks.digest import digest_json, stage_module_info

from kiln.cache.action import action_key
from kiln.fsutil import file_digest

REPORT_OUTPUT = "report"
# what decides a report besides the runner's own module: the oracle, the
# inputs, the comparison and the code that assembles the report
CHECK_MODULES = ("kiln.runners.cpu", "kiln.inputs", "kiln.compare", "kiln.tasks.testing")
# a report with one of these statuses is a property of the bytes; an error may be the host's
CACHED_STATUSES = ("pass", "fail")


class ReportCache:
    """Fetch and store the report of one (instance, target, seed)."""

    def __init__(self, session, key: str):
        self.session = session
        self.key = key

    def fetch(self) -> dict | None:
        """The stored report, marked with how it was found, or None."""
        outputs, how = self.session.lookup(self.key)  # verified against its digest
        if outputs is None or REPORT_OUTPUT not in outputs:
            return None
        try:
            report = json.loads(outputs[REPORT_OUTPUT])
        except ValueError:
            return None
        if not well_formed(report):
            return None  # not a report Kiln stored: the test runs, and its report replaces it
        return {**report, "cache": how}

    def store(self, report: dict) -> None:
        if report.get("status") not in CACHED_STATUSES:
            return
        # the path is the reader's own: a clone elsewhere puts its own back
        kept = {k: v for k, v in report.items() if k not in ("path", "cache")}
        data = json.dumps(kept, indent=1, sort_keys=True).encode()
        try:
            self.session.store(self.key, {REPORT_OUTPUT: data})
        except OSError as exc:  # a full or read-only cache costs time, never the test
            self.session.store_failed(exc)


def well_formed(report) -> bool:
    """Whether ``report`` is a report as ``check_instance`` stores it (status, comparisons).

    Anyone who can write the team cache can put bytes under a report's key:
    only a report whose every field the printer reads is there, with its
    type, and whose status agrees with its comparisons, is trusted.
    """
    if not isinstance(report, dict) or report.get("status") not in CACHED_STATUSES:
        return False
    outputs = report.get("outputs")
    if not isinstance(outputs, list) or not outputs:
        return False
    for c in outputs:
        if not (
            isinstance(c, dict)
            and isinstance(c.get("ok"), bool)
            # every comparison has its worst error but a count mismatch (not ok)
            and (isinstance(c.get("max_abs"), (int, float)) or not c["ok"] and "max_abs" not in c)
            and isinstance(c.get("text", ""), str)
            and isinstance(c.get("problem") or "", str)
        ):
            return False
    passed = all(c["ok"] for c in outputs)
    return passed == (report["status"] == "pass") and isinstance(report.get("metrics", {}), dict)


def report_cache(project, inst, target: str, runner, tolerance, seed: int) -> ReportCache | None:
    """The cache of this report, or None when the target or the cache does not allow one."""
    config = runner.artifact_cache
    if not getattr(runner, "reproducible", False) or config is None or not config.enabled:
        return None
    stages = project.pipeline.stages
    files = {"graph": stage_artifact(inst, stages[0].module)}
    if stages[-1].name == "edf":
        files["binary"] = stage_artifact(inst, stages[-1].module)
    root = str(project.root)
    sources = {
        "source:" + os.path.relpath(p, root): p
        for p in project.discovery.source_files(inst.source.module)
    }
    try:
        inputs = {name: file_digest(path) for name, path in {**files, **sources}.items()}
    except OSError:
        return None  # not built: the run reports why
    modules = (type(runner).__module__, *CHECK_MODULES)
    key = action_key(
        inputs=inputs,
        options={
            "target": target,
            "runner": type(runner).kind,
            "runner_options": runner.options,
            "tolerance": tolerance,
            "seed": seed,
            "instance": inst.name,
        },
        machine=runner.machine,
        code=digest_json([stage_module_info(m)[0] for m in modules]),
        extra={"kind": "test-report"},
    )
    from kiln.cache.session import session_for

    return ReportCache(session_for(config), key)
