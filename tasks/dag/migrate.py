"""Once per project: forget doit's records of the per-stage compile tasks of old.

Compile tasks were ``compile:<kernel>.<shapes>.<stage>``; they are one
task per instance now. Their records would sit in doit's state file for
ever (and `kiln forget`, `doit dumpdb` would list them): they are dropped
the first time a build of the new layout opens the file.
"""

from __future__ import annotations

import os
import sqlite3

from kiln.fsutil import write_bytes_atomic

MARKER = "layout-instance-tasks"
OLD_STAGES = ("trace", "visa", "lir", "schedule", "edf")


def forget_stage_tasks(dep_file: str, state_dir: str) -> None:
    marker = os.path.join(state_dir, MARKER)
    if os.path.exists(marker):
        return
    if os.path.exists(dep_file):
        try:
            conn = sqlite3.connect(dep_file)
            try:
                ids = [row[0] for row in conn.execute("select task_id from doit")]
                old = [(i,) for i in ids if old_task_name(i) is not None]
                conn.executemany("delete from doit where task_id = ?", old)
                conn.commit()
            finally:
                conn.close()
        except sqlite3.Error:  # a damaged file is moved aside by ensure_sound_db
            return
    write_bytes_atomic(marker, b"1\n")


def old_task_name(name: str) -> str | None:
    """``compile:gemm.small.lir`` -> ``compile:gemm.small``; None for any other name."""
    kind, _, rest = name.partition(":")
    if kind != "compile" or rest.count(".") < 2:
        return None
    instance, _, stage = rest.rpartition(".")
    return f"compile:{instance}" if stage in OLD_STAGES else None
