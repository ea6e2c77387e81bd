"""Test reports in the artifact cache: a reproducible target is checked once per content.

A report of a reproducible target (the instruction-level simulator, the
numpy oracle) is decided by what its check reads: the binary, the traced
graph, the kernel function's own code (the oracle runs it: its bytecode,
constants and names, not its line numbers, comments or docstring, nor the
rest of its module; the helpers it calls are in the traced graph), the
inputs (pipeline.yaml's ``inputs:``, a ``.npy`` file by its bytes), the
target's runner, options and machine, the tolerance, the seed and the
instance name (they seed the inputs), and the code of the runner, the
oracle, the input generator and the comparison. Keyed on all of them, a
report lives in the same content-addressed store as the stage artifacts, so
a clean CI runner with a warm remote checks nothing again, and a comment
edit in a kernel module checks nothing again either. Targets that run other
code or hardware (IREE, device plugins) declare themselves not reproducible
and always run.
"""

from __future__ import annotations

import json

from kiln.cache.action import action_key
from kiln.fsutil import file_digest
from kiln.tasks.model.artifacts import binary_stage, stage_artifact
from kiln.tasks.model.digest import digest_json, stage_module_info

REPORT_OUTPUT = "report"
# what decides a report besides the runner's own module: the oracle, the
# inputs, the comparison and the code that assembles the report
CHECK_MODULES = ("kiln.runners.cpu", "kiln.inputs", "kiln.compare", "kiln.tasks.checks.verdicts")
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
        if not well_formed(report) or report.pop("key", None) != self.key:
            # not a report Kiln stored, or one filed under another check's key (another
            # instance's, another target's): the test runs, and its report replaces it
            return None
        return {**report, "cache": how}

    def store(self, report: dict) -> None:
        if report.get("status") not in CACHED_STATUSES:
            return
        # the path is the reader's own: a clone elsewhere puts its own back
        kept = {k: v for k, v in report.items() if k not in ("path", "cache", "strict")}
        kept["key"] = self.key  # what it answers: a report moved under another key is not used
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
    warnings = report.get("warnings", [])
    if not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings):
        return False
    passed = all(c["ok"] for c in outputs)
    return passed == (report["status"] == "pass") and isinstance(report.get("metrics", {}), dict)


def report_cache(
    project, inst, target: str, runner, tolerance, seed: int, function=None
) -> ReportCache | None:
    """The cache of this report, or None when the target or the cache does not allow one.

    ``function`` is the kernel's @device function (the oracle), when loaded.
    """
    config = runner.artifact_cache
    if not getattr(runner, "reproducible", False) or config is None or not config.enabled:
        return None
    stages = project.pipeline.stages
    files = {"graph": stage_artifact(inst, stages[0].module)}
    binary = binary_stage(project)
    if binary is not None:
        files["binary"] = stage_artifact(inst, binary.module)
    try:
        inputs = {name: file_digest(path) for name, path in files.items()}
    except OSError:
        return None  # not built: the run reports why
    from kiln.inputs import input_key
    from kiln.tasks.checks.targets import instance_input_specs

    inputs["oracle"] = function_digest(function) if function is not None else inst.source.path
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
            "inputs": input_key(instance_input_specs(project, inst), project.root),
        },
        machine=runner.machine,
        code=digest_json([stage_module_info(m)[0] for m in modules]),
        extra={"kind": "test-report"},
    )
    from kiln.cache.session import session_for

    return ReportCache(session_for(config), key)


def function_digest(function) -> str:
    """sha256 of what a kernel function computes when run: not where its text lies.

    Its code object, recursively (nested functions and comprehensions):
    bytecode, constants, names, argument layout and flags, plus its default
    values and the Python version; not its line numbers, file name or
    docstring, so a comment or a blank line anywhere in its module changes
    nothing, and an edit of its body does.
    """
    import hashlib
    import sys
    import types

    fn = getattr(function, "fn", function)  # a @device function wraps the plain one
    fn = inspect_unwrap(fn)
    code = getattr(fn, "__code__", None)
    if code is None:  # not a Python function: its name is all there is
        return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
    doc = fn.__doc__

    def const(value, top: bool):
        if isinstance(value, types.CodeType):
            return ["code", parts(value, False)]
        if top and isinstance(value, str) and value == doc:
            return ["doc"]
        if isinstance(value, (tuple, frozenset)):
            items = [const(v, False) for v in value]
            return [
                type(value).__name__,
                sorted(items, key=repr) if isinstance(value, frozenset) else items,
            ]
        return [type(value).__name__, repr(value)]

    def parts(c: types.CodeType, top: bool) -> list:
        return [
            c.co_code.hex(),
            [const(v, top) for v in c.co_consts],
            list(c.co_names),
            list(c.co_varnames),
            list(c.co_freevars),
            list(c.co_cellvars),
            [c.co_argcount, c.co_posonlyargcount, c.co_kwonlyargcount, c.co_flags],
        ]

    defaults = [repr(fn.__defaults__), repr(sorted((fn.__kwdefaults__ or {}).items()))]
    text = json.dumps([list(sys.version_info[:2]), fn.__qualname__, parts(code, True), defaults])
    return hashlib.sha256(text.encode()).hexdigest()


def inspect_unwrap(fn):
    """The innermost function behind ``functools.wraps`` decorators."""
    import inspect

    try:
        return inspect.unwrap(fn)
    except ValueError:  # a cycle of __wrapped__
        return fn
