"""Where an instance's artifacts and dumps live in its out dir."""

from __future__ import annotations

from kiln.tasks.model.digest import stage_module_info
from kiln.tasks.model.project import KernelInstance, Project

# dump kind -> (stage name that owns it, path inside the instance's out dir)
DUMP_FILES = {
    "dfg": ("trace", "dumps/dfg.json"),
    "visa": ("visa", "dumps/kernel.visa"),
    "ir": ("lir", "dumps/lir.msgpack"),
    "graph": ("lir", "dumps/lir_graph.json"),
    "schedule": ("schedule", "dumps/schedule.json"),
    "summary": ("edf", "dumps/summary"),
}


# the row whose artifact the targets run (an EDF binary), wherever it is in ``stages:``:
# rows after it may read it (a signature, a package)
BINARY_STAGE = "edf"


def binary_stage(project: Project):
    """The pipeline's edf row (its StageSpec), or None when it has none."""
    return next((s for s in project.pipeline.stages if s.name == BINARY_STAGE), None)


def artifact_name(stage_module: str) -> str:
    """The artifact file a stage module writes (its ``ARTIFACT``)."""
    return stage_module_info(stage_module)[1]


def instance_dumps(project: Project, inst: KernelInstance) -> dict[str, list[tuple[str, str]]]:
    """stage name -> [(dump kind, path in the out dir)] asked for by the pipeline's ``dumps:``."""
    wanted: dict[str, list[tuple[str, str]]] = {}
    for dump in project.pipeline.dumps:
        if dump.kernels and inst.kernel not in dump.kernels:
            continue
        for kind in dump.kinds:
            stage, rel = DUMP_FILES[kind]
            wanted.setdefault(stage, []).append((kind, rel))
    return wanted


def stage_artifact(inst: KernelInstance, stage_module: str) -> str:
    return f"{inst.out_dir}/{artifact_name(stage_module)}"
