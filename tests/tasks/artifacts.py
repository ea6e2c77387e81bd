"""What a build wrote: every artifact's bytes, to compare builds file by file."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import run_kiln


def snapshot(project: Path) -> dict[str, bytes]:
    """Every file under the project's build/, by relative path (temp files excluded)."""
    base = project / "build"
    return {
        str(p.relative_to(base)): p.read_bytes()
        for p in sorted(base.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


def clean_build(project: Path) -> dict[str, bytes]:
    """The artifacts of one plain `kiln compile` of ``project``, which is left unbuilt.

    Built in the project's own directory: some artifacts name their source files.
    """
    run_kiln(project, "compile", check=True)
    built = snapshot(project)
    wipe(project)
    return built


def wipe(project: Path) -> None:
    """Remove everything a build made: artifacts and Kiln's state."""
    for made in ("build", ".kiln"):
        shutil.rmtree(project / made, ignore_errors=True)
