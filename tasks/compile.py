"""The compile DAG: one doit task per kernel instance and row of ``stages:``.

Task ``compile:<kernel>.<shapes>.<stage>`` reads the previous stage's
artifact (the trace stage reads the kernel's source files), writes its own
artifact only when the bytes change (early cutoff), and re-runs when its
config digest changes (options, machine, Kiln version, stage source).
"""

from __future__ import annotations

from doit.tools import config_changed

import kiln
from tasks.digest import combine, digest_json, module_source_digest
from tasks.project import KernelInstance, Project

# dump kind -> (stage name that owns it, path inside the instance's out dir)
DUMP_FILES = {
    "dfg": ("trace", "dumps/dfg.json"),
    "visa": ("visa", "dumps/kernel.visa"),
    "ir": ("lir", "dumps/lir.msgpack"),
    "graph": ("lir", "dumps/lir_graph.json"),
    "schedule": ("schedule", "dumps/schedule.json"),
    "summary": ("edf", "dumps/summary"),
}


def artifact_name(stage_module: str) -> str:
    """The artifact file a stage module writes, read from its source without importing it."""
    return _ARTIFACTS.get(stage_module) or _read_artifact_constant(stage_module)


_ARTIFACTS: dict[str, str] = {}


def _read_artifact_constant(module: str) -> str:
    import ast
    import importlib.util

    spec = importlib.util.find_spec(module)
    name = module.rsplit(".", 1)[-1]
    if spec is not None and spec.origin:
        with open(spec.origin, "rb") as f:
            tree = ast.parse(f.read())
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "ARTIFACT" for t in node.targets)
                and isinstance(node.value, ast.Constant)
            ):
                name = node.value.value
                break
    _ARTIFACTS[module] = name
    return name


def instance_dumps(project: Project, inst: KernelInstance) -> dict[str, list[tuple[str, str]]]:
    """stage name -> [(dump kind, path)] asked for by the pipeline's ``dumps:``."""
    wanted: dict[str, list[tuple[str, str]]] = {}
    for dump in project.pipeline.dumps:
        if dump.kernels and inst.kernel not in dump.kernels:
            continue
        for kind in dump.kinds:
            stage, rel = DUMP_FILES[kind]
            wanted.setdefault(stage, []).append((kind, str(inst.out_dir / rel)))
    return wanted


def stage_artifact(inst: KernelInstance, stage_module: str) -> str:
    return str(inst.out_dir / artifact_name(stage_module))


def compile_tasks(project: Project, instances: list[KernelInstance] | None = None):
    """Yield the doit task dicts of the compile DAG."""
    pipeline = project.pipeline
    machine = project.machine()
    shared = {
        "machine": digest_json(machine),
        "version": kiln.__version__,
    }
    stage_digests = {s.name: module_source_digest(s.module) for s in pipeline.stages}
    option_digests: dict[str, str] = {}
    for inst in instances if instances is not None else project.instances:
        sources = project.discovery.source_files(inst.source.module)
        dumps = instance_dumps(project, inst)
        previous: str | None = None
        previous_module: str | None = None
        for index, stage in enumerate(pipeline.stages):
            options = pipeline.stage_options(inst.kernel, stage.name)
            key = f"{stage.name}:{sorted(options.items())!r}"
            if key not in option_digests:
                option_digests[key] = digest_json(options)
            artifact = stage_artifact(inst, stage.module)
            stage_dumps = dumps.get(stage.name, [])
            parts = dict(
                shared, options=option_digests[key], stage_source=stage_digests[stage.name]
            )
            if stage_dumps:
                parts["dumps"] = digest_json(stage_dumps)
            spec = {
                "root": str(project.root),
                "pipeline": str(project.pipeline_path),
                "instance": inst.name,
                "stage": stage.name,
                "stage_index": index,
                "module": stage.module,
                "options": options,
                "machine": machine,
                "artifact": artifact,
                "dumps": stage_dumps,
                "parts": None,
            }
            if previous is None:
                dtype, dtypes = project.trace_dtypes(inst.kernel)
                spec["trace"] = {
                    "module": inst.source.module,
                    "function": inst.source.name,
                    "bindings": list(inst.bindings),
                    "dtypes": sorted(dtypes.items()),
                    "default_dtype": dtype,
                }
                parts["kernel"] = digest_json(spec["trace"])
                file_dep = sources
            else:
                spec["input"] = previous
                spec["input_module"] = previous_module
                file_dep = [previous]
            spec["parts"] = parts
            yield {
                "basename": "compile",
                "name": f"{inst.name}.{stage.name}",
                "actions": [(_run_stage, [spec])],
                "file_dep": file_dep,
                "targets": [artifact] + [path for _, path in stage_dumps],
                "uptodate": [config_changed(combine(parts))],
                "clean": True,
                "doc": f"{stage.name} of {inst.name} ({inst.source.path})",
                "verbosity": 1,
            }
            previous, previous_module = artifact, stage.module


def _run_stage(spec: dict):
    # Imported here so that loading tasks never imports numpy or the stages.
    from tasks.actions import run_stage

    return run_stage(spec)
