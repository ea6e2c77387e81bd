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


@cache
def stage_module_info(module: str) -> tuple[str, str]:
    """(source digest, ARTIFACT file name) of a stage module, read without importing it.

    The digest puts the compiler's own source into every task's cache key,
    so a change to a stage invalidates exactly the tasks of that stage.
    """
    spec = importlib.util.find_spec(module)
    fallback = module.rsplit(".", 1)[-1]
    if spec is None or not spec.origin:
        return "missing", fallback
    with open(spec.origin, "rb") as f:
        source = f.read()
    match = _ARTIFACT_LINE.search(source)
    artifact = match.group(1).decode() if match else fallback
    return hashlib.sha256(source).hexdigest()[:16], artifact


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
