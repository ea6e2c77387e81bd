"""Kiln's own CLI commands. Each takes parsed args and returns an exit code."""

from __future__ import annotations

import os
import sys
from contextlib import nullcontext, redirect_stdout
from pathlib import Path

from kiln.cli.help import TASK_GROUPS
from kiln.errors import KilnError
from kiln.outpaths import check_output, write_output, writing


def _project():
    from kiln.tasks.model.project import (
        Project,  # the model warns as it loads (kiln/kernel_checks.py)
    )

    return Project.find()


def _locked(project):
    """The project lock for a whole command: its build and what it reads back."""
    from kiln.tasks.dag.lock import project_lock

    return project_lock(project.state_dir)


def _select(project, args, command: str, apps: bool = False):
    """The selection of a command's FILTER arguments (kiln.tasks.model.selection's one rule).

    A command that takes many kernels selects every match of a substring; one
    that needs a single kernel (a dump flag, ``--shape``, ``kiln run``) stops
    with the candidates instead.
    """
    from kiln.cli.parser import DUMP_FLAGS
    from kiln.tasks.model.selection import select

    filters = list(getattr(args, "filters", None) or [])
    dumps = any(getattr(args, f"dump_{kind}", None) is not None for kind in DUMP_FLAGS)
    return select(
        project,
        filters,
        packages=getattr(args, "package", None) or (),
        shape_set=getattr(args, "shapes", None),
        apps=apps,
        command=command,
        single=dumps or bool(getattr(args, "shape", None)),
    )


def cmd_compile(args) -> int:
    from kiln.tasks.dag.build import compile_instances, start_executor, write_dump

    project = _project()
    start_executor(project)  # a first build's LocalCluster starts while the kernels are found
    instances = _select(project, args, "compile").instances
    dumps = {
        k: getattr(args, f"dump_{k}")
        for k in ("dfg", "visa", "ir", "graph", "schedule", "summary", "mlir")
    }
    dumps = {k: v for k, v in dumps.items() if v is not None}
    outputs = [(f"--dump-{k}", path, k == "summary") for k, path in dumps.items()]
    if getattr(args, "profile", None):
        outputs.append(("--profile", args.profile, False))
    for option, path, directory in outputs:  # before the build: it may take a while
        check_output(option, path, directory=directory)
        _outside_instance_dirs(project, option, path)
    if dumps:
        from kiln.tasks.model.selection import Selection, first_shape_set

        flag = f"--dump-{next(iter(dumps))}"
        instances = [first_shape_set(Selection(instances), "compile", f"a dump flag ({flag})")]
    with _locked(project):
        rc = compile_instances(project, instances, args.process, fail_fast=args.fail_fast)
        if getattr(args, "profile", None):
            from kiln.report.commands import write_profile

            with writing("--profile", args.profile):
                write_profile(project, args.profile)
        if rc != 0:
            return rc
        for kind, path in dumps.items():
            with writing(f"--dump-{kind}", path, directory=kind == "summary"):
                if kind == "summary":  # a directory of files
                    write_dump(project, instances[0], kind, path)
                else:
                    write_output(path, lambda p, k=kind: write_dump(project, instances[0], k, p))
            # stdout holds JSON objects only under --message-format json: the line goes aside
            said = sys.stderr if os.environ.get("KILN_MESSAGE_FORMAT") == "json" else sys.stdout
            print(f"kiln: wrote {kind} dump of {instances[0].name} to {path}", file=said)
    return 0


def _outside_instance_dirs(project, option: str, path) -> None:
    """A dump or profile never lands in an instance's out dir: written over one of Kiln's
    artifacts (``kernel.edf``), the next command found it damaged and deleted it."""
    from kiln.errors import printable, relative_path

    target = Path(os.path.abspath(path))
    for inst in project.instances:
        home = Path(os.path.abspath(inst.out_dir))
        if target == home or home in target.parents:
            raise KilnError(
                f"{option}: {printable(relative_path(target))} is inside the out dir of "
                f"{inst.name}, where Kiln keeps its artifacts",
                expected="a path outside the instances' out dirs",
                found=printable(str(path)),
                hint="write it elsewhere, or keep dumps beside the artifacts with "
                "pipeline.yaml's `dumps:` section",
            )


def cmd_status(args) -> int:
    from kiln.tasks.chain.manifest import building_nothing
    from kiln.tasks.dag.status import explain

    project = _project()
    chosen = _select(project, args, "status", apps=True)
    with building_nothing():  # status builds nothing: a damaged file is for compile to redo
        if chosen.app is not None:
            from kiln.tasks.apps.plan import status_app

            return status_app(project, chosen.app, args.all)
        results = explain(project, chosen.instances)
    instances = chosen.instances
    pending = [(n, r) for n, r in results if r]
    for name, reasons in results:
        if reasons:
            print(f"{name}: would run")
            for reason in reasons:
                print(f"    {reason}")
        elif args.all:
            print(f"{name}: up to date")
    print(f"kiln: {len(pending)} of {len(results)} tasks would run")
    from kiln.tasks.commands.tuning import stale_notes

    for note in stale_notes(project, instances):
        print(f"note: {note}")
    return 0


