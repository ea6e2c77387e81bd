"""Built instances on targets: their artifacts, their inputs and the runner of a target.

Shared by `kiln run`, `kiln test`, `kiln bench`, apps and the doit test tasks.
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from pathlib import Path

from kiln.errors import KilnError, TargetError
from kiln.tasks.model.artifacts import binary_stage, stage_artifact
from kiln.tasks.model.importpath import add_project_root
from kiln.tasks.model.project import KernelInstance, Project


def load_function(project: Project, inst: KernelInstance):
    """The @device function object of an instance (imports its module)."""
    add_project_root(project.root)
    module = importlib.import_module(inst.source.module)
    return getattr(module, inst.source.name)


def kernel_artifacts(project: Project, inst: KernelInstance):
    """Artifacts of an already built instance, for a runner's prepare()."""
    from kiln.runners.base import KernelArtifacts
    from kiln.stages.trace import read as read_graph

    graph = read_graph(Path(stage_artifact(inst, project.pipeline.stages[0].module)))
    binary = binary_stage(project)
    edf = Path(stage_artifact(inst, binary.module)) if binary is not None else None
    return KernelArtifacts(inst.name, graph, inst.out_dir, edf, load_function(project, inst))


def instance_inputs(project: Project, inst: KernelInstance, graph, seed: int = 0) -> list:
    """The arrays every target of ``inst`` runs on: pipeline.yaml's ``inputs:`` drawn with ``seed``.

    The one way `kiln test`, `kiln run` and `kiln bench` make a kernel's
    inputs (kiln.inputs); a spec that cannot be used is an error at its line.
    """
    from kiln.inputs import random_inputs

    specs = instance_input_specs(project, inst)
    try:
        return random_inputs(
            inst.name,
            [(a.shape, a.dtype, specs.get(a.attr("name"))) for a in graph.args],
            seed,
            root=project.root,
        )
    except KilnError as err:  # a .npy file changed since the pipeline was loaded
        arg = graph.args[getattr(err, "argument", 0)].attr("name")
        err.message = f"argument {arg!r} of {inst.name}: " + err.message.split(": ", 1)[-1]
        spec = project.pipeline.kernel(inst.kernel)
        err.location = project.pipeline.locate(spec.input_key_path(inst.shape_set, arg))
        raise


def instance_input_specs(project: Project, inst: KernelInstance) -> dict:
    """Argument -> input spec of ``inst`` (its kernel's ``inputs:``, its shape set's over it)."""
    try:
        spec = project.pipeline.kernel(inst.kernel)
    except KeyError:  # an instance made outside pipeline.yaml: the defaults
        return {}
    return spec.input_specs(inst.shape_set)


def target_names(project: Project) -> list[str]:
    """Every name ``--target`` takes: pipeline.yaml's targets (Kiln's built-in ones
    included), then each runner kind no target is named after (``iree``, ``npu``)."""
    from kiln.pipeline import BUILTIN_RUNNERS

    names = [t.name for t in project.pipeline.targets]
    return names + [kind for kind in BUILTIN_RUNNERS if kind not in names]


def make_runner(project: Project, target: str):
    """Instantiate the runner of a pipeline target (or a bare runner kind like `cpu`)."""
    from kiln.pipeline import BUILTIN_RUNNERS
    from kiln.pipeline.yamlpos import did_you_mean
    from kiln.runners.base import load_runner_class

    spec = next((t for t in project.pipeline.targets if t.name == target), None)
    if spec is None:
        if target in BUILTIN_RUNNERS:
            return load_runner_class(target)(machine=project.machine())
        names = target_names(project)
        raise TargetError(
            f"unknown target {target!r}",
            expected="one of: " + ", ".join(names),
            found=target,
            hint=did_you_mean(target, names)
            or "targets are declared under `targets:` in pipeline.yaml",
        )
    from kiln.cache.config import resolve_cache_config

    try:
        cls = load_runner_class(spec.runner)
    except TargetError as err:
        if err.location is None:  # point at the target in pipeline.yaml
            err.location = project.pipeline.locate(f"targets.{spec.name}.runner", value=True)
        raise
    runner = cls(options=dict(spec.options), machine=project.machine(spec.machine))
    try:
        runner.check_options()
    except TargetError as err:
        if err.location is None:  # point at the option in pipeline.yaml
            key = f"targets.{spec.name}.options"
            named = f"{key}.{err.found}" if err.found in spec.options else key
            err.location = project.pipeline.locate(named)
        raise
    runner.artifact_cache = resolve_cache_config(project.pipeline.cache_settings)
    return runner


@contextmanager
def runner_errors(target: str, runner):
    """A runner's own exception (a plugin's bug, a device fault) as a TargetError naming it.

    A KilnError is a message already, and KeyboardInterrupt is no Exception: both go on.
    KILN_DEBUG=1 adds the traceback as a note, as for a stage's crash.
    """
    try:
        yield
    except KilnError:
        raise
    except Exception as exc:
        import os
        import traceback

        cls = type(runner)
        text = f": {exc}" if str(exc) else ""
        detail = traceback.format_exc() if os.environ.get("KILN_DEBUG") else None
        raise TargetError(
            f"target {target!r} raised {type(exc).__name__}{text}",
            hint=f"its runner ({cls.__module__}.{cls.__qualname__}) failed while preparing or "
            "running the kernel, which says nothing of the kernel's result"
            + ("; set KILN_DEBUG=1 for the full traceback" if detail is None else ""),
            notes=[detail] if detail else [],
        ) from exc
