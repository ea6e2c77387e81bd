"""`kiln test APP`: an app's declared tests, under pytest in this process, once per target.

The app's kernels are built first; while the tests run, every @device call
goes through a Dispatcher to the target (see tasks/apps/plan.py), so the tests
check the target's results with the app's own assertions.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kiln.errors import KilnError
from kiln.tasks.apps.dispatch import KILN_DIRS, Dispatcher
from kiln.tasks.apps.plan import describe_plan, plan_app
from kiln.tasks.model.importpath import add_project_root
from kiln.tasks.model.project import Project


def test_app(project: Project, name: str, targets: list[str], junit: Path | None = None) -> int:
    """`kiln test APP`: the app's declared tests, in-process under pytest, once per target."""
    from kiln.tasks.checks.targets import make_runner
    from kiln.tasks.checks.verdicts import default_targets
    from kiln.tasks.commands.running import build
    from kiln.tasks.commands.testing import asked_for_and_unavailable

    plan = plan_app(project, name)
    where = f"apps.{name}.tests"
    if not plan.app.tests:
        raise KilnError(
            f"app {name!r} declares no tests",
            location=project.pipeline.locate(f"apps.{name}"),
            hint=f"add `tests: [apps/tests/test_{name}.py]` to the app in pipeline.yaml",
        )
    tests = [project.root / t for t in plan.app.tests]
    missing = [i for i, t in enumerate(plan.app.tests) if not (project.root / t).exists()]
    if missing:
        first = plan.app.tests[missing[0]]
        raise KilnError(
            f"app {name!r}: test file {first!r} does not exist",
            # the item itself, as pipeline.md writes list items: apps.NAME.tests[0]
            location=project.pipeline.locate(f"{where}[{missing[0]}]", value=True),
            expected=f"paths relative to {project.root}",
            found=", ".join(plan.app.tests[i] for i in missing),
        )
    try:
        import pytest
    except ImportError:
        raise KilnError(
            "kiln test APP runs the app's tests with pytest, which is not installed",
            hint="pip install pytest",
        ) from None
    asked = list(targets)
    targets = targets or default_targets(project)
    runners = {t: make_runner(project, t) for t in targets}  # unknown: before any build
    print(describe_plan(project, plan), flush=True)
    if plan.instances:
        build(project, plan.instances)
    add_project_root(project.root)
    results, skipped = {}, {}
    imported_before = set(sys.modules)
    for target, runner in runners.items():
        _forget_modules_imported_since(imported_before, project.root)
        reason = runner.unavailable()
        if reason:
            print(f"SKIPPED app {name} @ {target}: {reason}", flush=True)
            results[target], skipped[target] = "skipped", reason
            continue
        dispatcher = Dispatcher(project, plan, target, runner)
        argv = ["-q", "-p", "no:cacheprovider", "--rootdir", str(project.root), *map(str, tests)]
        if junit is not None:
            path = junit if len(runners) == 1 else junit.with_stem(f"{junit.stem}-{target}")
            # the suite names the app and target: pytest's default, "pytest", names neither,
            # and every target's file holds the same test names
            argv += [f"--junitxml={path}", "-o", f"junit_suite_name=kiln.app.{name}@{target}"]
        print(f"kiln test {name} @ {target}: pytest {' '.join(plan.app.tests)}", flush=True)
        from kiln.lang.device import dispatching

        with dispatching(dispatcher):
            code = int(pytest.main(argv))
        if code == pytest.ExitCode.INTERRUPTED:
            # pytest caught the Ctrl-C (or SIGTERM) that was the command's to take:
            # not a failed test, and no further target runs
            raise KeyboardInterrupt
        for message in dispatcher.warnings:  # pytest captured them while the tests ran
            print(f"kiln: warning: {message}", file=sys.stderr, flush=True)
        for line in dispatcher.summary():
            print(line)
        results[target] = "pass" if code == 0 else f"fail (pytest exit code {code})"
        if code == 0 and not dispatcher.stats:
            print(f"  note: the tests made no kernel call, so nothing ran on {target}")
    print(f"kiln test {name}: " + ", ".join(f"{t} {r}" for t, r in results.items()))
    if any(r.startswith("fail") for r in results.values()):
        return 1
    return asked_for_and_unavailable(asked, skipped)


def _forget_modules_imported_since(before: set[str], root: Path) -> None:
    """Drop the project modules the last target's tests imported, so the next target's
    tests import the app anew: its import-time kernel calls then run on that target too,
    not only on the first (whose results the later targets' tests would check)."""
    for name in set(sys.modules) - before:
        file = getattr(sys.modules[name], "__file__", None) or ""
        inside = Path(file).resolve().is_relative_to(root.resolve()) if file else False
        if inside and not file.startswith(KILN_DIRS) and "site-packages" not in file:
            del sys.modules[name]
