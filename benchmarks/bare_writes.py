"""``kiln`` with every stage action cut down to writing bytes it is handed.

The floor of a clean clone (see scale_out.py): doit still checks, runs and
records every task, but an action only copies its artifact and side
artifacts from a finished build of the same project, with none of the
cache's work (no remote read, digest check, local store or manifest).
No clone through doit's tasks can take less.

    KILN_BARE_FROM=/path/to/built/project python benchmarks/bare_writes.py compile
"""

from __future__ import annotations

import json
import os
import sys

from kiln.tasks import actions

from kiln.cache.session import FETCHED
from kiln.cli import main
from kiln.fsutil import write_bytes_atomic

_sides: dict[str, dict[str, list[str]]] = {}  # out dir -> artifact -> its side artifacts


def copy_outputs(spec: dict, run) -> str:
    """Write the stage's artifact and its side artifacts as the built project has them."""
    directory, name = os.path.split(spec["artifact"])
    source = os.path.join(os.environ["KILN_BARE_FROM"], os.path.relpath(directory, spec["root"]))
    if source not in _sides:
        with open(os.path.join(source, ".kiln-manifest.json"), "rb") as f:
            _sides[source] = json.load(f)["sides"]
    for file in [name, *_sides[source].get(name, [])]:
        with open(os.path.join(source, file), "rb") as f:
            write_bytes_atomic(os.path.join(directory, file), f.read())
    return FETCHED


if __name__ == "__main__":
    actions.fetch_or_run = copy_outputs
    sys.argv = ["kiln", *sys.argv[1:]]
    main()