def _ready_targets(project, targets, *, asked, checks, command, device=0, quiet=False):
    """Every target checked once, before any build (kiln/cli/target_check.py)."""
    from kiln.cli.target_check import ready_targets
    from kiln.logconfig import verbosity

    quiet = quiet or verbosity() == 0
    return ready_targets(
        project, targets, asked=asked, checks=checks, command=command, device=device, quiet=quiet
    )


def cmd_run(args) -> int:
    from kiln.tasks.commands.running import run_kernel

    if getattr(args, "save_outputs", None) is not None:  # before the run, not after it
        check_output("--save-outputs", args.save_outputs, directory=True)
    project = _project()
    args.filters = [args.name]
    chosen = _select(project, args, "run", apps=True)
    _ready_targets(project, [args.target], asked=True, checks=None, command="run")
    if chosen.app is not None:
        from kiln.tasks.apps.plan import run_app

        with _locked(project):
            return run_app(project, chosen.app, args.target, args.save_outputs)
    with _locked(project):
        return run_kernel(project, chosen.instances, args)


def cmd_inspect(args) -> int:
    from kiln.inspect_edf import render

    sys.stdout.write(render(args.file))
    return 0


def cmd_test(args) -> int:
    from kiln.tasks.commands.testing import run_tests

    junit = getattr(args, "junit", None)
    if junit is not None:
        check_output("--junit", junit)
    project = _project()
    chosen = _select(project, args, "test", apps=True)
    fuzz = getattr(args, "fuzz", None)
    if fuzz is not None:
        from kiln.tasks.commands.fuzzing import draw_for, fuzzed_instances

        chosen.instances = fuzzed_instances(chosen, fuzz)
        draw_for(project, chosen.instances[0], 1, args.seed)  # no dims to fuzz: before any build
    from kiln.tasks.checks.verdicts import default_targets

    args.unavailable = _ready_targets(
        project,
        args.target or default_targets(project),
        asked=bool(args.target),
        checks=fuzz if fuzz is not None else None if chosen.app else len(chosen.instances),
        command="test",
        quiet=chosen.app is not None,  # an app's tests say which targets they skipped
    )
    with _locked(project), writing("--junit", junit) if junit is not None else nullcontext():
        if fuzz is not None:
            from kiln.tasks.commands.fuzzing import run_fuzz

            return run_fuzz(project, chosen.instances, args)
        if chosen.app is not None:
            from kiln.tasks.apps.app_tests import test_app

            return test_app(project, chosen.app, args.target, junit)
        return run_tests(project, chosen.instances, args)


def cmd_bench(args) -> int:
    from kiln.tasks.commands.benching import run_bench

    checks = (("--iter", args.iter, 1), ("--warmup", args.warmup, 0), ("--device", args.device, 0))
    for flag, value, least in checks:
        if value < least:  # before any build: an empty timing table is not a result
            raise KilnError(
                f"{flag} must be at least {least}",
                expected=f"{flag} N with N >= {least}",
                found=str(value),
            )
    project = _project()
    instances = _select(project, args, "bench").instances
    if getattr(args, "shape", None) is not None:  # `--shape ""` too: refused, not ignored
        from kiln.tasks.commands.benching import instances_at_shape

        instances = instances_at_shape(project, instances, args.shape)
    _ready_targets(
        project,
        args.target,
        asked=True,
        checks=len(instances),
        command="bench",
        device=args.device,
    )
    with _locked(project):
        return run_bench(project, instances, args)


def cmd_tune(args) -> int:
    from kiln.tasks.commands.tuning import run_tune, show_records

    project = _project()
    instances = _select(project, args, "tune").instances
    if args.show:
        return show_records(project, instances)
    with _locked(project):  # one writer of tuning.jsonl; a build never reads it half-tuned
        return run_tune(project, instances, args)


def cmd_clean(args) -> int:
    """Remove what Kiln wrote for the kernels a FILTER selects (all without one), or for
    the doit tasks named: artifacts through doit's clean, then test and bench results."""
    from kiln.tasks.dag.build import run_doit

    tasks = [a for a in args.filters if ":" in a or a in TASK_GROUPS]
    filters = [a for a in args.filters if a not in tasks]
    project = _project()
    instances = None
    if filters or not tasks:  # tasks alone clean only those tasks
        args.filters = filters
        instances = _select(project, args, "clean").instances
    # each selected instance's compile task (its whole stage chain); its results (test
    # tasks' too) are removed below
    names = [*tasks, *(f"compile:{inst.name}" for inst in instances or () if filters)]
    flags = [
        flag
        for flag, given in (("-n", args.dry_run), ("-a", args.all), ("-c", args.clean_dep))
        if given
    ] + (["--forget"] if args.forget else [])
    from kiln.logconfig import verbosity

    lines = _CleanLines(sys.stdout, quiet=verbosity() == 0)
    with _locked(project), redirect_stdout(lines):
        rc = run_doit(project, ["clean", *flags, *names], instances=None if tasks else instances)
        if rc:
            return 2 if rc == 3 else rc  # doit's 3: a name that is not a task
        if instances is not None:
            results = [p for inst in instances for p in kiln_results(inst.out_dir)]
            for directory in _undeclared_instance_dirs(project, instances, whole=not filters):
                _clean_undeclared(project, directory, dry_run=args.dry_run)
                results += kiln_results(directory)
            if not filters:  # the whole project's: the report and the last test run
                results += kiln_results(Path(project.out_dir), whole=True)
            _remove(results, Path(project.out_dir), dry_run=args.dry_run)
        lines.flush()
    done = "would remove" if args.dry_run else "removed"
    print(f"kiln clean: {done} {lines.files} file{'s' * (lines.files != 1)}")
    return 0


