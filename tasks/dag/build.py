"""Running the DAG: doit with Kiln's loader, plus dumps asked for on the command line."""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path

from kiln.tasks.chain.instance_spec import ExecutorSettings
from kiln.tasks.dag.doit_commands import KilnDoitMain
from kiln.tasks.dag.loader import KilnLoader, doit_command, lock_for_command
from kiln.tasks.dag.lock import release
from kiln.tasks.dag.migrate import old_task_name
from kiln.tasks.execution import ahead
from kiln.tasks.execution.executor import resolve_executor
from kiln.tasks.model.artifacts import DUMP_FILES, stage_artifact
from kiln.tasks.model.importpath import add_project_root
from kiln.tasks.model.options_check import dump_problem
from kiln.tasks.model.project import KernelInstance, Project


def run_doit(
    project: Project | None,
    argv: list[str],
    *,
    fail_fast: bool = False,
    instances: list[KernelInstance] | None = None,
    groups: tuple[str, ...] | None = None,
) -> int:
    """Run a doit command line against the project's tasks; returns doit's exit code.

    Commands that run or change tasks hold the project lock while they run.
    A failed task does not stop the others unless ``fail_fast``. ``instances``
    and ``groups`` (task basenames) limit the tasks loaded to those the
    command line can need.
    """
    argv = [_instance_task(arg) for arg in argv]
    loader = KilnLoader(project, instances, fail_fast=fail_fast, groups=groups)
    if doit_command(argv) is None:
        return KilnDoitMain(loader).run(argv)
    locked = lock_for_command(loader.project, argv)
    try:
        return KilnDoitMain(loader).run(argv)
    finally:
        if locked:
            release(loader.project.state_dir)


def _instance_task(arg: str) -> str:
    """An old per-stage task name is its instance's task now (with a note)."""
    new = old_task_name(arg)
    if new is None:
        return arg
    print(
        f"kiln: note: {arg} is {new} now: an instance's stages build as one task "
        "(ask for a dump to see one stage's output)",
        file=sys.stderr,
    )
    return new


def start_executor(project: Project) -> ExecutorSettings | None:
    """The build's executor settings (checked now: a bad one is one message before any work)."""
    executor = resolve_executor(project.pipeline.executor, project.root)
    if executor is None:
        return None
    return ExecutorSettings(
        kind="dask",
        workers=executor.get("workers") or 1,
        address=executor.get("address"),
        source=executor.get("source") or "",
    )


def compile_instances(
    project: Project, instances: list[KernelInstance], jobs: int = 0, *, fail_fast: bool = False
) -> int:
    """Build ``instances``; 0 when all built, 1 when any failed (the others are still built).

    doit's plain runner walks the tasks; with ``jobs`` > 1 (or a Dask
    executor) the chains of the stale ones run on an executor ahead of
    their tasks (tasks/execution/ahead.py).
    """
    # one id for this build's processes: they share the remote cache's breaker
    os.environ.setdefault("KILN_BUILD_ID", f"{os.getpid()}-{time.time_ns()}")
    names = [f"compile:{inst.name}" for inst in instances]
    settings = start_executor(project)
    if settings is None and jobs > 1:
        settings = ExecutorSettings(kind="pool", workers=jobs)
    if settings is not None:
        ahead.start(settings, str(project.root), first_build=not project.dep_file.exists())
    try:
        rc = run_doit(
            project, ["run", *names], fail_fast=fail_fast, instances=instances, groups=("compile",)
        )
    finally:
        ahead.finish()
    return 1 if rc == 2 else rc  # doit's 2: a task not run because its input failed


def write_dump(project: Project, inst: KernelInstance, kind: str, path: Path) -> None:
    """Write one dump of an already built instance, from the owning stage's artifact."""
    if kind == "mlir":  # the iree target's input, made from the traced graph
        from kiln.runners.iree import dump_mlir
        from kiln.tasks.checks.targets import kernel_artifacts

        dump_mlir(kernel_artifacts(project, inst).graph, path)
        return
    problem = dump_problem(project, kind)
    if problem is not None:
        problem.message = f"--dump-{kind}: {problem.message}"
        raise problem
    owner, _ = DUMP_FILES[kind]
    stage = next(s for s in project.pipeline.stages if s.name == owner)
    add_project_root(project.root)
    module = importlib.import_module(stage.module)
    ir = module.read(Path(stage_artifact(inst, stage.module)))
    path.parent.mkdir(parents=True, exist_ok=True)
    module.DUMPS[kind](ir, path, project.kernel_machine(inst.kernel))
