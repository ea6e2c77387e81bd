"""Recorded results of builds, tests and benches: what `kiln view` shows.

- ``<instance out dir>/test-<target>.json``: the last `kiln test` (or doit
  ``test:`` task) report of that instance on that target.
- ``<instance out dir>/bench-<target>.json``: the last `kiln bench` row.

  Both carry ``binary``, the sha256 of the artifact they ran (``binary_digest``):
  a result of an older build of the instance is shown as such.
- ``.kiln/results/failures.json``: instance -> the diagnostic of its last
  failed compile; an instance leaves it when its compile succeeds again.
- ``.kiln/profile.json``: per task of the last build, start/end/worker/outcome.

Every file is written atomically; reading tolerates a missing or corrupt file
(a report shows "no result" rather than failing).
"""

from __future__ import annotations

import json
from pathlib import Path

from kiln.fsutil import file_digest, write_bytes_atomic
from kiln.tasks.model.artifacts import binary_stage, stage_artifact

FAILURES = "results/failures.json"
PROFILE = "profile.json"


def _dump(doc) -> bytes:
    return json.dumps(doc, indent=1, sort_keys=True).encode()


def read_json(path: Path, default=None):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return default


def save_test_report(out_dir: Path, report: dict) -> None:
    """Keep ``report`` (one instance on one target) as that pair's last test result."""
    write_bytes_atomic(Path(out_dir) / f"test-{report['target']}.json", _dump(report))


def save_bench_row(out_dir: Path, row: dict) -> None:
    write_bytes_atomic(Path(out_dir) / f"bench-{row['target']}.json", _dump(row))


def binary_digest(project, inst) -> str | None:
    """sha256 of what ``inst``'s targets run (its edf stage's binary; without one, its last
    stage's artifact); None while it is not built."""
    stage = binary_stage(project) or project.pipeline.stages[-1]
    try:
        return file_digest(stage_artifact(inst, stage.module))
    except OSError:
        return None


def instance_results(out_dir: Path, prefix: str) -> dict[str, dict]:
    """target -> last recorded result (``prefix`` is ``test`` or ``bench``)."""
    found = {}
    for path in sorted(Path(out_dir).glob(f"{prefix}-*.json")):
        doc = read_json(path)
        if isinstance(doc, dict):
            found[path.stem[len(prefix) + 1 :]] = doc
    return found


def task_instance(task_name: str) -> tuple[str, str] | None:
    """``compile:gemm.small`` -> (``gemm.small``, ``compile``); None for other tasks."""
    kind, _, rest = task_name.partition(":")
    if kind != "compile" or "." not in rest:
        return None
    return rest, kind


def update_failures(state_dir: Path, failed: dict[str, dict], succeeded: set[str]) -> None:
    """Record this build's failed instances (instance -> {task, diagnostic}); forget an
    instance once the task that failed succeeds or is up to date (``succeeded``: task names)."""
    path = Path(state_dir) / FAILURES
    known = read_json(path, {})
    if not isinstance(known, dict):
        known = {}
    before = dict(known)
    for inst, entry in list(known.items()):
        if not isinstance(entry, dict) or entry.get("task") in succeeded:
            known.pop(inst, None)
    known.update(failed)
    if known != before or (known and not path.exists()):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, _dump(known))


def read_failures(state_dir: Path) -> dict[str, dict]:
    doc = read_json(Path(state_dir) / FAILURES, {})
    return doc if isinstance(doc, dict) else {}


def save_profile(state_dir: Path, records: list[dict]) -> None:
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    # compact: a no-op build of thousands of instances records each, and the
    # indenting encoder is the pure-Python one (several times slower)
    text = json.dumps({"tasks": records}, sort_keys=True, separators=(",", ":"))
    write_bytes_atomic(Path(state_dir) / PROFILE, text.encode())


def read_profile(state_dir: Path) -> list[dict]:
    doc = read_json(Path(state_dir) / PROFILE, {})
    return list(doc.get("tasks", [])) if isinstance(doc, dict) else []


def chrome_trace(records: list[dict]) -> dict:
    """The build profile as Chrome Trace Event JSON (opens in Perfetto): one row per worker."""
    events = []
    t0 = min((r["start"] for r in records), default=0.0)
    for r in records:
        events.append(
            {
                "name": r["task"],
                "cat": r["outcome"],
                "ph": "X",
                "ts": round((r["start"] - t0) * 1e6, 1),
                "dur": round(max(r["end"] - r["start"], 0.0) * 1e6, 1),
                "pid": 1,
                "tid": r.get("worker", 0),
                "args": {"outcome": r["outcome"]},
            }
        )
    workers = sorted({r.get("worker", 0) for r in records})
    meta = [
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": w, "args": {"name": f"worker {w}"}}
        for w in workers
    ]
    return {"traceEvents": meta + events, "displayTimeUnit": "ms"}
