"""The project root on ``sys.path``: set once, for every run and every worker.

A project's kernel packages, apps and custom stages are imported by name
from its root. Putting the root on the path in one place, before anything
is imported, makes a module resolve the same way on every run (not only
right after a pipeline.yaml edit) and in every worker process.

The project's own modules are never run from bytecode older than their
source. Python takes a ``.pyc`` as fresh when it records the source's size
and its mtime in whole seconds: a second save of the same length within
one second (a sweep script, a formatter, ``kiln watch`` between two quick
saves) was traced from the first save's bytecode, while the chain key
hashed the new source, and the cache kept that binary under the new key.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import (
    BYTECODE_SUFFIXES,
    EXTENSION_SUFFIXES,
    SOURCE_SUFFIXES,
    ExtensionFileLoader,
    FileFinder,
    SourceFileLoader,
    SourcelessFileLoader,
)
from importlib.util import cache_from_source

_ROOTS: list[str] = []


def add_project_root(root: str | os.PathLike[str]) -> None:
    """Put ``root`` first on ``sys.path`` (once) so the project's own modules import."""
    text = os.fspath(root)
    if text not in sys.path:
        sys.path.insert(0, text)
    absolute = os.path.abspath(text)
    if absolute not in _ROOTS:
        _ROOTS.append(absolute)
        if _project_path_hook not in sys.path_hooks:
            sys.path_hooks.insert(0, _project_path_hook)
        # finders made before the hook (the default ones) would go on reading bytecode
        for entry in list(sys.path_importer_cache):
            if holds_project_modules(entry):
                del sys.path_importer_cache[entry]


class FreshSourceLoader(SourceFileLoader):
    """A project module's loader: its ``.pyc`` is used only when written after the source."""

    def get_code(self, fullname):
        source = self.get_filename(fullname)
        try:
            cached = cache_from_source(source)
            if os.stat(cached).st_mtime_ns <= os.stat(source).st_mtime_ns:
                os.unlink(cached)  # may hold an earlier save's code: compiled again below
        except (OSError, NotImplementedError, ValueError):
            pass
        return super().get_code(fullname)


_LOADERS = (
    (ExtensionFileLoader, EXTENSION_SUFFIXES),
    (FreshSourceLoader, SOURCE_SUFFIXES),
    (SourcelessFileLoader, BYTECODE_SUFFIXES),
)


def _project_path_hook(entry: str) -> FileFinder:
    if not holds_project_modules(entry):
        raise ImportError("not a directory of the project's own modules")
    return FileFinder(entry, *_LOADERS)


def holds_project_modules(entry: str) -> bool:
    """Whether the directory ``entry`` holds the project's own modules: a project root,
    or a directory below one that no deeper ``sys.path`` entry claims (a virtual
    environment inside the project keeps its packages' bytecode)."""
    if not isinstance(entry, str) or not entry:
        return False
    path = os.path.abspath(entry)
    claims = [os.path.abspath(p) for p in sys.path if isinstance(p, str) and p]
    owner = max(
        (p for p in claims if path == p or path.startswith(p.rstrip(os.sep) + os.sep)),
        key=len,
        default=None,
    )
    return owner in _ROOTS
