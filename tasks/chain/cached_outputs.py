"""Side artifacts and dumps in the cache: the project's root as a placeholder.

A source map may name the kernel's file by its absolute path; stored with
the root replaced, a clone in another directory (or a Dask worker's
scratch copy) shares it, and writing it puts this clone's root back.
"""

from __future__ import annotations

ROOT_PLACEHOLDER = b"<kiln-project-root>"


def portable(data: bytes, root: str) -> bytes:
    """``data`` with the project's root path as a placeholder."""
    return data.replace(str(root).encode(), ROOT_PLACEHOLDER)
