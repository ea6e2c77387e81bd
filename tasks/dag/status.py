"""`kiln status`: for each task that would run, say why (doit has no dry run)."""

from __future__ import annotations

from doit.dependency import Dependency, SqliteDB
from doit.loader import generate_tasks

from kiln.tasks.dag.compile import compile_tasks, instance_spec
from kiln.tasks.model.digest import read_stamp
from kiln.tasks.model.project import KernelInstance, Project

PART_NAMES = {
    "options": "stage options changed",
    "machine": "machine model changed",
    "version": "kiln version changed",
    "stage_source": "stage module source changed",
    "kernel": "kernel function, shapes or dtypes changed",
    "dumps": "requested dumps changed",
    "tuning": "tuning record changed",
}


def explain(project: Project, instances: list[KernelInstance]) -> list[tuple[str, list[str]]]:
    """(task name, reasons) for every compile task of ``instances``; no reasons = up to date."""
    from doit.dependency import MD5Checker, TimestampChecker

    checker = MD5Checker if project.pipeline.cache_check == "md5" else TimestampChecker
    from kiln.statefiles import ensure_sound_db

    db_file = project.dep_file
    ensure_sound_db(db_file)
    dep = Dependency(SqliteDB, str(db_file), checker_cls=checker)
    from kiln.tasks.chain.failure_groups import cause_key
    from kiln.tasks.checks.results import read_failures

    tasks = generate_tasks("compile", compile_tasks(project, instances))
    by_name = {t.name: t for t in tasks}
    failed_tasks = {
        entry["task"]: entry.get("diagnostic")
        for entry in read_failures(project.state_dir).values()
        if isinstance(entry, dict) and isinstance(entry.get("task"), str)
    }
    results = []
    causes: dict[str, str] = {}  # one cause of many failures: its first task says it
    stages = [stage.name for stage in project.pipeline.stages]
    for task in tasks:
        if not task.actions:
            continue
        built = bool(dep.get_values(task.name))  # before get_status, which may forget it
        status = dep.get_status(task, by_name, get_log=True)
        reasons = _reasons(task, status, str(project.state_dir / "config"), built)
        if reasons and task.name in failed_tasks:
            diagnostic = failed_tasks[task.name]
            first = causes.setdefault(cause_key(task.name, diagnostic), task.name)
            same = f"failed at the last build: the same error as {first}"
            reasons = [_failed_reason(diagnostic) if first == task.name else same]
        if reasons:
            reasons.append(
                f"starts at stage {_start_stage(dep, task, status, stages)}"
                + (" (may stop early)" if len(stages) > 1 else "")
            )
        results.append((task.name, reasons))
    # never dep.close(): it would commit what get_status did to the records (a task whose
    # cache check method changed is deleted), and status only reads. Unclosed, the
    # connection goes with ``dep`` and sqlite rolls that back.
    return results


def _failed_reason(diagnostic) -> str:
    """``failed at the last build: file:line: message`` from a recorded diagnostic."""
    if isinstance(diagnostic, dict) and diagnostic.get("message"):
        where = diagnostic.get("file")
        if where:
            from kiln.errors import relative_path

            where = relative_path(where)
        if where and diagnostic.get("line"):
            where = f"{where}:{diagnostic['line']}"
        text = f"{where}: {diagnostic['message']}" if where else diagnostic["message"]
    elif isinstance(diagnostic, str) and diagnostic.strip():
        text = diagnostic.strip().splitlines()[0]
    else:
        text = "see the last build's output"
    return f"failed at the last build: {text}"