class _CleanLines:
    """stdout without doit's "TASK - executing 'Python: function _clean'" before each
    task (Kiln's clean action says itself what it removes, or would under -n); it
    counts the files removed, and under -q drops the line of each (the summary says
    how many)."""

    FILE_LINES = ("kiln: removed ", "kiln: would remove ")
    DOIT_FILE_LINES = (" - removing file '", " - removing dir '")  # a task's `clean: True`

    def __init__(self, stream, *, quiet: bool = False):
        self._stream = stream
        self._pending = ""  # print() writes a line's text and its newline separately
        self.quiet = quiet
        self.files = 0

    def write(self, text: str) -> int:
        *lines, self._pending = (self._pending + text).split("\n")
        for line in lines:
            self._line(line + "\n")
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self._line(self._pending)
            self._pending = ""
        self._stream.flush()

    def _line(self, line: str) -> None:
        if line.endswith(" - executing 'Python: function _clean'\n"):
            return
        if line.startswith(self.FILE_LINES) or any(s in line for s in self.DOIT_FILE_LINES):
            self.files += 1
            if self.quiet:
                return
        self._stream.write(line)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _undeclared_instance_dirs(project, instances, *, whole: bool) -> list[Path]:
    """The out dirs of instances pipeline.yaml does not declare (``kiln bench --shape``,
    an app's call at new sizes) of the kernels whose every declared instance is selected;
    ``whole`` (no FILTER), those of kernels it no longer declares too (renamed, removed).

    Only a directory holding Kiln's manifest counts: one Kiln built.
    """
    from kiln.tasks.chain.manifest import MANIFEST

    selected = {inst.out_dir for inst in instances}
    declared = {}
    for inst in project.instances:
        declared.setdefault(inst.kernel, set()).add(inst.out_dir)
    out = Path(project.out_dir)
    if whole:
        kernels = sorted(d.name for d in out.glob("*/")) if out.is_dir() else []
    else:
        kernels = sorted({inst.kernel for inst in instances})
    found = []
    for kernel in kernels:
        if not declared.get(kernel, set()) <= selected:
            continue
        base = out / kernel
        for directory in sorted(base.glob("*/")) if base.is_dir() else ():
            if directory not in declared.get(kernel, ()) and (directory / MANIFEST).is_file():
                found.append(directory)
    return found


def _clean_undeclared(project, directory: Path, *, dry_run: bool) -> None:
    """Remove what Kiln built in an undeclared instance's out dir, as its manifest lists it."""
    from kiln.tasks.chain.chain_record import RECORD
    from kiln.tasks.chain.manifest import clean_targets, read_doc

    built = sorted({*read_doc(str(directory)).get("files", {}), RECORD})
    targets = [str(directory / rel) for rel in built]
    clean_targets(
        str(directory), targets, str(project.out_dir), str(project.state_dir), dryrun=dry_run
    )


def kiln_results(directory: Path, *, whole: bool = False) -> list[Path]:
    """The result files Kiln wrote in ``directory`` (docs/view.md, docs/targets.md).

    Each is told from a user's file of the same name by its content, so clean
    never deletes what it did not write: an instance's test-<target>.json and
    bench-<target>.json name that target; ``whole`` (the out dir itself) adds
    test-report.json and report.html.
    """
    from kiln.tasks.checks.results import read_json

    found = []
    for path in sorted([*directory.glob("test-*.json"), *directory.glob("bench-*.json")]):
        doc = read_json(path)
        if isinstance(doc, dict) and doc.get("target") == path.stem.partition("-")[2]:
            found.append(path)
    if whole:
        report = read_json(directory / "test-report.json")
        if isinstance(report, dict) and isinstance(report.get("reports"), list):
            found.append(directory / "test-report.json")
        page = directory / "report.html"
        if page.is_file() and "kiln report</title>" in page.read_text(errors="replace")[:4096]:
            found.append(page)
    return found


def _remove(paths: list[Path], out_dir: Path, *, dry_run: bool) -> None:
    """Delete ``paths`` (or say they would go), then the directories left empty below out_dir."""
    from kiln.errors import printable, relative_path

    for path in paths:
        if dry_run:
            print(f"kiln: would remove {printable(relative_path(path))}")
            continue
        path.unlink(missing_ok=True)
        print(f"kiln: removed {printable(relative_path(path))}")
        directory = path.parent
        while directory != out_dir and out_dir in directory.parents:
            try:
                directory.rmdir()  # only when empty
            except OSError:
                break
            directory = directory.parent
