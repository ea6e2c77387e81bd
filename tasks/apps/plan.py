"""Apps: programs that call kernels. Build what they reach, then run them on a target.

``plan_app`` scans the app (``tasks.reach``) and picks the instances of the
kernels it reaches; those are built through the ordinary compile tasks.
While the app runs, a :class:`Dispatcher` receives every ``@device`` call
(``kiln.lang.device.dispatching``), picks the built instance whose shapes
and dtypes match the arguments and runs it on the target. A call the scan
did not see, or at shapes no shape set declares, is compiled on first use
(JIT) through the same tasks and reported as a warning naming the call site.
`kiln test APP` runs an app's tests the same way (tasks/apps/app_tests.py).
"""

from __future__ import annotations

import difflib
import importlib
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.errors import KilnError, Location, TargetError
from kiln.outputs import describe_output, flatten_outputs
from kiln.pipeline import AppSpec
from kiln.tasks.apps.dispatch import KILN_DIRS, Dispatcher
from kiln.tasks.model.importpath import add_project_root
from kiln.tasks.model.project import KernelInstance, Project
from kiln.tasks.model.reach import Reachability, Reached, display_path, has_main


@dataclass
class AppPlan:
    """What building one app means: the kernels it reaches and their instances."""

    app: AppSpec
    file: Path
    reached: list[Reached]
    instances: list[KernelInstance]
    undeclared: list[Reached]  # reached, but pipeline.yaml builds no such kernel


def app_names(project: Project) -> list[str]:
    return [a.name for a in project.pipeline.apps]


def plan_app(project: Project, name: str) -> AppPlan:
    """Scan app ``name``; a missing module, a syntax error or no ``main`` is a KilnError."""
    pipeline = project.pipeline
    try:
        app = pipeline.app(name)
    except KeyError:
        close = difflib.get_close_matches(name, app_names(project), n=1)
        raise KilnError(
            f"no app {name!r} in pipeline.yaml",
            expected="one of: " + (", ".join(app_names(project)) or "(no apps declared)"),
            found=name,
            hint=f"did you mean {close[0]!r}?" if close else None,
        ) from None
    reach = Reachability(project.root, project.discovery)
    file = reach.module_file(app.module)
    if file is None:
        rel = Path(*app.module.split("."))
        raise KilnError(
            f"app {name!r}: module {app.module!r} does not exist",
            location=pipeline.locate(f"apps.{name}.module", value=True),
            expected=f"a file {rel}.py or {rel}/__init__.py under {project.root}",
            found=app.module,
        )
    if not has_main(reach, app.module):
        scan = reach.scan(app.module)
        names = sorted(n for n in scan.bindings if not n.startswith("_"))
        raise KilnError(
            f"app {name!r} has no main() function",
            location=Location(display_path(file, project.root)),
            expected=f"a top-level `def main():` in {display_path(file, project.root)}, "
            "returning the outputs to print",
            found="top-level names: " + (", ".join(names) or "(none)"),
        )
    reached = reach.reach(app.module)
    paths = {r.kernel.path for r in reached}
    instances = [i for i in project.instances if i.source.path in paths]
    if app.shapes:  # only the app's own shape set, for kernels that declare it
        _check_app_shapes(project, app, instances or project.instances)
        has_set = {i.kernel for i in instances if i.shape_set == app.shapes}
        instances = [i for i in instances if i.kernel not in has_set or i.shape_set == app.shapes]
    built = {i.source.path for i in instances}
    undeclared = [r for r in reached if r.kernel.path not in built]
    return AppPlan(app, file, reached, instances, undeclared)