def _reasons(task, status, stamp_dir: str, built: bool) -> list[str]:
    if status.status == "up-to-date":
        return []
    reasons = status.reasons
    if reasons.get("checker_changed"):
        old, new = reasons["checker_changed"]
        return [f"cache check method changed ({_checker_name(old)} -> {_checker_name(new)})"]
    if not built:  # a compile action always saves values
        return ["never built"]
    is_stamp = lambda path: path.startswith(stamp_dir)  # noqa: E731
    out: list[str] = []
    for target in reasons.get("missing_target", []):
        out.append(f"missing artifact {target}")
    for path in reasons.get("missing_file_dep", []):
        out.append(f"input not built yet: {path}")
    added = list(reasons.get("added_file_dep", []))
    removed = list(reasons.get("removed_file_dep", []))
    new_stamps = [p for p in added if is_stamp(p)]
    old_stamps = [p for p in removed if is_stamp(p)]
    if new_stamps:
        out.extend(_config_changes(old_stamps, new_stamps))
    for path in reasons.get("changed_file_dep", []):
        if not is_stamp(path) and path not in added:
            out.append(f"file changed: {path}")
    out.extend(f"new dependency: {p}" for p in added if not is_stamp(p))
    out.extend(f"dependency removed: {p}" for p in removed if not is_stamp(p))
    if not out:
        out.append("out of date")
    return out


def _checker_name(cls_name: str) -> str:
    """pipeline.yaml's name (``cache.check``) of one of doit's checker classes."""
    return {"MD5Checker": "md5", "TimestampChecker": "timestamp"}.get(cls_name, cls_name)


def _config_changes(old_stamps: list[str], new_stamps: list[str]) -> list[str]:
    """Which config parts differ between the stamp a task was built with and today's."""
    old = read_stamp(old_stamps[0]) if old_stamps else None
    new = read_stamp(new_stamps[0])
    if old is None or new is None:
        return ["configuration changed"]
    changed = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return [_part_name(k) for k in changed] or ["configuration changed"]


def _part_name(part: str) -> str:
    kind, _, stage = part.partition(".")
    text = PART_NAMES.get(kind, f"{part} changed")
    return f"{text} ({stage})" if stage else text


def _start_stage(dep: Dependency, task, status, stages: list[str]) -> str:
    """The first stage the chain will run: what changed decides it (never later than a
    missing artifact's stage)."""
    reasons = status.reasons
    added_deps = set(reasons.get("added_file_dep", []))
    sources_changed = [
        p
        for p in reasons.get("changed_file_dep", [])
        if p not in added_deps and "/config/" not in p
    ]
    if not dep.get_values(task.name) or sources_changed:
        return stages[0]  # a kernel source changed (a stamp never changes, it is replaced)
    first = len(stages)
    spec = instance_spec(task)
    owner = {}
    if spec is not None:
        for i, stage in enumerate(spec.chain.stages):
            for rel in (stage.artifact, *(path for _, path in stage.dumps)):
                owner[f"{spec.out_dir}/{rel}"] = i
    for target in reasons.get("missing_target", []):
        first = min(first, owner.get(target, 0))
    added = [p for p in reasons.get("added_file_dep", []) if "/config/" in p]
    removed = [p for p in reasons.get("removed_file_dep", []) if "/config/" in p]
    old = read_stamp(removed[0]) if removed else None
    new = read_stamp(added[0]) if added else None
    if added:
        if old is None or new is None:
            return stages[0]
        for part in sorted(set(old) | set(new)):
            if old.get(part) == new.get(part):
                continue
            _, _, stage = part.partition(".")
            if stage in stages:
                first = min(first, stages.index(stage))
            elif part == "dumps":
                first = min(first, _first_dump_stage(old.get(part), new.get(part), stages))
            elif part == "tuning":
                first = min(first, 1 if len(stages) > 1 else 0)
            else:
                first = 0
    if first >= len(stages):
        return stages[0]
    return stages[first]


def _first_dump_stage(old, new, stages: list[str]) -> int:
    # the stamp holds only the dumps' digest: the earliest stage that owns any dump
    from kiln.tasks.model.artifacts import DUMP_FILES

    owners = {stage for stage, _ in DUMP_FILES.values()}
    return min((i for i, s in enumerate(stages) if s in owners), default=0)
