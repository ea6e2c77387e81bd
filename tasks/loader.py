"""The doit side: a TaskLoader2 for the `kiln` CLI and the helpers dodo.py uses."""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

from doit.cmd_base import TaskLoader2
from doit.loader import generate_tasks
from kiln.tasks.compile import compile_tasks
from kiln.tasks.project import Project

from kiln.logconfig import get_logger, setup_logging

log = get_logger("tasks")

# doit commands that execute or change task state take the project lock
LOCKING_COMMANDS = {"run", "clean", "forget", "ignore", "reset-dep"}

_lock_file = None


def doit_config(project: Project) -> dict:
    project.state_dir.mkdir(parents=True, exist_ok=True)
    check = project.pipeline.cache_check
    return {
        "dep_file": str(project.state_dir / "doit.sqlite3"),
        "backend": "sqlite3",
        "check_file_uptodate": "md5" if check == "md5" else "timestamp",
        "reporter": _reporter_class(project),
        "default_tasks": ["compile"],
        "verbosity": 1,
    }


def acquire_lock(project: Project) -> None:
    """One build per project at a time; a second one waits, saying so."""
    global _lock_file
    if _lock_file is not None:
        return
    path = project.state_dir / "lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        print(
            f"kiln: waiting for {holder} to finish with {project.root} ...",
            file=sys.stderr,
            flush=True,
        )
        fcntl.flock(f, fcntl.LOCK_EX)
    f.seek(0)
    f.truncate()
    f.write(f"kiln build (pid {os.getpid()})\n")
    f.flush()
    _lock_file = f


def all_task_dicts(project: Project, instances=None):
    """Every task generator of the project, as (basename, generator) pairs."""
    yield "compile", compile_tasks(project, instances)
    try:
        from kiln.tasks.testing import test_tasks
    except ImportError:
        return
    yield "test", test_tasks(project, instances)
    from kiln.tasks.viewing import report_tasks

    yield "report", report_tasks(project, instances)


class KilnLoader(TaskLoader2):
    """Builds doit tasks straight from pipeline.yaml: no dodo.py needed."""

    def __init__(self, project: Project | None = None, instances=None):
        super().__init__()
        self._project = project
        self._instances = instances

    @property
    def project(self) -> Project:
        if self._project is None:
            self._project = Project.find()
        return self._project

    def setup(self, opt_values):
        pass

    def load_doit_config(self):
        return doit_config(self.project)

    def load_tasks(self, cmd, pos_args):
        if cmd.name in LOCKING_COMMANDS:
            acquire_lock(self.project)
        tasks = []
        for basename, gen in all_task_dicts(self.project, self._instances):
            tasks.extend(generate_tasks(basename, gen))
        log.info("loaded %d tasks from %s", len(tasks), self.project.pipeline_path)
        return tasks


def dodo_namespace(start: Path | None = None) -> dict:
    """task_* functions and DOIT_CONFIG for a project's dodo.py."""
    setup_logging()
    project = Project.find(start)
    ns: dict = {"DOIT_CONFIG": doit_config(project)}
    for basename, gen in all_task_dicts(project):

        def task_fn(_gen=gen):
            yield from _gen

        task_fn.__name__ = f"task_{basename}"
        task_fn.__doc__ = f"{basename} tasks of {project.pipeline.project}"
        ns[f"task_{basename}"] = task_fn
    return ns


def _reporter_class(project: Project):
    from kiln.tasks.reporter import KilnReporter

    # doit hands a reporter only its own options: bind where results are recorded
    return type("KilnReporter", (KilnReporter,), {"results_dir": project.state_dir})
