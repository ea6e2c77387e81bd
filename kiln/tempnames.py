"""Names of Kiln's temp files: ``.<name>.<pid>.<serial>.tmp`` next to the file they become.

Their own module because error messages read them too (kiln.errors names the
user's file, not the temp file an OSError names) and kiln.fsutil imports
kiln.errors: one direction only.
"""

from __future__ import annotations

import itertools
import os


def _fresh_names() -> None:
    """This process's pid and a serial from a random start, for temp file names.

    A clean clone writes thousands of files: asking the kernel for the pid
    and for random bytes on each cost two system calls a file. Forked
    children call this again, so they never reuse their parent's names.
    """
    global _pid, _serial
    _pid = os.getpid()
    _serial = itertools.count(int.from_bytes(os.urandom(4), "big"))


_fresh_names()
os.register_at_fork(after_in_child=_fresh_names)


def temp_path(target: str) -> str:
    """A fresh temp file name next to ``target``, carrying this process's pid.

    The pid lets ``remove_stale_tmp`` tell a killed writer's leftover from
    a live writer's file.
    """
    head, name = os.path.split(target)
    # the serial is unique within this process (next() on a count is atomic under the
    # interpreter lock); its random start keeps a dead writer's leftovers out of the way
    return os.path.join(head, f".{name}.{_pid}.{next(_serial) & 0xFFFFFFFF:08x}.tmp")


def temp_target(path: str) -> str | None:
    """The file a :func:`temp_path` name is written for (None for any other name).

    An OSError from :func:`write_bytes_atomic` names the temp file; a message
    should name the user's file instead.
    """
    head, name = os.path.split(path)
    parts = name.split(".")
    # "", name parts..., pid, 8 hex digits, "tmp"
    if len(parts) < 5 or parts[0] or parts[-1] != "tmp" or not parts[-3].isdigit():
        return None
    token = parts[-2]
    if len(token) != 8 or any(c not in "0123456789abcdef" for c in token):
        return None
    return os.path.join(head, ".".join(parts[1:-3]))


def writer_pid(name: str) -> int | None:
    """The pid in a Kiln temp file's name, or None for any other file."""
    if name.endswith(".tmp"):
        parts = name[: -len(".tmp")].split(".")
        for candidate in parts[-2:-1] + parts[-1:]:  # .name.PID.hex.tmp first, then name.PID.tmp
            if candidate.isdigit() and len(parts) >= 2:
                return int(candidate)
        return None
    head, sep, tail = name.rpartition(".tmp")
    return int(tail) if sep and head and tail.isdigit() else None
