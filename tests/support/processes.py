"""The processes a build starts, seen from a test (Linux /proc)."""

from __future__ import annotations

from pathlib import Path


def child_pids(pid: int) -> list[int]:
    """The processes ``pid`` started that are still its children."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(c) for c in task.read_text().split()]
        except OSError:
            pass
    return found


def is_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; only its parent (init) has yet to reap it