def _check_app_shapes(project: Project, app: AppSpec, instances: list[KernelInstance]) -> None:
    """An app's ``shapes:`` names a shape set of a kernel it reaches (a typo built them all)."""
    known = sorted({i.shape_set for i in instances})
    if app.shapes in known:
        return
    close = difflib.get_close_matches(app.shapes, known, n=1)
    raise KilnError(
        f"app {app.name!r}: shapes {app.shapes!r} is not a shape set of any kernel it reaches",
        location=project.pipeline.locate(f"apps.{app.name}.shapes", value=True),
        expected="one of: " + (", ".join(known) or "(no shape sets)"),
        found=app.shapes,
        hint=f"did you mean {close[0]!r}?"
        if close
        else "name a set under `shapes:` of a kernel the app calls, or drop `shapes:`",
    )


def describe_plan(project: Project, plan: AppPlan) -> str:
    root = project.root
    lines = [
        f"kiln: app {plan.app.name!r} ({display_path(plan.file, root)}) reaches "
        f"{len(plan.reached)} kernel{'s' if len(plan.reached) != 1 else ''}"
        + (":" if plan.reached else "")
    ]
    for r in plan.reached:
        names = [i.name for i in plan.instances if i.source.path == r.kernel.path]
        builds = ", ".join(names) if names else "nothing yet: not in pipeline.yaml `kernels:`"
        lines.append(f"  {r.kernel.path} -> {builds}")
        lines.append(f"      {r.reason(root)}")
    return "\n".join(lines)


# -- running ---------------------------------------------------------------------


def _check_target(project: Project, target: str):
    from kiln.tasks.checks.targets import make_runner

    runner = make_runner(project, target)  # an unknown target is an error before any build
    return runner


def _import_app(project: Project, plan: AppPlan):
    add_project_root(project.root)
    return importlib.import_module(plan.app.module)


def _app_traceback(exc: BaseException) -> str:
    """The exception's traceback without Kiln's own frames above the app's code."""
    tb = traceback.TracebackException.from_exception(exc)
    frames = list(tb.stack)
    while frames and (
        frames[0].filename.startswith(KILN_DIRS)
        or frames[0].filename.startswith("<frozen importlib")
        or frames[0].filename == importlib.__file__
    ):
        frames.pop(0)
    tb.stack = traceback.StackSummary.from_list(frames)
    return "".join(tb.format())


def _app_frame(exc: BaseException) -> tuple[str, int] | None:
    """File and line of the innermost frame of the app's own code in ``exc``'s traceback."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if not f.filename.startswith((*KILN_DIRS, "<"))]
    return (mine[-1].filename, mine[-1].lineno or 0) if mine else None


class AppFailed(Exception):
    """The app's own code raised: the traceback is printed, kiln exits 1."""


def call_app(project: Project, plan: AppPlan, dispatcher: Dispatcher | None) -> Any:
    """Import the app and run ``main()`` with kernel calls going to ``dispatcher``."""
    from kiln.lang.device import dispatching

    name = plan.app.name
    with dispatching(dispatcher):
        stage = "while importing it"
        try:
            module = _import_app(project, plan)
            main = getattr(module, "main", None)
            if not callable(main):
                raise KilnError(
                    f"app {name!r} has no main() function",
                    location=Location(display_path(plan.file, project.root)),
                    expected="a callable `main` at the top level of " + plan.app.module,
                )
            _check_main_takes_no_arguments(project, plan, main)
            stage = "in main()"
            return main()
        except KilnError:
            raise
        except SystemExit as exc:  # a program's way to stop: not Kiln's usage error (exit 2)
            if exc.code is None or exc.code == 0:
                print(f"kiln: app {name!r} called sys.exit({exc.code!r}) {stage}", flush=True)
                return None
            where = _app_frame(exc)
            message = f"app {name!r} called sys.exit({exc.code!r}) {stage}" + (
                f" at {display_path(where[0], project.root)}:{where[1]}" if where else ""
            )
            print(f"error: {message}", file=sys.stderr)
            raise AppFailed(message) from None
        except Exception as exc:
            sys.stderr.write(_app_traceback(exc))
            message = f"app {name!r} raised {type(exc).__name__}: {exc} ({stage})"
            print(f"error: {message}; its traceback is above", file=sys.stderr)
            raise AppFailed(message) from None


