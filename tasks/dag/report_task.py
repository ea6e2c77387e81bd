"""The ``report:html`` doit task: `doit report` writes ``<out_dir>/report.html``.

The report is fed by what builds, tests and benches recorded, not by the
compile DAG: it builds nothing and runs whatever state the out dir is in
(failed instances included). It reruns only when an input changed: a file
in an instance's out dir (artifacts, side files, test and bench results),
the recorded failures, what `kiln status` says of each compile task (a row
is "out of date" after a kernel or pipeline.yaml edit), or the report's own
code; or when ``report.html`` is not the page it wrote (`kiln view FILTER`
writes its own page there). The build profile is not an input, or every
no-op build would make the report stale.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path

import kiln
from kiln.fsutil import file_digest
from kiln.tasks.checks.results import FAILURES
from kiln.tasks.model.digest import stage_module_info
from kiln.tasks.model.project import KernelInstance, Project

REPORT_FILE = "report.html"
_PROJECTS: dict[str, Project] = {}


def report_tasks(project: Project, instances: list[KernelInstance] | None = None):
    selected = instances if instances is not None else project.instances
    names = [inst.name for inst in selected]
    out = str(Path(project.out_dir) / REPORT_FILE)
    pipeline = str(project.pipeline_path)
    yield {
        "name": "html",
        "actions": [(_write, [pipeline, names, out])],
        "uptodate": [(_unchanged, [pipeline, names, out])],
        "targets": [out],
        "clean": True,
        "doc": "write the build report (kiln view) of the selected kernels",
    }


def inputs_digest(project: Project, instances: list[KernelInstance]) -> str:
    """What the report reads, by path, mtime and size, the report's own code, and the
    compile tasks' status (`kiln status`), which decides the rows' status."""
    from kiln.tasks.dag.status import explain

    h = hashlib.sha256(kiln.__version__.encode())
    # first: a damaged artifact it finds is removed, which the file list below then lacks
    for name, reasons in explain(project, instances):
        h.update(f"{name}\0{reasons}\n".encode())
    h.update(stage_module_info("kiln.report.page")[0].encode())
    assets = resources.files("kiln.report").joinpath("assets")
    for asset in sorted(assets.iterdir(), key=lambda a: a.name):
        h.update(asset.read_bytes())
    files = [project.state_dir / FAILURES]
    for inst in instances:
        if inst.out_dir.is_dir():
            files.extend(sorted(p for p in inst.out_dir.rglob("*") if p.is_file()))
    for path in files:
        try:
            st = path.stat()
        except OSError:
            continue
        h.update(f"{path}\0{st.st_mtime_ns}\0{st.st_size}\n".encode())
    return h.hexdigest()


def _load(pipeline: str, names: list[str]) -> tuple[Project, list[KernelInstance]]:
    if pipeline not in _PROJECTS:
        _PROJECTS[pipeline] = Project(Path(pipeline))
    project = _PROJECTS[pipeline]
    wanted = set(names)
    return project, [inst for inst in project.instances if inst.name in wanted]


def _unchanged(task, values, pipeline: str, names: list[str], out: str) -> bool:
    """Up to date while ``out`` holds the page this task wrote and its inputs are unchanged."""
    try:
        if values.get("page") != file_digest(out):
            return False
    except OSError:
        return False
    project, instances = _load(pipeline, names)
    return values.get("inputs") == inputs_digest(project, instances)


def _write(pipeline: str, names: list[str], out: str):
    """Write the report; a problem comes back as the diagnostic `kiln view` prints, no traceback."""
    from kiln.errors import KilnError, environment_error
    from kiln.report.page import render_report, write_page
    from kiln.tasks.chain.task_failure import failure

    try:
        project, instances = _load(pipeline, names)
        digest = inputs_digest(project, instances)
        page = render_report(project, instances, Path(out))
        write_page(Path(out), page)
    except KilnError as err:
        return failure(err)
    except OSError as exc:  # a directory where report.html goes, a full disk, permissions
        return failure(environment_error(exc))
    return {"inputs": digest, "page": hashlib.sha256(page).hexdigest()}
