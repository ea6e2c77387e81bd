"""The project lock: one build at a time per project, whatever the entry point.

`kiln`, `python -m kiln`, `doit` (dodo.py) and their `-n` workers all go
through :func:`project_lock`. The lock is an ``flock`` on ``.kiln/lock``,
which the kernel drops when the holding process dies; the file also
records the holder (pid, host, command) so a second build can say whom it
waits for. Three things keep a dead build from blocking the next one:

- the lock's descriptor is closed in every forked child (``-n`` workers),
  so only the process that took it holds it;
- workers exit when their parent dies (see kiln/tasks/workers.py);
- a lock whose recorded holder is a dead process on this host is broken
  (the file is replaced), in case something else still holds the old one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from kiln.errors import KilnError
from kiln.interrupts import mark_interrupted

LOCK_FILE = "lock"
POLL_SECONDS = 0.2
NO_WAIT_ENV = "KILN_NO_WAIT"

# lock path -> [descriptor, nesting depth] for the locks this process holds
_held: dict[str, list[int]] = {}


class LockBusy(KilnError):
    """Another build holds the project lock and the caller asked not to wait."""


@dataclass(frozen=True)
class Holder:
    """Who holds a project lock, as recorded in the lock file."""

    pid: int
    host: str
    command: str

    def describe(self) -> str:
        where = "" if self.host == socket.gethostname() else f" on {self.host}"
        return f"pid {self.pid}{where} ({self.command})"

    def is_dead(self) -> bool:
        """True only when the holder is known to be gone (same host, no such process)."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def no_wait_requested() -> bool:
    from kiln.cache.config import env_flag

    return env_flag(NO_WAIT_ENV, empty=False)  # a value neither on nor off is an error


def lock_path(state_dir: Path) -> Path:
    return Path(state_dir) / LOCK_FILE


def read_holder(path: Path) -> Holder | None:
    try:
        record = json.loads(Path(path).read_text())
        return Holder(int(record["pid"]), str(record["host"]), str(record["command"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no file, or its holder has not written it yet


@contextlib.contextmanager
def project_lock(state_dir: Path, *, wait: bool | None = None, command: str | None = None):
    """Hold the project lock for the ``with`` block (re-entrant within one process)."""
    acquire(state_dir, wait=wait, command=command)
    try:
        yield
    finally:
        release(state_dir)


def acquire(state_dir: Path, *, wait: bool | None = None, command: str | None = None) -> None:
    """Take the lock of the project whose state lives in ``state_dir``.

    A busy lock is waited for (saying who holds it, once), or with
    ``wait=False`` (default: unless KILN_NO_WAIT is set) raises LockBusy.
    """
    path = lock_path(state_dir)
    key = str(path.resolve())
    if key in _held:
        _held[key][1] += 1
        return
    if wait is None:
        wait = not no_wait_requested()
    path.parent.mkdir(parents=True, exist_ok=True)
    announced = False
    seen_dead: Holder | None = None
    while True:
        fd = _try_lock(path)
        if fd is not None:
            _record_holder(fd, command)
            _held[key] = [fd, 1]
            _end_on_sigterm()
            return
        holder = read_holder(path)
        if holder is not None and holder.is_dead():
            # seen dead twice, a poll apart: not a new holder that has yet to write its record
            if holder == seen_dead:
                _break_stale(path, holder)
                continue
            seen_dead = holder
            time.sleep(POLL_SECONDS)
            continue
        who = holder.describe() if holder else "another build"
        if not wait:
            raise LockBusy(
                f"the project is locked by {who}",
                found=str(path),
                hint="wait for that build to finish, or run again without --no-wait "
                f"(unset {NO_WAIT_ENV}) to wait for it",
            )
        if not announced:
            print(
                f"kiln: waiting for {who} to finish with {path.parent.parent} ...",
                file=sys.stderr,
                flush=True,
            )
            announced = True
        time.sleep(POLL_SECONDS)


def release(state_dir: Path) -> None:
    """Drop one level of the lock; the last one closes the descriptor (and unlocks)."""
    path = lock_path(state_dir)
    key = str(path.resolve())
    entry = _held.get(key)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] == 0:
        del _held[key]
        with contextlib.suppress(OSError):
            os.ftruncate(entry[0], 0)  # a clean release leaves no holder behind
        os.close(entry[0])
        if not _held:
            _default_sigterm()


def holds_lock(state_dir: Path) -> bool:
    return str(lock_path(state_dir).resolve()) in _held


def _try_lock(path: Path) -> int | None:
    """A locked descriptor of the current lock file, or None when another process holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        # a stale lock may have been replaced between our open and our flock
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


def command_line() -> str:
    """This process's command as a user typed it (`kiln compile -n 2`, `doit compile`)."""
    program = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("python")
    name = program.name
    if name == "__main__.py":  # python -m doit / python -m kiln
        name = program.parent.name
    elif name in ("cli.py", "-c", "-m"):
        name = "kiln"
    return " ".join([name, *sys.argv[1:]])[:200]


def _record_holder(fd: int, command: str | None) -> None:
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": command or command_line(),
    }
    data = (json.dumps(record, sort_keys=True) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _break_stale(path: Path, holder: Holder) -> None:
    """Replace a lock file whose recorded holder is dead (under a short second lock)."""
    guard = os.open(path.with_name(LOCK_FILE + ".break"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)
        # only if nobody replaced it meanwhile: same holder recorded, still dead
        if read_holder(path) == holder and holder.is_dead():
            print(
                f"kiln: breaking the lock of {holder.describe()}, which is no longer running",
                file=sys.stderr,
                flush=True,
            )
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    finally:
        os.close(guard)


def _end_on_sigterm() -> None:
    """While this process holds a lock, SIGTERM ends it as Ctrl-C does.

    CI cancels, ``timeout`` and ``kill`` send SIGTERM, whose default ends the
    process where it stands: doit never saved what the build had done (the
    next build redid all of it), temp files stayed, and a LocalCluster's
    semaphores were reported leaked. As a KeyboardInterrupt it stops cleanly.
    """
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set a handler
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # leave anyone's own handler
        _sigterm_owner[0] = os.getpid()
        signal.signal(signal.SIGTERM, _sigterm)


_sigterm_owner = [0]  # the process that set _sigterm (a forked child inherits the handler)


def _sigterm(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends it at once
    if os.getpid() != _sigterm_owner[0]:
        # a child forked a moment ago, before _close_in_child reset the handler (a build
        # stopping its workers as one is born): it ends as SIGTERM's default would, not
        # with a KeyboardInterrupt printed from inside the fork's own hooks
        os.kill(os.getpid(), signal.SIGTERM)
        return
    mark_interrupted()
    raise KeyboardInterrupt


def _default_sigterm() -> None:
    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is _sigterm
    ):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _close_in_child() -> None:
    """A forked child never holds its parent's lock (the lock must die with the parent)."""
    for fd, _depth in _held.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()
    _default_sigterm()  # nor does it stop as the build does: SIGTERM ends it


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)
