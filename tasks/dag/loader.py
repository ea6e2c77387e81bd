"""The doit side: a TaskLoader2 for the `kiln` CLI and the helpers dodo.py uses."""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from doit.cmd_base import TaskLoader2
from doit.loader import generate_tasks

from kiln.errors import Abort, KilnError, environment_error
from kiln.logconfig import get_logger, setup_logging, verbosity
from kiln.tasks.dag.checkers import MD5Checker, TimestampChecker
from kiln.tasks.dag.compile import compile_tasks
from kiln.tasks.dag.lock import acquire
from kiln.tasks.dag.migrate import forget_stage_tasks
from kiln.tasks.execution import ahead
from kiln.tasks.execution.workers import prepare_workers
from kiln.tasks.model.project import Project

log = get_logger("tasks")

# doit commands that execute or change task state take the project lock
LOCKING_COMMANDS = {"run", "clean", "forget", "ignore", "reset-dep", "strace"}
# doit options (before the command name) that take a value
VALUED_OPTIONS = {"-f", "--file", "-d", "--dir", "-k", "--seek-file"}
FAIL_FAST_ENV = "KILN_FAIL_FAST"


def doit_config(project: Project, *, fail_fast: bool = False) -> dict:
    """DOIT_CONFIG of a project: a failed task does not stop the others unless fail-fast."""
    from kiln.statefiles import ensure_sound_db

    project.state_dir.mkdir(parents=True, exist_ok=True)
    ensure_sound_db(project.dep_file)
    forget_stage_tasks(str(project.dep_file), str(project.state_dir))
    check = project.pipeline.cache_check
    fail_fast = fail_fast or fail_fast_requested()
    return {
        "dep_file": str(project.dep_file),
        "backend": "sqlite3",
        "check_file_uptodate": MD5Checker if check == "md5" else TimestampChecker,
        "reporter": _reporter_class(project),
        "default_tasks": ["compile"],
        "verbosity": 1,
        "continue": not fail_fast,
        # doit's own default is sys.stdout as it was when doit.cmd_run was first
        # imported: a command that sends the build's lines to stderr (kiln bench
        # --output-format json) would see them on stdout if anything imported it earlier
        "outfile": sys.stdout,
    }


def fail_fast_requested() -> bool:
    """KILN_FAIL_FAST=1: stop at the first failure (for plain `doit` too)."""
    from kiln.cache.config import env_flag

    return env_flag(FAIL_FAST_ENV, empty=False)  # a value neither on nor off is an error


def asked_groups(argv: list[str]) -> tuple[str, ...] | None:
    """("compile",) when a doit command line runs compile tasks only (or the default
    tasks, which are the compile tasks): the others need not be made. None: all."""
    if doit_command(argv) != "run":
        return None
    names, args = [], iter(argv)
    for arg in args:
        if arg in VALUED_OPTIONS:
            next(args, None)
        elif not arg.startswith("-") and arg != "run" and "=" not in arg:
            names.append(arg)
    if all(name.partition(":")[0] == "compile" for name in names):
        return ("compile",)
    return None


def doit_command(argv: list[str]) -> str | None:
    """The doit command an argument list runs (doit's default is `run`); None for --help."""
    args = iter(argv)
    for arg in args:
        if arg in ("--help", "--version", "help"):
            return None
        if arg in VALUED_OPTIONS:
            next(args, None)
            continue
        if arg.startswith("-"):
            continue
        from doit.doit_cmd import DoitMain

        names = {cls.get_name() for cls in DoitMain.DOIT_CMDS}
        return arg if arg in names else "run"
    return "run"


def lock_for_command(project: Project, argv: list[str], *, wait: bool | None = None) -> bool:
    """Take the project lock when ``argv`` runs or changes tasks; True if taken.

    Such a command may also start plain doit's `-n` workers: prepared here too.
    """
    if doit_command(argv) not in LOCKING_COMMANDS:
        return False
    prepare_workers([stage.module for stage in project.pipeline.stages])
    acquire(project.state_dir, wait=wait)
    return True


