"""Writing a stage's cached outputs into the out dir, and listing them in its manifest.

An artifact and its side artifacts (source maps, written next to it) come
from the store as bytes; each file is written atomically. Side artifacts
are stored with the project's root as a placeholder, so clones in other
directories share them.
"""

from __future__ import annotations

import os
from pathlib import Path

from kiln.tasks.file_digests import file_stat, remember, remembered

from kiln import fsutil
from kiln.cache.store import SIDE_PREFIX, FileSource, sha256

SIDE = SIDE_PREFIX  # output names of side artifacts (source maps), next to the artifact
ROOT_PLACEHOLDER = b"<kiln-project-root>"


def read_with_identity(path: str | os.PathLike) -> tuple[bytes, tuple[int, int, int]]:
    """A file's bytes and its (size, mtime, inode) as read: the file they came from."""
    with open(path, "rb") as f:
        identity = fsutil.stat_identity(os.fstat(f.fileno()))
        return f.read(), identity


def portable(data: bytes, root: str) -> bytes:
    """A side artifact (a source map) with the project's root path as a placeholder.

    Side artifacts may name the kernel's file; the placeholder lets a clone
    in another directory (or a Dask worker's scratch copy) share them.
    """
    return data.replace(str(root).encode(), ROOT_PLACEHOLDER)


def write_outputs(
    artifact: Path,
    outputs: dict[str, bytes],
    root: str,
    session,
    key: str,
    *,
    sweep: bool = True,
) -> None:
    """Write a stage's artifact and its side artifacts from cached outputs, atomically.

    A stored action's files are hard links to its blobs in the local store
    where they can be (see LocalStore.place), else copies. A fetched one
    held back from the store (``CacheSession.lookup(keep=False)``) is
    written first and stored after, its blobs links to the files just
    written: fewer writes than storing it first. ``sweep`` False: the
    directory was just cleared of a killed build's temp files.
    """
    if sweep:
        fsutil.remove_stale_tmp(artifact.parent)  # left by a build killed mid-write
    store = session.local
    held = session.held_back(key, outputs)  # the digests of a fetched action held back
    sources: dict[str, FileSource] = {}
    try:
        for name, data in outputs.items():
            _write_output(artifact, name, data, root, store, held, sources)
    except Exception:
        if held is not None:  # stored as fetched (copied), never left out of the store
            session.keep_written(key, outputs)
        raise
    if held is not None:
        session.keep_written(key, outputs, sources)


def _write_output(
    artifact: Path,
    name: str,
    data: bytes,
    root: str,
    store,
    held: dict[str, str] | None,
    sources: dict[str, FileSource],
) -> None:
    """Write one output of ``write_outputs``; a file fit to be its blob goes in ``sources``."""
    if name == "artifact":
        target = str(artifact)
        local = data
    elif name.startswith(SIDE):
        target = str(artifact.parent / name[len(SIDE) :])
        local = data.replace(ROOT_PLACEHOLDER, str(root).encode())
    else:
        return
    digest = held[name] if held is not None else sha256(data)
    stat = None
    if local is not data and local != data:
        # the source map names this clone's root: the store keeps the portable bytes
        fsutil.write_bytes_atomic(target, local)
    elif held is None:
        store.place(digest, target, data)
    else:
        stat = fsutil.write_with_identity(target, data)
        if stat is not None:
            sources[name] = (target, stat)
    if name == "artifact":
        stat = stat or file_stat(target)  # None from a write: it held those bytes already
        if stat is not None:
            remember(target, stat, digest)


def record_many(root: str, fetched: list[tuple[dict, Path, dict[str, bytes]]]) -> None:
    """List fetched files in the instance's manifest, as a stage run does: one write.

    Without it a fetched artifact escapes the damage check and ``kiln clean``.
    """
    from kiln.tasks import manifest

    manifest.forget_index(os.path.join(root, ".kiln"))
    entries = []
    known = {}
    for _, artifact, outputs in fetched:
        path = str(artifact)
        entries.append(
            (path, [str(artifact.parent / n[len(SIDE) :]) for n in outputs if n.startswith(SIDE)])
        )
        memo = remembered(path)
        if memo is not None:
            known[path] = memo  # (stat, sha256) from the write just done
    manifest.record_artifacts(str(fetched[0][1].parent), entries, known=known)
