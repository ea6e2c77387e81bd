"""Where a benchmark builds its generated project: on tmpfs when the machine has one.

A cold build writes and deletes thousands of small files. On a disk file
system each benchmark run deletes the previous run's tree just before
building again, and some (ext4) then spend seconds of kernel time looking
for free inodes, more under two writers than one: the figures would
measure the disk's bookkeeping, not Kiln. ``--dir`` picks another place
(``--dir .`` measures the current file system on purpose).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

TMPFS = Path("/dev/shm")


MIN_FREE = 2 << 30  # the largest generated projects, their caches and clones fit in this


def default_dir() -> str | None:
    """tmpfs when present, writable and roomy, else the system's temporary directory (None).

    A container's /dev/shm is often 64 MiB: too small, so it is not chosen.
    """
    try:
        fs = os.statvfs(TMPFS)
    except OSError:
        return None
    if fs.f_bavail * fs.f_frsize >= MIN_FREE and os.access(TMPFS, os.W_OK | os.X_OK):
        return str(TMPFS)
    return None


def add_dir_option(parser) -> None:
    """``--dir``: where the benchmark builds, tmpfs by default (see ``default_dir``)."""
    parser.add_argument(
        "--dir",
        default=default_dir(),
        help="where to build the generated project (default: /dev/shm when present)",
    )


def scratch(prefix: str, directory: str | None) -> tempfile.TemporaryDirectory:
    """A temporary directory under ``directory``; the caller prints where it is."""
    return tempfile.TemporaryDirectory(prefix=prefix, dir=directory)
