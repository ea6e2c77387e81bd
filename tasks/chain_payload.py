"""What crosses the wire for a stage chain sent to a Dask worker: bytes and plain data.

The kernel's source files by content (each file read once while it is
unchanged, its path relative to the project root resolved once), the
stages' names, modules, resolved options and code digests, the machine
model; or the artifact the chain starts from. Never a local path.
"""

from __future__ import annotations

import os
from pathlib import Path

from kiln.tasks.cached import resolved_options
from kiln.tasks.digest import stage_module_info

from kiln.cache.store import sha256
from kiln.fsutil import stat_identity


def chain_payload(spec: dict) -> tuple[dict, list[dict]]:
    """What crosses the wire for the chain starting at ``spec``: bytes and plain data only."""
    chain = spec["chain"][spec["stage_index"] :]
    # A tuned stage's options depend on the traced graph, known only once it is built
    # here: the chain stops before it, and its own action sends the rest.
    cut = next((i for i, s in enumerate(chain) if i > 0 and "tuning" in s), len(chain))
    chain = chain[:cut]
    stages = [
        {
            "stage": s["stage"],
            "module": s["module"],
            "options": resolved_options(s),
            "code": stage_module_info(s["module"])[0],
            "build": without_graph(s.get("build")),
        }
        for s in chain
    ]
    payload: dict = {"stages": stages, "machine": spec["machine"]}
    if "trace" in spec:
        payload["trace"] = spec["trace"]
        payload["sources"] = {
            relative_source(p, spec["root"]): source_bytes(p) for p in spec.get("sources", ())
        }
    else:
        payload["input"] = Path(spec["input"]).read_bytes()
        payload["input_module"] = spec["input_module"]
        graph = chain[-1].get("build", {}).get("graph")
        payload["graph_sha256"] = (
            sha256(Path(graph).read_bytes()) if graph and Path(graph).is_file() else None
        )
    return payload, chain


_sources: dict[str, tuple[tuple[int, int, int], bytes]] = {}


def source_bytes(path: str) -> bytes:
    """A kernel source's bytes, read once while its (size, mtime, inode) hold.

    Every instance of a kernel file sends that file: one bytes object for
    all of them lets a batch send it once (see tasks/chain_batches.py).
    """
    stat = stat_identity(os.stat(path))
    known = _sources.get(path)
    if known is not None and known[0] == stat:
        return known[1]
    with open(path, "rb") as f:
        data = f.read()
    _sources[path] = (stat, data)
    return data


_relative: dict[tuple[str, str], str] = {}


def relative_source(path: str, root: str) -> str:
    """``path`` relative to the project root, both resolved (once per path: every
    instance of a kernel file sends it, and resolving is a few system calls)."""
    known = _relative.get((path, root))
    if known is None:
        known = _relative[(path, root)] = str(
            Path(path).resolve().relative_to(Path(root).resolve())
        )
    return known


def without_graph(build: dict | None) -> dict | None:
    """The binary's build metadata minus the local path of the graph (sent as a digest)."""
    return None if build is None else {k: v for k, v in build.items() if k != "graph"}
