"""Fetch-or-run for a stage action, keyed by content (never by doit's ``uptodate``).

The action key is computed from files and metadata only, so a cache hit
imports neither numpy nor the stages: it reads, verifies and writes bytes.
A stage that writes dumps always runs (dumps are files the user asked to
see made, not artifacts to share).
"""

from __future__ import annotations

import os
from pathlib import Path

from kiln.tasks.digest import stage_module_info

from kiln import fsutil
from kiln.cache.action import action_key, file_digest
from kiln.cache.config import CacheConfig
from kiln.cache.session import COMPILED, session_for
from kiln.logconfig import get_logger

log = get_logger("cache")
SIDE = "side/"  # output names of side artifacts (source maps), next to the artifact
ROOT_PLACEHOLDER = b"<kiln-project-root>"


def stage_key(spec: dict, input_digest: str | None = None, graph_digest: str | None = None) -> str:
    """The action key of one stage of one instance (paths never enter it, only bytes).

    ``input_digest``/``graph_digest`` stand for files not written yet (the
    outputs of a chain run on a Dask worker, keyed before they land).
    """
    root = spec["root"]
    if "trace" in spec:
        inputs = {_rel(p, root): file_digest(p) for p in spec.get("sources", ())}
        extra = {"trace": spec["trace"]}
    else:
        inputs = {"input": input_digest or file_digest(spec["input"])}
        extra = {}
    if "build" in spec:
        build = dict(spec["build"])
        graph = build.pop("graph")
        if graph_digest is None and os.path.isfile(graph):
            graph_digest = file_digest(graph)
        build["graph_sha256"] = graph_digest
        extra["build"] = build
    extra["stage"] = spec["stage"]
    return action_key(
        inputs=inputs,
        options=resolved_options(spec),
        machine=spec["machine"],
        code=stage_module_info(spec["module"])[0],
        extra=extra,
    )


def resolved_options(spec: dict) -> dict:
    """The options the stage will run with: pipeline.yaml's, plus a matching tuning record."""
    if "tuning" not in spec:
        return spec["options"]
    from kiln.tune.apply import tuned_options

    return tuned_options(spec["tuning"], spec["stage"], spec["options"])


def fetch_or_run(spec: dict, run) -> str:
    """Write the stage's artifact from the store, or ``run(spec)`` and store what it wrote."""
    settings = spec.get("cache")
    if not settings or not settings.get("enabled") or spec["dumps"]:
        run(spec)
        return COMPILED
    session = session_for(CacheConfig(**settings))
    key = stage_key(spec)
    outputs, how = session.lookup(key)
    artifact = Path(spec["artifact"])
    if outputs is None and spec.get("executor"):
        from kiln.tasks.remote_exec import run_chain_remotely

        run_chain_remotely(spec, session)
        outputs, how = session.lookup(key)
    if outputs is not None:
        write_outputs(artifact, outputs, spec["root"])
        record_outputs(spec, artifact, outputs)
        log.info("%s %s: %s from cache %s", spec["instance"], spec["stage"], how, artifact)
        return how
    side = run(spec) or []
    try:
        found = {"artifact": artifact.read_bytes()}
        for name in side:
            found[SIDE + name] = portable((artifact.parent / name).read_bytes(), spec["root"])
        session.store(key, found)
    except OSError as exc:  # a full or read-only cache disk costs speed, not the build
        log.warning("could not store %s in the cache: %s", artifact, exc)
    return COMPILED


def portable(data: bytes, root: str) -> bytes:
    """A side artifact (a source map) with the project's root path as a placeholder.

    Side artifacts may name the kernel's file; the placeholder lets a clone
    in another directory (or a Dask worker's scratch copy) share them.
    """
    return data.replace(str(root).encode(), ROOT_PLACEHOLDER)


def write_outputs(artifact: Path, outputs: dict[str, bytes], root: str) -> None:
    """Write a stage's artifact and its side artifacts from cached outputs, atomically."""
    fsutil.remove_stale_tmp(artifact.parent)  # left by a build killed mid-write
    fsutil.write_bytes_atomic(artifact, outputs["artifact"])
    for name, data in outputs.items():
        if name.startswith(SIDE):
            local = data.replace(ROOT_PLACEHOLDER, str(root).encode())
            fsutil.write_bytes_atomic(artifact.parent / name[len(SIDE) :], local)


def record_outputs(spec: dict, artifact: Path, outputs: dict[str, bytes]) -> None:
    """List fetched files in the instance's manifest, as a stage run does.

    Without it a fetched artifact escapes the damage check and ``kiln clean``.
    """
    from kiln.tasks import manifest

    manifest.forget_index(os.path.join(spec["root"], ".kiln"))
    sides = [str(artifact.parent / n[len(SIDE) :]) for n in outputs if n.startswith(SIDE)]
    manifest.record(str(artifact.parent), [str(artifact)], sides=sides)


def _rel(path: str, root: str) -> str:
    try:
        return os.path.relpath(path, root)
    except ValueError:
        return path
