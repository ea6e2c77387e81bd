"""`kiln status`: for each task that would run, say why (doit has no dry run)."""

from __future__ import annotations

from doit.dependency import Dependency, SqliteDB
from doit.loader import generate_tasks

from tasks.compile import compile_tasks
from tasks.project import KernelInstance, Project

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
    db_file = project.state_dir / "doit.sqlite3"
    dep = Dependency(SqliteDB, str(db_file), checker_cls=checker)
    tasks = generate_tasks("compile", compile_tasks(project, instances))
    by_name = {t.name: t for t in tasks}
    producers = {t: task.name for task in tasks for t in task.targets}
    results = []
    pending: set[str] = set()
    for task in tasks:
        if not task.actions:
            continue
        status = dep.get_status(task, by_name, get_log=True)
        reasons = _reasons(dep, task, status)
        upstream = [producers[f] for f in task.file_dep if f in producers]
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


def _reasons(dep: Dependency, task, status) -> list[str]:
    if status.status == "up-to-date":
        return []
    out: list[str] = []
    reasons = status.reasons
    for path in reasons.get("missing_file_dep", []):
        out.append(f"input not built yet: {path}")
    for target in reasons.get("missing_target", []):
        out.append(f"missing artifact {target}")
    for path in reasons.get("changed_file_dep", []):
        out.append(f"file changed: {path}")
    for path in reasons.get("added_file_dep", []):
        out.append(f"new dependency: {path}")
    for path in reasons.get("removed_file_dep", []):
        out.append(f"dependency removed: {path}")
    if reasons.get("uptodate_false"):
        saved = (dep.get_values(task.name) or {}).get("parts")
        if saved is None:
            out.append("never built")
        else:
            current = _current_parts(task)
            changed = [
                k for k in sorted(set(current) | set(saved)) if current.get(k) != saved.get(k)
            ]
            out.extend(PART_NAMES.get(k, f"{k} changed") for k in changed)
            if not changed:
                out.append("configuration changed")
    if reasons.get("checker_changed"):
        out.append("cache check method changed (timestamp/md5)")
    if not out:
        out.append("out of date")
    return out


def _current_parts(task) -> dict:
    for action in task.actions:
        args = getattr(action, "args", None)
        if args and isinstance(args[0], dict) and "parts" in args[0]:
            return args[0]["parts"]
    return {}
