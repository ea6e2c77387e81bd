"""Digests of files this process wrote or hashed, valid while their (size, mtime, inode) hold.

The next stage's key needs its input's digest, and every instance of a
kernel file hashes that file for its trace key: hashing either again is
wasted work. A file written from the cache is remembered with the digest
it was written with.
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


def remember(path: str, stat: tuple[int, int, int], digest: str) -> None:
    """``path`` holds bytes whose sha256 is ``digest`` while its identity is ``stat``."""
    _known[path] = (stat, digest)


def remembered(path: str) -> tuple[tuple[int, int, int], str] | None:
    """(identity, digest) last remembered for ``path``; the caller checks the identity."""
    return _known.get(path)
