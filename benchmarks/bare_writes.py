"""``kiln`` with every instance's action cut down to writing bytes it is handed.

The floor of a clean clone (see scale_out.py): doit still checks, runs and
records every task (one per kernel instance), but an action only copies the
instance's files from a finished build of the same project, with none of
the cache's work (no remote read, digest check, local store or manifest).
No clone through doit's tasks can take less.

    KILN_BARE_FROM=/path/to/built/project python benchmarks/bare_writes.py compile
"""

from __future__ import annotations

import os
import sys

from kiln.cache.session import FETCHED
from kiln.cli import main
from kiln.fsutil import write_bytes_atomic
from kiln.tasks.dag import chain_action


def copy_files(spec, out):
    """Write every file of the instance as the built project has it."""
    source = os.path.join(os.environ["KILN_BARE_FROM"], os.path.relpath(spec.out_dir, spec.root))
    for base, _dirs, names in os.walk(source):
        for name in names:
            path = os.path.join(base, name)
            rel = os.path.relpath(path, source)
            with open(path, "rb") as f:
                write_bytes_atomic(os.path.join(spec.out_dir, rel), f.read())
    return FETCHED, None, os.getpid()


if __name__ == "__main__":
    # a benchmark's stand-in for the action's work: this script's process only
    chain_action._build_once = copy_files
    sys.argv = ["kiln", *sys.argv[1:]]
    main()
