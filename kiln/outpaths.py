"""Files and directories a command line asks Kiln to write (`--dump-schedule F`, `--junit F`).

A problem with one is the user's option and the path they typed, said
before any work where it can be seen up front (a directory where a file
is wanted), and otherwise when the write fails; never the temp file of
Kiln's atomic write.
"""

from __future__ import annotations

import argparse
import os
import re
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from kiln.errors import EnvironmentProblem, KilnError


def output_path(text: str) -> Path:
    """argparse ``type=`` of an output FILE or DIR: an empty path is a usage error."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path: give a file or directory name")
    return Path(text)


def write_output(path: Path, write: Callable[[Path], object]) -> None:
    """``write(p)`` makes the file the user named ``path``, delivered as they would expect.

    A device or FIFO (``/dev/null``, ``/dev/stdout``) is written into, never
    replaced; a symlink is written through (the file it points at is
    replaced, the link stays). Either way ``write`` makes the file in a
    temporary directory first: Kiln's writers rename a finished file into
    place, which would replace the node or the link itself.
    """
    if not (_special(path) or os.path.islink(path)):
        write(path)
        return
    import tempfile

    from kiln.fsutil import write_bytes_atomic

    with tempfile.TemporaryDirectory(prefix="kiln-out-") as tmp:
        staged = Path(tmp) / (path.name or "output")
        write(staged)
        data = staged.read_bytes()
    fd = _inherited_fd(path)
    if fd is not None:  # /dev/stdout redirected to a log: write at its end, never truncate it
        sys.stdout.flush()
        sys.stderr.flush()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    elif _special(path):
        with open(path, "wb") as f:
            f.write(data)
    else:
        write_bytes_atomic(os.path.realpath(path), data)


_STD_NAMES = {"/dev/stdout": 1, "/dev/stderr": 2}
_FD_LINK = re.compile(r"/(?:proc/self|dev)/fd/(\d+)")


def _inherited_fd(path: Path) -> int | None:
    """The descriptor ``path`` names (/dev/stdout, /dev/fd/N, /proc/self/fd/N, or a link
    to one): opening it anew would start at offset 0 and truncate what it points at."""
    name = os.path.abspath(path)
    for _ in range(8):  # a chain of links, as /dev/stdout -> /proc/self/fd/1
        if name in _STD_NAMES:
            return _STD_NAMES[name]
        found = _FD_LINK.fullmatch(name)
        if found:
            return int(found.group(1))
        if not os.path.islink(name):
            return None
        name = os.path.join(os.path.dirname(name), os.readlink(name))
    return None


def check_output(option: str, path: Path, *, directory: bool = False) -> None:
    """Before any work: ``path`` is not a directory where a file is wanted (or the reverse),
    and no file stands where a directory above it must be."""
    if str(path).strip() == "":
        raise KilnError(f"{option} needs a path", expected=f"{option} NAME", found="''")
    if _special(path) and not directory:  # /dev/null, /dev/stdout, a FIFO: written into
        if not os.access(path, os.W_OK):
            raise _cannot_write(option, path, PermissionError(13, "Permission denied"), False)
        return
    if path.is_dir() and not directory:
        raise _is_a_directory(option, path)
    if path.exists() and not path.is_dir() and directory:
        raise _is_a_file(option, path)
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise _is_a_file(option, parent, of=path)
            try:
                _probe(path if directory and path.is_dir() else parent)
            except OSError as exc:
                raise _cannot_write(option, path, exc, directory) from None
            break


def _special(path: Path) -> bool:
    """A device, FIFO or socket (after following links): neither a file nor a directory."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _probe(directory: Path) -> None:
    """Create and remove a temp file in ``directory``: can the output be written there?"""
    import tempfile

    fd, name = tempfile.mkstemp(dir=directory, prefix=".kiln-probe.")
    os.close(fd)
    os.unlink(name)


@contextmanager
def writing(option: str, path: Path, *, directory: bool = False) -> Iterator[None]:
    """An OSError about ``path`` (or a file in it, or a directory above it) names the option."""
    try:
        yield
    except OSError as exc:
        if not _concerns(exc, path):
            raise
        if isinstance(exc, IsADirectoryError) and not directory:
            raise _is_a_directory(option, path) from None
        if isinstance(exc, NotADirectoryError):
            raise _is_a_file(option, _file_in_the_way(path) or path, of=path) from None
        raise _cannot_write(option, path, exc, directory) from None


def _cannot_write(option: str, path: Path, exc: OSError, directory: bool) -> KilnError:
    reason = exc.strerror or type(exc).__name__
    return EnvironmentProblem(
        f"{option}: cannot write {path}: {reason}",
        expected=f"a {'directory' if directory else 'file'} Kiln can create and write",
        found=str(path),
        hint="give a path in a directory you can write to",
    )


def _concerns(exc: OSError, path: Path) -> bool:
    from kiln.tempnames import temp_target

    mine = os.path.abspath(path)
    for name in (exc.filename, exc.filename2):
        if not isinstance(name, (str, os.PathLike)):
            continue
        text = os.fspath(name)
        named = os.path.abspath(temp_target(text) or text)
        if named == mine or named.startswith(mine + os.sep) or mine.startswith(named + os.sep):
            return True
    return False


def _file_in_the_way(path: Path) -> Path | None:
    for parent in (path, *path.parents):
        if parent.exists():
            return parent if not parent.is_dir() else None
    return None


def _is_a_directory(option: str, path: Path) -> KilnError:
    return KilnError(
        f"{option}: {path} is a directory",
        expected="a file name",
        found=f"the directory {path}",
        hint="give a file name (a file inside that directory will do)",
    )


def _is_a_file(option: str, path: Path, *, of: Path | None = None) -> KilnError:
    where = f"{path} is a file" if of is None or of == path else f"{path} (above {of}) is a file"
    return KilnError(
        f"{option}: {where}, not a directory",
        expected="a directory" if of is None or of == path else f"a directory above {of}",
        found=f"the file {path}",
        hint="give a path whose directories are not files",
    )
