"""The project root on ``sys.path``: set once, for every run and every worker.

A project's kernel packages, apps and custom stages are imported by name
from its root. Putting the root on the path in one place, before anything
is imported, makes a module resolve the same way on every run (not only
right after a pipeline.yaml edit) and in every worker process.
"""

from __future__ import annotations

import os
import sys


def add_project_root(root: str | os.PathLike[str]) -> None:
    """Put ``root`` first on ``sys.path`` (once) so the project's own modules import."""
    text = os.fspath(root)
    if text not in sys.path:
        sys.path.insert(0, text)