def all_task_dicts(project: Project, instances=None, groups=None, *, cleaning: bool = True):
    """Every task generator of the project, as (basename, generator) pairs.

    ``groups`` keeps only the named ones: a command that runs compile tasks
    alone need not make the test tasks (a third of a large project's load time).
    ``cleaning`` False: no doit `clean` runs, and the compile tasks need no clean actions.
    """
    if groups is None or "compile" in groups:
        yield "compile", compile_tasks(project, instances, cleaning=cleaning)
    if groups is None or "test" in groups:
        try:
            from kiln.tasks.dag.test_tasks import test_tasks
        except ImportError:
            return
        yield "test", test_tasks(project, instances)
    if groups is None or "report" in groups:
        from kiln.tasks.dag.report_task import report_tasks

        yield "report", report_tasks(project, instances)


def group_doc(basename: str, project: Project) -> str:
    """What `kiln list` and `doit list` say of a task group (doit's doc of the generator)."""
    return f"{basename} tasks of {project.pipeline.project}"


class KilnLoader(TaskLoader2):
    """Builds doit tasks straight from pipeline.yaml: no dodo.py needed."""

    def __init__(
        self, project: Project | None = None, instances=None, *, fail_fast=False, groups=None
    ):
        super().__init__()
        self._project = project
        self._instances = instances
        self._fail_fast = fail_fast
        self._groups = groups

    @property
    def project(self) -> Project:
        if self._project is None:
            self._project = Project.find()
        return self._project

    def setup(self, opt_values):
        pass

    def load_doit_config(self):
        with user_errors_abort():
            return doit_config(self.project, fail_fast=self._fail_fast)

    def load_tasks(self, cmd, pos_args):
        with user_errors_abort():
            tasks = []
            cleaning = cmd.get_name() == "clean"
            for basename, gen in all_task_dicts(
                self.project, self._instances, self._groups, cleaning=cleaning
            ):
                tasks.extend(generate_tasks(basename, gen, group_doc(basename, self.project)))
        ahead.register_tasks(tasks)  # chains are sent ahead only for tasks doit finds stale
        log.info("loaded %d tasks from %s", len(tasks), self.project.pipeline_path)
        return tasks


@contextmanager
def user_errors_abort():
    """Turn a KilnError (or an OS error) raised while doit loads tasks into an Abort.

    doit prints a traceback for any Exception from a loader; an Abort is
    not one, so it reaches the entry point, which prints the message.
    """
    try:
        yield
    except KilnError as err:
        raise Abort(err) from None
    except OSError as exc:
        raise Abort(environment_error(exc)) from None


def dodo_namespace(start: Path | None = None) -> dict:
    """task_* functions and DOIT_CONFIG for a project's dodo.py.

    doit imports dodo.py and would print a traceback for any error in it:
    a problem with the project is printed as Kiln's one message instead,
    and the process exits 2, as `kiln compile` does.
    """
    from kiln.brokenpipe import guard_stdout
    from kiln.interrupts import note_interrupts, quiet_interrupt_traceback

    guard_stdout()
    quiet_interrupt_traceback()
    note_interrupts()
    with exit_on_user_error():
        setup_logging()  # a bad KILN_LOG_FILE is one message here too
        verbosity()  # a bad KILN_VERBOSITY is one message here, not the reporter's traceback
        project = Project.find(start)
        # plain doit: the lock is held until the process exits; a busy lock with
        # KILN_NO_WAIT or a bad KILN_MP_START is one message and exit 2
        lock_for_command(project, sys.argv[1:])
        ns: dict = {"DOIT_CONFIG": doit_config(project)}
    argv = sys.argv[1:]
    cleaning = doit_command(argv) == "clean"
    for basename, gen in all_task_dicts(project, groups=asked_groups(argv), cleaning=cleaning):

        def task_fn(_gen=gen):
            with exit_on_user_error():
                yield from _gen

        task_fn.__name__ = f"task_{basename}"
        task_fn.__doc__ = group_doc(basename, project)
        ns[f"task_{basename}"] = task_fn
    return ns


@contextmanager
def exit_on_user_error():
    """In a dodo.py: print a user-facing error as one message and exit 2."""
    try:
        with user_errors_abort():
            yield
    except Abort as abort:
        if os.environ.get("KILN_MESSAGE_FORMAT") == "json":
            print(json.dumps(abort.error.to_dict(), sort_keys=True), flush=True)
        else:
            print(abort.error.render(), file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def _reporter_class(project: Project):
    from kiln.tasks.dag.reporter import KilnReporter

    # doit hands a reporter only its own options: say where results are recorded on
    # the class itself, which stays importable by name (`-n` under spawn pickles it)
    KilnReporter.results_dir = project.state_dir
    return KilnReporter