def _check_main_takes_no_arguments(project: Project, plan: AppPlan, main) -> None:
    """`kiln run` calls ``main()`` bare: a required parameter would end in a bare TypeError."""
    import inspect

    try:
        signature = inspect.signature(main)
    except (TypeError, ValueError):  # a callable without a signature: let the call decide
        return
    code = getattr(main, "__code__", None)
    where = display_path(code.co_filename if code else plan.file, project.root)
    if inspect.iscoroutinefunction(main) or inspect.isasyncgenfunction(main):
        kind, found, hint = (
            "a coroutine function",
            f"async def main{signature}",
            "wrap it: def main(): return asyncio.run(amain())",
        )
    elif inspect.isgeneratorfunction(main):
        kind, found, hint = (
            "a generator function",
            f"def main{signature}: ... yield ...",
            "return the outputs (a dict or a tuple of arrays) instead of yielding them",
        )
    else:
        kind = None
    if kind is not None:  # calling it runs nothing: its body would never call a kernel
        raise KilnError(
            f"app {plan.app.name!r}: main() is {kind}; Kiln calls main() and uses what it returns",
            location=Location(where, code.co_firstlineno if code else None),
            expected="def main(): that runs the app and returns its outputs",
            found=found,
            hint=hint,
        )
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    required = [
        p.name
        for p in signature.parameters.values()
        if p.default is p.empty and p.kind not in variadic
    ]
    if not required:
        return
    raise KilnError(
        f"app {plan.app.name!r}: main() takes arguments ({', '.join(required)}), "
        "but Kiln calls main() with none",
        location=Location(where, code.co_firstlineno if code else None),
        expected="def main(): (or parameters that all have defaults)",
        found=f"def main{signature}",
        hint="give each parameter a default (def main(n=1024):)",
    )


def run_app(project: Project, name: str, target: str, save_dir: Path | None = None) -> int:
    """`kiln run APP`: build what the app reaches, run main() on ``target``, print its outputs."""
    from kiln.tasks.commands.running import build

    plan = plan_app(project, name)
    runner = _check_target(project, target)
    reason = runner.unavailable()
    if reason:
        raise TargetError(f"target {target!r} cannot run here: {reason}")
    print(describe_plan(project, plan), flush=True)
    if plan.instances:
        build(project, plan.instances)
    dispatcher = Dispatcher(project, plan, target, runner)
    try:
        result = call_app(project, plan, dispatcher)
    except AppFailed:
        return 1
    outputs = flatten_outputs(result)
    print(f"app {name} on {target}: main() returned {len(outputs)} output(s)")
    for out_name, value in outputs:
        print(describe_output(out_name, value))
    for line in dispatcher.summary():
        print(line)
    if save_dir is not None:
        import numpy as np

        from kiln.outputs import save_outputs  # one writer for kernels and apps

        # a leaf that is no array (an object of the app's own) has no .npy form
        arrays = [(n, v) for n, v in outputs if np.asarray(v).dtype.kind != "O"]
        written = save_outputs(arrays, save_dir)
        print(
            f"  saved {len(written)} output(s) to {save_dir} (<name>.npy and outputs.json: "
            "read them with np.load, or kiln.load_outputs for their own dtypes)"
        )
        left = [n for n, v in outputs if np.asarray(v).dtype.kind == "O"]
        if left:
            print(f"  not saved (not arrays): {', '.join(left)}")
    return 0


def status_app(project: Project, name: str, show_all: bool = False) -> int:
    """`kiln status APP`: the kernels the app reaches, and why each would rebuild."""
    from kiln.tasks.dag.status import explain

    plan = plan_app(project, name)
    print(describe_plan(project, plan))
    results = explain(project, plan.instances) if plan.instances else []
    for task, reasons in results:
        if reasons:
            print(f"{task}: would run")
            for reason in reasons:
                print(f"    {reason}")
        elif show_all:
            print(f"{task}: up to date")
    pending = sum(1 for _, r in results if r)
    print(f"kiln: {pending} of {len(results)} tasks of app {name!r} would run")
    return 0
