"""`kiln status`: for each task that would run, say why (doit has no dry run)."""

from __future__ import annotations

from doit.dependency import Dependency, SqliteDB
from doit.loader import generate_tasks
from kiln.tasks.compile import compile_tasks
from kiln.tasks.digest import read_stamp
from kiln.tasks.project import KernelInstance, Project

PART_NAMES = {
    "options": "stage options changed",
    "machine": "machine model changed",
    "version": "kiln version changed",
    "stage_source": "stage module source changed",
    "kernel": "kernel function, shapes or dtypes changed",
    "dumps": "requested dumps changed",
}


def explain(project: Project, instances: list[KernelInstance]) -> list[tuple[str, list[str]]]:
    """(task name, reasons) for every compile task of ``instances``; no reasons = up to date."""
    from doit.dependency import MD5Checker, TimestampChecker

    checker = MD5Checker if project.pipeline.cache_check == "md5" else TimestampChecker
    from kiln.statefiles import ensure_sound_db

    db_file = project.dep_file
    ensure_sound_db(db_file)
    dep = Dependency(SqliteDB, str(db_file), checker_cls=checker)
    from kiln.tasks.results import read_failures

    tasks = generate_tasks("compile", compile_tasks(project, instances))
    by_name = {t.name: t for t in tasks}
    producers = {t: task.name for task in tasks for t in task.targets}
    failed_tasks = {
        entry["task"]: entry.get("diagnostic")
        for entry in read_failures(project.state_dir).values()
        if isinstance(entry, dict) and isinstance(entry.get("task"), str)
    }
    results = []
    pending: set[str] = set()
    blocked: set[str] = set()  # never built because a task they need failed
    for task in tasks:
        if not task.actions:
            continue
        status = dep.get_status(task, by_name, get_log=True)
        reasons = _reasons(dep, task, status, str(project.state_dir / "config"))
        upstream = [producers[f] for f in task.file_dep if f in producers]
        if reasons and task.name in failed_tasks:
            reasons = [_failed_reason(failed_tasks[task.name])]
        elif reasons and reasons[0] == "never built":
            broken = [u for u in upstream if u in failed_tasks or u in blocked]
            if broken:
                reasons = [f"not built: its input {broken[0]} failed at the last build"]
                blocked.add(task.name)
        if not reasons and any(u in pending for u in upstream):
            reasons = [
                f"may run: its input is rebuilt by {', '.join(upstream)} "
                "(skipped if the bytes come out the same)"
            ]
        if reasons:
            pending.add(task.name)
        results.append((task.name, reasons))
    dep.close()
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


def _reasons(dep: Dependency, task, status, stamp_dir: str) -> list[str]:
    if status.status == "up-to-date":
        return []
    if dep._get(task.name, "deps:") is None:
        return ["never built"]
    reasons = status.reasons
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
    if reasons.get("checker_changed"):
        out.append("cache check method changed (timestamp/md5)")
    if not out:
        out.append("out of date")
    return out


def _config_changes(old_stamps: list[str], new_stamps: list[str]) -> list[str]:
    """Which config parts differ between the stamp a task was built with and today's."""
    old = read_stamp(old_stamps[0]) if old_stamps else None
    new = read_stamp(new_stamps[0])
    if old is None or new is None:
        return ["configuration changed"]
    changed = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return [PART_NAMES.get(k, f"{k} changed") for k in changed] or ["configuration changed"]
