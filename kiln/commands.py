"""Kiln's own CLI commands. Each takes parsed args and returns an exit code."""

from __future__ import annotations

import sys

from kiln.errors import KilnError


def _project():
    from kiln.tasks.project import Project

    return Project.find()


def _locked(project):
    """The project lock for a whole command: its build and what it reads back."""
    from kiln.tasks.lock import project_lock

    return project_lock(project.state_dir)


def _select(project, filters, packages=(), shape_set=None):
    chosen = project.select(filters or None, list(packages) or None, shape_set)
    if not chosen:
        known = sorted({i.source.path for i in project.instances})
        raise KilnError(
            "no kernel matches " + " ".join(repr(f) for f in filters or ["(all)"]),
            expected="a substring of a kernel path (package.module.function)",
            found=" ".join(filters) or "(no filter)",
            notes=["kernels: " + ", ".join(known)],
        )
    return chosen


def cmd_compile(args) -> int:
    from kiln.tasks.build import compile_instances, write_dump

    project = _project()
    instances = _select(project, args.filters, args.package, args.shapes)
    dumps = {
        k: getattr(args, f"dump_{k}")
        for k in ("dfg", "visa", "ir", "graph", "schedule", "summary", "mlir")
    }
    dumps = {k: v for k, v in dumps.items() if v is not None}
    if dumps:
        kernels = {i.kernel for i in instances}
        if len(kernels) == 1 and len(instances) > 1 and not args.shapes:
            instances = instances[:1]  # one kernel, several shape sets: dump the first
        elif len(instances) > 1:
            raise KilnError(
                f"a dump flag needs exactly one kernel, but the filters select {len(kernels)}",
                expected="filters that match a single kernel (and --shapes NAME)",
                found=", ".join(sorted(i.name for i in instances)),
                hint="name the kernel more precisely, e.g. `kiln compile "
                f"{sorted(kernels)[0]} --dump-{next(iter(dumps))} FILE`",
            )
    with _locked(project):
        rc = compile_instances(project, instances, args.process, fail_fast=args.fail_fast)
        if getattr(args, "profile", None):
            from kiln.report.commands import write_profile

            write_profile(project, args.profile)
        if rc != 0:
            return rc
        for kind, path in dumps.items():
            write_dump(project, instances[0], kind, path)
            print(f"kiln: wrote {kind} dump of {instances[0].name} to {path}")
    return 0


def _app(project, filters) -> str | None:
    """The app a command names: its only positional argument, when that is an app's name."""
    names = {a.name for a in project.pipeline.apps}
    return filters[0] if len(filters or ()) == 1 and filters[0] in names else None


def cmd_status(args) -> int:
    from kiln.tasks.status import explain

    project = _project()
    app = _app(project, args.filters)
    if app is not None and not args.package:
        from kiln.tasks.apps import status_app

        return status_app(project, app, args.all)
    instances = _select(project, args.filters, args.package)
    results = explain(project, instances)
    pending = [(n, r) for n, r in results if r]
    for name, reasons in results:
        if reasons:
            print(f"{name}: would run")
            for reason in reasons:
                print(f"    {reason}")
        elif args.all:
            print(f"{name}: up to date")
    print(f"kiln: {len(pending)} of {len(results)} tasks would run")
    from kiln.tasks.tuning import stale_notes

    for note in stale_notes(project, instances):
        print(f"note: {note}")
    return 0


def cmd_run(args) -> int:
    from kiln.tasks.running import run_kernel

    project = _project()
    app = _app(project, [args.name])
    if app is not None:
        from kiln.tasks.apps import run_app

        if args.shapes:
            raise KilnError(
                f"--shapes picks a kernel's shape set; {app!r} is an app",
                hint="an app's kernel calls pick their instances by the shapes they pass",
            )
        with _locked(project):
            return run_app(project, app, args.target, args.save_outputs)
    try:
        with _locked(project):
            return run_kernel(project, args)
    except KilnError as err:
        if project.pipeline.apps and err.message.startswith("no kernel"):
            err.notes.append("apps: " + ", ".join(a.name for a in project.pipeline.apps))
        raise


def cmd_inspect(args) -> int:
    from kiln.inspect_edf import render

    sys.stdout.write(render(args.file))
    return 0


def cmd_test(args) -> int:
    from kiln.tasks.testing import run_tests

    project = _project()
    app = _app(project, args.filters)
    if app is not None:
        from kiln.tasks.apps import test_app

        with _locked(project):
            return test_app(project, app, args.target, args.junit)
    with _locked(project):
        return run_tests(project, args)


def cmd_bench(args) -> int:
    from kiln.tasks.benching import run_bench

    for flag, value, least in (("--iter", args.iter, 1), ("--warmup", args.warmup, 0)):
        if value < least:  # before any build: an empty timing table is not a result
            raise KilnError(
                f"{flag} must be at least {least}",
                expected=f"{flag} N with N >= {least}",
                found=str(value),
            )
    project = _project()
    with _locked(project):
        return run_bench(project, args)


def cmd_tune(args) -> int:
    from kiln.tasks.tuning import run_tune, show_records

    project = _project()
    instances = _select(project, args.filters, (), args.shapes)
    if args.show:
        return show_records(project, instances)
    return run_tune(project, instances, args)
