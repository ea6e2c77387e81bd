"""Which executor runs stage actions: local (doit's own runners) or a Dask cluster.

pipeline.yaml ``executor: {kind, address}``; the CLI's ``--executor`` and
``--scheduler`` flags override it through ``KILN_EXECUTOR`` and
``KILN_SCHEDULER``. Asking for dask without ``kiln[distributed]`` is one
clear error naming the extra.
"""

from __future__ import annotations

import importlib.util
import os

from kiln.errors import KilnError

DISTRIBUTED_HINT = "pip install 'kiln[distributed]'"


def resolve_executor(settings: dict | None, root) -> dict | None:
    """The executor spec that stage actions carry (None: run in doit's own workers)."""
    settings = settings or {}
    kind = os.environ.get("KILN_EXECUTOR") or settings.get("kind", "local")
    if kind == "local":
        return None
    if kind != "dask":
        raise KilnError(f"unknown executor {kind!r}", expected="local or dask", found=kind)
    if importlib.util.find_spec("distributed") is None:
        raise KilnError(
            "the dask executor needs dask.distributed, which is not installed",
            hint=DISTRIBUTED_HINT,
        )
    address = os.environ.get("KILN_SCHEDULER") or settings.get("address")
    return {"kind": "dask", "address": address, "workers": int(os.environ.get("KILN_JOBS", "2"))}
