"""Config fingerprints for up-to-date checks, computed once per distinct value.

Each stage task's config is a set of parts (stage options, machine model,
Kiln version, the stage module's source, the kernel's trace request, the
dumps asked for), each reduced to a short digest and recorded in a config
stamp file that the task depends on.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import sys
from functools import cache


def digest_json(value) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


_ARTIFACT_LINE = re.compile(rb"""^ARTIFACT\s*=\s*["']([^"']+)["']""", re.MULTILINE)


_FROM_IMPORT = re.compile(
    rb"^[ \t]*from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]+)", re.MULTILINE
)
_IMPORT = re.compile(rb"^[ \t]*import[ \t]+([\w.]+)", re.MULTILINE)
_NAME = re.compile(rb"[A-Za-z_]\w*")
# Only Kiln's own package counts as "the compiler": a change in numpy is not ours to track.
# (Kiln's stages, tasks and runners live under it as kiln.stages, kiln.tasks, kiln.runners.)
COMPILER_PACKAGE = "kiln"


@cache
def _subpackage_dir(name: str) -> str | None:
    """The directory of a first-level Kiln package (``kiln.stages``), found without running it.

    find_spec of ``kiln.X`` imports only ``kiln``'s own light ``__init__``;
    asking per sub-package honours a package-dir mapping (editable installs
    map ``kiln.stages`` to the repository's ``stages/``).
    """
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return list(spec.submodule_search_locations)[0]
    return None


@cache
def _module_file(name: str) -> str | None:
    """The source file of a dotted module inside Kiln, found without importing it."""
    parts = name.split(".")
    if parts[0] != COMPILER_PACKAGE:
        return None if _is_library(parts[0]) else _project_module_file(parts)
    if len(parts) == 1:
        base = _subpackage_dir(COMPILER_PACKAGE)
        return os.path.join(base, "__init__.py") if base else None
    sub = _subpackage_dir(".".join(parts[:2]))
    if sub is None:  # kiln.<module>: a plain module of the top package
        base = _subpackage_dir(COMPILER_PACKAGE)
        if base is None:
            return None
        path = os.path.join(base, *parts[1:])
    else:
        path = os.path.join(sub, *parts[2:])
    for candidate in (path + ".py", os.path.join(path, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


@cache
def _is_library(top: str) -> bool:
    """True for the standard library and installed distributions: not code a digest tracks."""
    if top in sys.stdlib_module_names:
        return True
    base = _subpackage_dir(top) or ""
    return "site-packages" in base or "dist-packages" in base or not base


def _project_module_file(parts: list[str]) -> str | None:
    """A module of a project's own package (a custom stage's helpers), found by path."""
    base = _subpackage_dir(parts[0])
    if base is None:
        return None
    path = os.path.join(base, *parts[1:])
    for candidate in (path + ".py", os.path.join(path, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def _resolve_relative(base: str, module: str, is_package: bool) -> str:
    """``from ..x import y`` inside ``module`` -> the absolute dotted name of ``..x``."""
    dots = len(base) - len(base.lstrip("."))
    if not dots:
        return base
    package = module.split(".") if is_package else module.split(".")[:-1]
    anchor = package[: len(package) - (dots - 1)] if dots > 1 else package
    rest = base[dots:]
    return ".".join(anchor + ([rest] if rest else []))


def _imports(source: bytes, module: str = "", is_package: bool = False) -> set[str]:
    """Dotted names a module imports (``from x import y``: x and x.y; relative ones resolved)."""
    found = {m.group(1).decode() for m in _IMPORT.finditer(source)}
    for m in _FROM_IMPORT.finditer(source):
        base = _resolve_relative(m.group(1).decode(), module, is_package)
        if not base:
            continue
        found.add(base)
        found.update(f"{base}.{n.decode()}" for n in _NAME.findall(m.group(2)))
    return found


@cache
def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@cache
def _file_imports(path: str, module: str) -> frozenset[str]:
    is_package = os.path.basename(path) == "__init__.py"
    return frozenset(_imports(_read(path), module, is_package))


@cache
def stage_module_info(module: str) -> tuple[str, str]:
    """(source digest, ARTIFACT file name) of a stage module, read without importing it.

    The digest covers the stage module and every module of Kiln's own
    package it imports, transitively (its IR, the op table, ...): a change
    to the compiler invalidates exactly the tasks of the stages it reaches.
    Files are named in the digest by their dotted module name, never by
    their path, so the digest depends on the code's bytes only: an editable
    install, a wheel and a copy of the checkout give the same value.
    """
    fallback = module.rsplit(".", 1)[-1]
    origin = _module_file(module)
    if origin is None:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.origin or not os.path.isfile(spec.origin):
            return "missing", fallback
        origin = spec.origin
    source = _read(origin)
    match = _ARTIFACT_LINE.search(source)
    artifact = match.group(1).decode() if match else fallback
    files = {module: origin}
    todo = list(_file_imports(origin, module))
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = _module_file(name)
        if path is not None and path not in files.values():
            files[name] = path
            todo.extend(_file_imports(path, name))
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + _read(files[name]) + b"\0")
    return h.hexdigest()[:16], artifact


def combine(parts: dict[str, str]) -> str:
    return "|".join(f"{k}={parts[k]}" for k in sorted(parts))


class ConfigStamps:
    """Config values as files: one small JSON file per distinct config, named by its digest.

    A task lists the stamp of its config among its file_deps, so a changed
    option, machine model, Kiln version or stage source gives the task a
    different dependency and doit reruns it; `kiln status` reads the old
    and new stamps to say which part changed. This is the job of doit's
    ``config_changed``, done with one ``stat`` per task instead of a Python
    call per task, which is what keeps a no-op build of thousands of tasks
    close to bare doit.
    """

    def __init__(self, directory):
        self.directory = str(directory)
        self._made: dict[str, str] = {}
        self._present: set[str] | None = None  # the stamps on disk, listed once

    def path(self, label: str, parts: dict[str, str]) -> str:
        key = f"{label}|{combine(parts)}"
        found = self._made.get(key)
        if found is not None:
            return found
        base = f"{label}-{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"
        name = f"{self.directory}/{base}"
        if self._present is None:
            try:
                self._present = set(os.listdir(self.directory))
            except OSError:
                self._present = set()
        if base not in self._present:
            os.makedirs(self.directory, exist_ok=True)
            tmp = f"{name}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(parts, f, sort_keys=True, indent=1)
            os.replace(tmp, name)
        self._made[key] = name
        return name


def read_stamp(path: str) -> dict | None:
    """The parts recorded in a config stamp (None if it is gone)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
