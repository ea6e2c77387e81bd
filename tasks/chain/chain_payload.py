"""The kernel sources a chain sent to another machine carries, read once per file version."""

from __future__ import annotations

import os

from kiln.fsutil import stat_identity

_sources: dict[str, tuple[tuple[int, int, int], bytes]] = {}


def source_bytes(path: str) -> bytes:
    """A kernel source's bytes, read once while its (size, mtime, inode) hold.

    Every instance of a kernel file sends that file: one bytes object for
    all of them is read once and pickled by reference.
    """
    stat = stat_identity(os.stat(path))
    known = _sources.get(path)
    if known is not None and known[0] == stat:
        return known[1]
    with open(path, "rb") as f:
        data = f.read()
    _sources[path] = (stat, data)
    return data
