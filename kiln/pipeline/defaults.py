"""Kiln's built-in defaults (defaults.yaml) and how a project's pipeline.yaml merges over them.

Like cargo's defaults: a pipeline.yaml that says only ``project``,
``packages`` and ``kernels`` builds with the built-in stage list, machine
models and targets. What the project writes wins: a scalar replaces the
default, an entry of ``machines:``/``targets:``/``cache:``/``tuning:`` under
a built-in name replaces that entry and a new name adds one, and a
``stages:`` list replaces the whole list.

The merged data keeps one source map per file (``LayeredSourceMap``), so a
message about a value the project wrote points at pipeline.yaml, and one
about a built-in value points at defaults.yaml and says it is Kiln's bug.
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any

from kiln.errors import Location, PipelineError
from kiln.pipeline.yamlpos import SourceMap, child_path, load_yaml, parent_path

DEFAULTS_PATH = Path(__file__).with_name("defaults.yaml")
BUILTIN = "built-in default"
# Top-level mappings merged entry by entry; every other key is replaced whole.
BY_ENTRY = ("cache", "tuning", "machines", "targets")
BUG_NOTE = (
    "this value is one of Kiln's built-in defaults, not something the project wrote: "
    "a bug in Kiln (please report it); writing the key in pipeline.yaml overrides it"
)

_parsed: dict[tuple[str, str], tuple[dict[str, Any], SourceMap]] = {}


def _read() -> tuple[Path, bytes]:
    path = DEFAULTS_PATH  # read at call time: tests point it at another file
    try:
        return path, path.read_bytes()
    except OSError as exc:
        raise PipelineError(
            f"Kiln's built-in defaults cannot be read: {exc.strerror or exc}",
            Location(str(path)),
            expected="the defaults.yaml installed with Kiln",
            found=str(path),
            hint="reinstall Kiln",
        ) from None


def defaults_digest() -> str:
    """sha256 of the defaults file's bytes: part of the parsed-pipeline cache key."""
    return hashlib.sha256(_read()[1]).hexdigest()


def load_defaults() -> tuple[dict[str, Any], SourceMap]:
    """The built-in defaults as data (a fresh copy: the loader edits it) and their source map."""
    path, raw = _read()
    key = (str(path), hashlib.sha256(raw).hexdigest())
    if key not in _parsed:
        data, smap = load_yaml(path, raw.decode("utf-8"))
        if not isinstance(data, dict):
            raise PipelineError(
                "Kiln's built-in defaults are not a mapping",
                Location(smap.file),
                expected="a mapping of pipeline keys",
                found=type(data).__name__,
                hint="reinstall Kiln",
            )
        _parsed[key] = (data, smap)
    data, smap = _parsed[key]
    return copy.deepcopy(data), smap


def merge(project: dict[str, Any], defaults: dict[str, Any]) -> tuple[dict[str, Any], frozenset]:
    """``project`` over ``defaults``, and the key paths whose value came from the defaults.

    A value of the wrong kind (``machines: [a]``) is kept as written, so the
    schema check reports it at the project's line. Without a ``machine:``, a
    project that adds exactly one machine (a name that is not built in)
    compiles for that one; replacing a built-in machine changes no default.
    """
    merged = dict(project)
    builtin: set[str] = set()
    for key, default in defaults.items():
        if key not in project:
            merged[key] = default
            builtin.add(key)
        elif key in BY_ENTRY and isinstance(project[key], dict) and isinstance(default, dict):
            merged[key] = {**default, **project[key]}  # built-in order, then new names
            builtin.update(child_path(key, name) for name in default if name not in project[key])
    own = project.get("machines")
    if "machine" not in project and isinstance(own, dict):
        added = [name for name in own if name not in (defaults.get("machines") or {})]
        if len(added) == 1:  # the one machine a project adds is the one it means
            merged["machine"] = added[0]
            builtin.discard("machine")
    return merged, frozenset(builtin)


def is_builtin(builtin: frozenset, key_path: str) -> bool:
    """Whether ``key_path`` lies inside an entry that came from the built-in defaults."""
    path: str | None = key_path
    while path:
        if path in builtin:
            return True
        path = parent_path(path)
    return False


class LayeredSourceMap:
    """Where each key path of a merged pipeline is written: pipeline.yaml or defaults.yaml.

    Offers what the loader uses of a SourceMap (``file``, ``values``,
    ``position``, ``locate``, ``error``, ``written``); ``file`` is the project's.
    """

    def __init__(self, project: SourceMap, defaults: SourceMap, builtin: frozenset) -> None:
        self.project = project
        self.defaults = defaults
        self.builtin = builtin
        self.file = project.file
        self.values = project.values

    def is_builtin(self, key_path: str) -> bool:
        return is_builtin(self.builtin, key_path)

    def written(self, key_path: str) -> bool:
        """Whether ``key_path`` itself is written in the file it comes from."""
        return self._map(key_path).written(key_path)

    def _map(self, key_path: str) -> SourceMap:
        return self.defaults if self.is_builtin(key_path) else self.project

    def position(self, key_path: str, *, value: bool = False) -> tuple[int, int] | None:
        return self._map(key_path).position(key_path, value=value)

    def locate(self, key_path: str, *, value: bool = False) -> Location:
        return self._map(key_path).locate(key_path, value=value)

    def error(
        self, message: str, key_path: str, *, value: bool = False, **detail: Any
    ) -> PipelineError:
        """A PipelineError at ``key_path``; at a built-in value it says that is Kiln's bug."""
        err = self._map(key_path).error(message, key_path, value=value, **detail)
        if self.is_builtin(key_path):
            err.notes.append(BUG_NOTE)
        return err


def layered_source(path: Path, builtin: frozenset) -> LayeredSourceMap:
    """The source maps of a pipeline file and of the defaults, read again (after a cache hit)."""
    _, project = load_yaml(path)
    _, defaults = load_defaults()
    return LayeredSourceMap(project, defaults, builtin)
