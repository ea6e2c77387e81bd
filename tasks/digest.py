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
from functools import cache


def digest_json(value) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


_ARTIFACT_LINE = re.compile(rb"""^ARTIFACT\s*=\s*["']([^"']+)["']""", re.MULTILINE)


_FROM_IMPORT = re.compile(
    rb"^[ \t]*from[ \t]+([\w.]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n]+)", re.MULTILINE
)
_IMPORT = re.compile(rb"^[ \t]*import[ \t]+([\w.]+)", re.MULTILINE)
_NAME = re.compile(rb"[A-Za-z_]\w*")
# Only these packages count as "the compiler": a change in numpy is not ours to track.
COMPILER_PACKAGES = ("kiln", "stages", "runners")


@cache
def _package_dir(top: str) -> str | None:
    spec = importlib.util.find_spec(top)  # imports only the top package's __init__
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


@cache
def _module_file(name: str) -> str | None:
    """The source file of a dotted module inside a compiler package, found without importing."""
    top, _, rest = name.partition(".")
    if top not in COMPILER_PACKAGES:
        return None
    base = _package_dir(top)
    if base is None:
        return None
    path = os.path.join(base, *rest.split(".")) if rest else base
    for candidate in (path + ".py", os.path.join(path, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def _imports(source: bytes) -> set[str]:
    """Dotted names a module imports (``from x import y`` gives x and x.y)."""
    found = {m.group(1).decode() for m in _IMPORT.finditer(source)}
    for m in _FROM_IMPORT.finditer(source):
        base = m.group(1).decode()
        found.add(base)
        found.update(f"{base}.{n.decode()}" for n in _NAME.findall(m.group(2)))
    return found


@cache
def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@cache
def _file_imports(path: str) -> frozenset[str]:
    return frozenset(_imports(_read(path)))


@cache
def stage_module_info(module: str) -> tuple[str, str]:
    """(source digest, ARTIFACT file name) of a stage module, read without importing it.

    The digest covers the stage module and every module of Kiln's own
    packages it imports, transitively (its IR, the op table, ...): a change
    to the compiler invalidates exactly the tasks of the stages it reaches.
    """
    spec = importlib.util.find_spec(module)
    fallback = module.rsplit(".", 1)[-1]
    if spec is None or not spec.origin:
        return "missing", fallback
    source = _read(spec.origin)
    match = _ARTIFACT_LINE.search(source)
    artifact = match.group(1).decode() if match else fallback
    files = {spec.origin}
    todo = list(_imports(source))
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = _module_file(name)
        if path is not None and path not in files:
            files.add(path)
            todo.extend(_file_imports(path))
    h = hashlib.sha256()
    root = os.path.dirname(os.path.dirname(spec.origin))
    for path in sorted(files):
        h.update(os.path.relpath(path, root).encode() + b"\0" + _read(path))
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

    def path(self, label: str, parts: dict[str, str]) -> str:
        key = f"{label}|{combine(parts)}"
        found = self._made.get(key)
        if found is not None:
            return found
        name = f"{self.directory}/{label}-{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"
        if not os.path.exists(name):
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
