"""Damaged state files are moved aside with one warning and rebuilt, never used.

Kiln's state under ``.kiln/`` (doit's dependency database, the discovery
and pipeline caches) only saves work: when one is truncated, overwritten
or foreign, the right answer is to keep it for a post-mortem, say so once,
and build as if it were not there.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from kiln.errors import printable, relative_path

SQLITE_MAGIC = b"SQLite format 3\x00"


def quarantine(path: Path, reason: str, consequence: str = "it will be rebuilt") -> Path | None:
    """Rename a damaged ``path`` to ``path.corrupt-<time>`` and print one warning."""
    aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        os.replace(path, aside)
    except OSError:
        try:
            os.unlink(path)
            aside = None
        except OSError:
            return None
    kept = f"; kept as {relative_path(aside)}" if aside is not None else ""
    reason = " ".join(reason.split())  # one line, however sqlite words it
    reason = reason if len(reason) <= 160 else reason[:157] + "..."
    print(
        f"kiln: warning: {relative_path(path)} is damaged ({printable(reason)}){kept}; "
        f"{consequence}",
        file=sys.stderr,
        flush=True,
    )
    return aside


def sqlite_problem(path: Path) -> str | None:
    """Why doit's database at ``path`` cannot be used, or None when it is sound.

    A cheap header check first (magic, page size, a truncated tail), then
    sqlite's own quick_check and a decode of every stored value.
    """
    try:
        with open(path, "rb") as f:
            header = f.read(100)
        size = os.stat(path).st_size
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc.strerror or str(exc)
    if size == 0:
        return None  # sqlite treats an empty file as a new database
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        return "not an SQLite database"
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    if page_size < 512 or size % page_size or (pages and size < pages * page_size):
        return f"truncated: {size} bytes, header says {pages} pages of {page_size}"
    import sqlite3  # only when the database changed since it was last seen sound

    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            check = conn.execute("PRAGMA quick_check").fetchone()
            if not check or check[0] != "ok":
                return f"sqlite quick_check: {check[0] if check else 'no answer'}"
            tables = {r[0] for r in conn.execute("select name from sqlite_master")}
            if tables and "doit" not in tables:
                return "not doit's database (no 'doit' table)"
            if "doit" in tables:
                for task_id, data in conn.execute("select task_id, task_data from doit"):
                    if not isinstance(json.loads(data), dict):
                        return f"bad record for task {task_id!r}"
        finally:
            conn.close()
    except (sqlite3.Error, ValueError, TypeError, UnicodeDecodeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


_checked: list[Path] = []  # the databases this process checked, stamped again at the end


def ensure_sound_db(path: Path) -> None:
    """Move a damaged doit database aside.

    The full check runs only when the file changed since Kiln last saw it
    sound: ``stamp_sound_dbs`` records the database doit leaves behind at
    the end of a run, so a no-op build costs one ``stat`` and one small read.
    """
    _checked.append(path)
    try:
        st = os.stat(path)
    except OSError:
        return
    if _read_stamp(path) == _stamp(st).encode():
        return
    problem = sqlite_problem(path)
    if problem is not None:
        quarantine(path, problem, "every task will run again")
        return
    _write_stamp(path)


def stamp_sound_dbs() -> None:
    """After doit closed its database: what it wrote is sound, so the next run skips the check."""
    while _checked:
        _write_stamp(_checked.pop())


def _stamp_file(path: Path) -> Path:
    return path.with_name(path.name + ".checked")


def _read_stamp(path: Path) -> bytes | None:
    """The stamp's bytes; None when there is none. Any bytes only mean "check again"."""
    stamp = _stamp_file(path)
    try:
        return stamp.read_bytes()
    except FileNotFoundError:
        return None
    except IsADirectoryError:  # in the way of every later stamp: move it aside once
        quarantine(stamp, "a directory, not a file", "the database will be checked again")
    except OSError:
        pass
    return None


def _stamp(st: os.stat_result) -> str:
    return f"{st.st_size} {st.st_mtime_ns} {st.st_ino}"


def _write_stamp(path: Path) -> None:
    try:
        _stamp_file(path).write_text(_stamp(os.stat(path)))
    except OSError:
        pass
