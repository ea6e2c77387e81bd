"""Running the DAG: doit with Kiln's loader, plus dumps asked for on the command line."""

from __future__ import annotations

import importlib
import os
import time
from pathlib import Path

from doit.doit_cmd import DoitMain
from kiln.tasks.compile import DUMP_FILES, stage_artifact
from kiln.tasks.executor import resolve_executor
from kiln.tasks.importpath import add_project_root
from kiln.tasks.loader import KilnLoader
from kiln.tasks.project import KernelInstance, Project

from kiln.errors import KilnError


def run_doit(project: Project | None, argv: list[str]) -> int:
    """Run a doit command line against the project's tasks; returns doit's exit code."""
    return DoitMain(KilnLoader(project)).run(argv)


def compile_instances(project: Project, instances: list[KernelInstance], jobs: int = 0) -> int:
    last = project.pipeline.stages[-1].name
    # one id for this build's processes: they share the remote cache's breaker
    os.environ.setdefault("KILN_BUILD_ID", f"{os.getpid()}-{time.time_ns()}")
    names = [f"compile:{inst.name}.{last}" for inst in instances]
    argv = ["run"] + (["-n", str(jobs)] if jobs > 1 else []) + names
    executor = resolve_executor(project.pipeline.executor, project.root)
    if executor is not None:
        from kiln.tasks.remote_exec import close_clients, prestart

        prestart(executor)
        # actions submit to Dask and wait: doit's thread runner gives the parallelism
        argv = ["run", "-P", "thread", "-n", str(max(jobs, 4)), *names]
        try:
            return run_doit(project, argv)
        finally:
            close_clients()
    return run_doit(project, argv)


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
