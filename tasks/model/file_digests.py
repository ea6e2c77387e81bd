"""Digests of files this process wrote or hashed, valid while their (size, mtime, inode) hold.

Every instance of a kernel file hashes that file for its chain's key:
hashing it again for each is wasted work.
"""

from __future__ import annotations

import os

from kiln import fsutil

_known: dict[str, tuple[tuple[int, int, int], str]] = {}


def file_stat(path: str) -> tuple[int, int, int] | None:
    """(size, mtime_ns, inode) of ``path``, or None when it cannot be stat'ed."""
    try:
        return fsutil.stat_identity(os.stat(path))
    except OSError:
        return None


def digest_of(path: str) -> str:
    """sha256 of the file at ``path``: remembered while the file is as it was, else read."""
    stat = file_stat(path)
    known = _known.get(path)
    if known is not None and known[0] == stat:
        return known[1]
    digest = fsutil.file_digest(path)
    if stat is not None:
        _known[path] = (stat, digest)
    return digest
