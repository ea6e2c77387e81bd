"""Running the DAG: doit with Kiln's loader, plus dumps asked for on the command line."""

from __future__ import annotations

import importlib
import os
import time
from pathlib import Path

from kiln.tasks.compile import DUMP_FILES, stage_artifact
from kiln.tasks.doit_commands import KilnDoitMain
from kiln.tasks.executor import resolve_executor
from kiln.tasks.importpath import add_project_root
from kiln.tasks.loader import KilnLoader, doit_command, lock_for_command
from kiln.tasks.lock import release
from kiln.tasks.project import KernelInstance, Project

from kiln.errors import KilnError


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
    loader = KilnLoader(project, instances, fail_fast=fail_fast, groups=groups)
    if doit_command(argv) is None:
        return KilnDoitMain(loader).run(argv)
    locked = lock_for_command(loader.project, argv)
    try:
        return KilnDoitMain(loader).run(argv)
    finally:
        if locked:
            release(loader.project.state_dir)


def start_executor(project: Project) -> dict | None:
    """Start the dask executor's cluster now, while the build finds what to build
    (once per build: later calls find it started); the executor, None for local.

    Only for a project's first build (no record of one in its out dir): a
    build after it often has nothing or little to do, and the cluster then
    starts when a chain first needs it. Starting and closing a LocalCluster
    for nothing made a no-op build three times as slow.
    """
    executor = resolve_executor(project.pipeline.executor, project.root)
    if executor is None:
        return None
    from kiln.tasks.remote_exec import allow_start, prestart

    if project.dep_file.exists():
        allow_start(executor)
    else:
        prestart(executor, [stage.module for stage in project.pipeline.stages])
    return executor


def compile_instances(
    project: Project, instances: list[KernelInstance], jobs: int = 0, *, fail_fast: bool = False
) -> int:
    """Build ``instances``; 0 when all built, 1 when any failed (the others are still built)."""
    last = project.pipeline.stages[-1].name
    # one id for this build's processes: they share the remote cache's breaker
    os.environ.setdefault("KILN_BUILD_ID", f"{os.getpid()}-{time.time_ns()}")
    names = [f"compile:{inst.name}.{last}" for inst in instances]
    argv = ["run"] + (["-n", str(jobs)] if jobs > 1 else []) + names
    executor = start_executor(project)
    if executor is not None:
        from kiln.tasks.remote_exec import close_clients

        # doit's plain runner, which sends chains to Dask ahead (tasks/ahead_runner.py);
        # -n is the LocalCluster's worker count, not doit's
        argv = ["run", *names]
    try:
        rc = run_doit(project, argv, fail_fast=fail_fast, instances=instances, groups=("compile",))
    finally:
        if executor is not None:
            close_clients()
    return 1 if rc == 2 else rc  # doit's 2: a task not run because its input failed


def write_dump(project: Project, inst: KernelInstance, kind: str, path: Path) -> None:
    """Write one dump of an already built instance, from the owning stage's artifact."""
    if kind == "mlir":  # the iree target's input, made from the traced graph
        from kiln.runners.iree import dump_mlir
        from kiln.tasks.running import kernel_artifacts

        dump_mlir(kernel_artifacts(project, inst).graph, path)
        return
    owner, _ = DUMP_FILES[kind]
    stage = next((s for s in project.pipeline.stages if s.name == owner), None)
    if stage is None:
        raise KilnError(
            f"--dump-{kind} needs the {owner!r} stage, which this pipeline does not run",
            expected=f"a row named {owner!r} in stages:",
            found=", ".join(s.name for s in project.pipeline.stages),
        )
    add_project_root(project.root)
    module = importlib.import_module(stage.module)
    ir = module.read(Path(stage_artifact(inst, stage.module)))
    path.parent.mkdir(parents=True, exist_ok=True)
    module.DUMPS[kind](ir, path, project.kernel_machine(inst.kernel))
