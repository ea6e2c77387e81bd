"""What the report shows, read from a build's artifacts and recorded results.

Nothing here builds: an instance whose artifacts are missing is "not
built" (or "failed", with the diagnostic the last build recorded). Each
instance gives a small index row and a detail dict (timeline, graphs,
source map, dumps) that html.py compresses into the page.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from kiln.report.layout import lir_graph, traced_graph
from kiln.report.schedule_data import schedule_payload
from kiln.summary import summarize
from kiln.tasks.checks.results import binary_digest, instance_results, read_failures, read_json
from kiln.tasks.model.artifacts import stage_artifact
from kiln.tasks.model.project import KernelInstance, Project

# the stage modules whose artifacts the report reads, by the role they play
STAGE_ROLES = {
    "kiln.stages.trace": "graph",
    "kiln.stages.visa": "visa",
    "kiln.stages.schedule": "schedule",
    "kiln.stages.edf": "binary",
}
SOURCE_MAP = "graph.srcmap.json"
NODE_MAP = "kernel.visa.nodes.json"


def artifact_paths(project: Project, inst: KernelInstance) -> dict[str, Path]:
    """role -> artifact path of ``inst`` for the stages of this pipeline the report knows."""
    paths = {}
    for stage in project.pipeline.stages:
        role = STAGE_ROLES.get(stage.module)
        if role:
            paths[role] = Path(stage_artifact(inst, stage.module))
    return paths


def collect(project: Project, instances: list[KernelInstance]) -> list[dict]:
    """One entry per instance: ``row`` (the index) and ``detail`` (its section)."""
    failures = read_failures(project.state_dir)
    return [_instance(project, inst, failures.get(inst.name)) for inst in instances]


def _instance(project: Project, inst: KernelInstance, failure: dict | None) -> dict:
    paths = artifact_paths(project, inst)
    machine = project.kernel_machine(inst.kernel) or {}
    binary = binary_digest(project, inst)
    row = {
        "name": inst.name,
        "kernel": inst.kernel,
        "shapes": inst.shape_set,
        "path": inst.source.path,
        "status": "not built",
        "tests": _tests(inst.out_dir, binary),
        "bench": {
            target: {**r, "stale": _stale(r, binary)}
            for target, r in instance_results(inst.out_dir, "bench").items()
        },
    }
    detail: dict = {"name": inst.name, "dumps": _dumps(project, inst)}
    if failure:
        row["status"] = "failed"
        detail["diagnostic"] = failure.get("diagnostic")
        detail["failed_task"] = failure.get("task")
    last = Path(stage_artifact(inst, project.pipeline.stages[-1].module))
    if last.is_file() and not failure:
        row["status"] = "built"
    sched = _read(paths.get("schedule"), "kiln.stages.schedule")
    if sched is not None and not failure:
        summary = summarize(sched, machine)
        row.update(
            makespan=summary["makespan_cycles"],
            lower_bound=summary["lower_bound_cycles"],
            ratio=summary["ratio"],
            instructions=summary["instructions"]["total"],
            sram_peak=summary["sram"]["peak_bytes"],
        )
        detail["summary"] = summary
        nodes = _node_map(paths.get("visa"))
        detail["schedule"] = schedule_payload(sched, nodes)
        detail["lir_graph"] = lir_graph(sched.program)
    graph = _read(paths.get("graph"), "kiln.stages.trace")
    srcmap = read_json(paths["graph"].with_name(SOURCE_MAP)) if "graph" in paths else None
    lines = {int(k): v for k, v in (srcmap or {}).get("nodes", {}).items()}
    if graph is not None:
        detail["graph"] = traced_graph(graph, lines)
    if srcmap:
        detail["source"] = {
            "file": srcmap.get("file", ""),
            "first_line": srcmap.get("first_line", 1),
            "lines": srcmap.get("source", []),
            "node_lines": {str(k): v for k, v in sorted(lines.items())},
        }
    visa_text = _text(paths.get("visa"))
    if visa_text is not None and "schedule" in detail:
        text_lines = visa_text.splitlines()
        count = len(detail["schedule"]["text"])
        # instructions are the last lines of the vISA text, in order (see visa_text.py)
        detail["visa"] = {"lines": text_lines, "first_instr_line": len(text_lines) - count}
    return {"row": row, "detail": detail}


def _read(path: Path | None, module: str):
    """A stage artifact through its stage's reader; None when absent or unreadable."""
    if path is None or not path.is_file():
        return None
    from kiln.errors import KilnError

    try:
        return importlib.import_module(module).read(path)
    except KilnError:
        return None


def _text(path: Path | None) -> str | None:
    try:
        return path.read_text() if path is not None else None
    except (OSError, UnicodeDecodeError):
        return None


def _node_map(visa_path: Path | None) -> list[int] | None:
    if visa_path is None:
        return None
    doc = read_json(visa_path.with_name(NODE_MAP))
    return doc.get("nodes") if isinstance(doc, dict) else None


def _tests(out_dir: Path, binary: str | None) -> dict[str, dict]:
    """target -> {status, max_abs, stale} of the last recorded test."""
    out = {}
    for target, r in instance_results(out_dir, "test").items():
        worst = max((c.get("max_abs", 0.0) or 0.0 for c in r.get("outputs", [])), default=None)
        out[target] = {"status": r.get("status", "?"), "max_abs": worst, "stale": _stale(r, binary)}
    return out


def _stale(result: dict, binary: str | None) -> bool:
    """Whether a recorded result ran on another binary than the instance's current one
    (one that names none, a build error or a skip, is of no binary in particular)."""
    return "binary" in result and result["binary"] != binary


def _dumps(project: Project, inst: KernelInstance) -> list[str]:
    """The instance's files (artifacts, side files, dumps); html.py links them relatively."""
    if not inst.out_dir.is_dir():
        return []
    return [str(p) for p in sorted(inst.out_dir.rglob("*")) if p.is_file()]


def build_profile(project: Project) -> list[dict]:
    from kiln.tasks.checks.results import read_profile

    records = read_profile(project.state_dir)
    t0 = min((r["start"] for r in records), default=0.0)
    return [
        {
            "task": r["task"],
            "worker": r.get("worker", 0),
            "outcome": r["outcome"],
            "start_ms": round((r["start"] - t0) * 1e3, 3),
            "end_ms": round((r["end"] - t0) * 1e3, 3),
        }
        for r in records
    ]
