"""Atomic artifact writes with early cutoff: unchanged bytes leave the file alone."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from stat import S_ISREG

from kiln.tempnames import temp_path, writer_pid


def write_bytes_atomic(path: str | os.PathLike, data: bytes, *, durable: bool = False) -> bool:
    """Write ``data`` to ``path`` via a temp file in the same dir and ``os.replace``.

    Returns False, touching nothing (not even the mtime), when the file
    already holds exactly ``data``; so a stage whose output did not change
    does not wake the stages after it. Readers never see a partial file.
    A symlink at ``path`` is replaced by the file, whatever it points at.
    ``durable`` also fsyncs the data before the rename.
    """
    return _write_atomic(os.fspath(path), data, durable=durable) is not None


def write_with_identity(path: str | os.PathLike, data: bytes) -> tuple[int, int, int] | None:
    """``write_bytes_atomic``, returning the written file's (size, mtime, inode).

    None when the file already held ``data`` (left alone). The identity is
    the file's as written, read from its descriptor: the manifest records it
    without a second stat.
    """
    return _write_atomic(os.fspath(path), data, identity=True)


def write_absent_atomic(path: str, data: bytes) -> None:
    """``write_bytes_atomic`` for a path the caller has just found absent (a new blob):
    the same temp file and rename, without looking at the target again first."""
    _write_atomic(path, data, absent=True)


def _write_atomic(
    target: str,
    data: bytes,
    *,
    durable: bool = False,
    identity: bool = False,
    absent: bool = False,
) -> bool | tuple[int, int, int] | None:
    """None when ``target`` held ``data``; else True, or its identity when asked."""
    # plain strings and os calls: this runs for every artifact, blob and entry of a build
    if not absent:
        try:
            # lstat: a symlink is never "unchanged", and the rename below replaces the link
            # itself, never what it points at: Kiln does not write through a symlink
            found = os.lstat(target)
            if S_ISREG(found.st_mode) and found.st_size == len(data) and holds(target, data):
                return None
        except (FileNotFoundError, NotADirectoryError):
            pass
    head = os.path.dirname(target)
    tmp = temp_path(target)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    written = True
    # the open is inside the clean-up's reach: a Ctrl-C the moment it returns
    # would otherwise leave the temp file behind
    try:
        try:
            fd = os.open(tmp, flags, 0o666)  # umask applies
        except FileNotFoundError:  # a new directory: made only then, not probed every write
            os.makedirs(head or ".", exist_ok=True)
            fd = os.open(tmp, flags, 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
            if identity:
                written = stat_identity(os.fstat(fd))
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return written


def holds(path: str, data: bytes) -> bool:
    """Whether the file at ``path`` holds exactly ``data`` (False when unreadable)."""
    try:
        with open(path, "rb") as f:
            return f.read() == data
    except OSError:
        return False


def read_artifact(path: str | os.PathLike, what: str, decode, *, errors=(Exception,)):
    """Read and decode one artifact; any failure is an ArtifactError naming the file.

    ``what`` names the artifact in the message ("LIR artifact"); ``decode``
    turns its bytes into the IR; exceptions of the types in ``errors`` mean
    the file is corrupt (decoders raise many kinds on damaged input).
    """
    from kiln.errors import ArtifactError, Location

    where = Location(str(path))
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ArtifactError(f"cannot read {what}: {exc.strerror or exc}", where) from None
    try:
        return decode(raw)
    except errors as exc:
        raise ArtifactError(
            f"corrupt {what} ({type(exc).__name__}: {exc})", where, hint="delete it and rebuild"
        ) from None


def remove_stale_tmp(directory: str | os.PathLike) -> None:
    """Delete temp files that a killed writer left in ``directory``.

    Kiln's temp names carry the writer's pid (``.name.PID.hex.tmp``,
    ``name.PID.tmp``, ``name.tmpPID``); one whose process is gone is
    garbage. A live writer's file is left alone.
    """
    try:
        entries = os.scandir(directory)
    except OSError:
        return
    with entries:
        for entry in entries:
            pid = writer_pid(entry.name)
            if pid is not None and pid != os.getpid() and not _alive(pid):
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and only waits to be reaped (Linux; False elsewhere).

    A killed build's -n worker is reparented to PID 1, which in many containers
    never reaps it: its pid stays taken, and its temp files stayed for good.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # "pid (comm) state ...": comm may hold spaces and parentheses, the last ")" ends it
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] == b"Z"


def file_digest(path: str | os.PathLike) -> str:
    """sha256 (hex) of a file's bytes."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def stat_identity(st: os.stat_result) -> tuple[int, int, int]:
    """(size, mtime_ns, inode): while it holds, a file's bytes are taken as the ones last seen."""
    return (st.st_size, st.st_mtime_ns, st.st_ino)
