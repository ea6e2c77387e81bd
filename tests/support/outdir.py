"""The bytes of a build's out dir, comparable between two checkouts of a project.

Source maps name the project's own path (replaced by a placeholder) and the
manifest records mtimes (kept as the listed files and their digests only):
what remains must be byte-identical between two builds of the same sources.
"""

from __future__ import annotations

import json
from pathlib import Path

from kiln.tasks.chain.manifest import MANIFEST


def build_bytes(project: Path, base: Path | None = None) -> dict[str, bytes]:
    """Every file under ``project/build``, named relative to ``base`` (default: project)."""
    base = project if base is None else base
    found = {}
    for path in sorted(p for p in (project / "build").rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.name == MANIFEST:
            doc = json.loads(data)
            files = {name: entry[2] for name, entry in doc["files"].items()}
            data = json.dumps({"files": files, "sides": doc["sides"]}, sort_keys=True).encode()
        root = str(project.resolve()).encode()
        found[str(path.relative_to(base))] = data.replace(root, b"<root>")
    return found
