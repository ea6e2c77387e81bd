"""Fetch-or-run for a stage action, keyed by content (never by doit's ``uptodate``).

The action key is computed from files and metadata only, so a cache hit
imports neither numpy nor the stages: it reads, verifies and writes bytes.
A stage that writes dumps always runs (dumps are files the user asked to
see made, not artifacts to share).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
from pathlib import Path
from typing import NamedTuple

from kiln.tasks.affinity import whole_chains_here
from kiln.tasks.cached_outputs import (
    SIDE,
    portable,
    read_with_identity,
    record_many,
    write_outputs,
)
from kiln.tasks.digest import stage_module_info
from kiln.tasks.file_digests import digest_of, file_stat
from kiln.tasks.prefetch import Prefetcher, chain_id, keys_after, walkable, worth_prefetching

from kiln.cache.action import action_key
from kiln.cache.config import CacheConfig
from kiln.cache.session import COMPILED, FETCHED, session_for
from kiln.cache.store import sha256
from kiln.errors import KilnError, Location
from kiln.logconfig import get_logger

log = get_logger("cache")


class Settled(NamedTuple):
    """A later stage's artifact that its chain's walk wrote, and what its key depended on."""

    spec: dict  # the very spec the walk keyed: the later task gets the same object
    how: str
    stat: tuple[int, int, int] | None  # the artifact's, right after the walk wrote it
    made_from: tuple  # stats of the files its key was made from: its input (and graph)


# Artifacts written from the cache ahead of their own task (the rest of a chain whose
# first stage was fetched): path -> Settled. That task then only checks the stats.
_settled: dict[str, Settled] = {}


def is_settled(spec: dict) -> bool:
    """Whether a walk wrote this stage's artifact ahead of its task (checked when it runs)."""
    settled = _settled.get(spec["artifact"])
    return settled is not None and settled.spec is spec


def _key_inputs_stat(spec: dict) -> tuple:
    """Stats of the files a later stage's key hashes: its input, and the graph for the binary."""
    graph = spec.get("build", {}).get("graph")
    return (file_stat(spec["input"]), file_stat(graph) if graph else ())


def stage_key(spec: dict, input_digest: str | None = None, graph_digest: str | None = None) -> str:
    """The action key of one stage of one instance (paths never enter it, only bytes).

    ``input_digest``/``graph_digest`` stand for files not written yet (the
    outputs of a chain run on a Dask worker, keyed before they land).
    """
    root = spec["root"]
    if "trace" in spec:
        inputs = {_rel(p, root): digest_of(p) for p in spec.get("sources", ())}
        extra = {"trace": spec["trace"]}
    else:
        inputs = {"input": input_digest or digest_of(spec["input"])}
        extra = {}
    if "build" in spec:
        build = dict(spec["build"])
        graph = build.pop("graph")
        if graph_digest is None and os.path.isfile(graph):
            graph_digest = digest_of(graph)
        build["graph_sha256"] = graph_digest
        extra["build"] = build
    extra["stage"] = spec["stage"]
    return action_key(
        inputs=inputs,
        options=resolved_options(spec),
        machine=machine_digest(spec["machine"]),
        code=stage_module_info(spec["module"])[0],
        extra=extra,
    )


_machine_digests: dict[int, tuple[object, str]] = {}


def machine_digest(machine) -> str:
    """sha256 of the machine model's canonical JSON, once per model object.

    Every stage of every instance shares one model object: serializing it
    for each key was most of the cost of checking a fetched artifact.
    """
    known = _machine_digests.get(id(machine))
    if known is not None and known[0] is machine:
        return known[1]
    text = json.dumps(machine, sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256(text.encode()).hexdigest()
    _machine_digests[id(machine)] = (machine, digest)  # kept alive: its id stays its own
    return digest


def resolved_options(spec: dict) -> dict:
    """The options the stage will run with: pipeline.yaml's, plus a matching tuning record."""
    if "tuning" not in spec:
        return spec["options"]
    from kiln.tune.apply import tuned_options

    return tuned_options(spec["tuning"], spec["stage"], spec["options"])


SOURCE_TRIES = 3


def sources_identity(spec: dict) -> tuple:
    """(size, mtime, inode) of each kernel source a trace reads: () for later stages."""
    return tuple(file_stat(p) for p in spec.get("sources", ()))


def fetch_or_run(spec: dict, run) -> str:
    """Write the stage's artifact from the store, or ``run(spec)`` and store what it wrote."""
    if "trace" not in spec:
        return _fetch_or_run(spec, run, ())
    # A kernel file saved while its trace runs: the graph may be of either version, yet
    # its key and doit's record of the sources (taken once the action ends) are of the
    # new one, so the old graph would pass as built (and be stored for the new source).
    # Trace again until the sources hold still: each try costs milliseconds.
    for _ in range(SOURCE_TRIES):
        before = sources_identity(spec)
        how = _fetch_or_run(spec, run, before)
        if sources_identity(spec) == before:
            return how
    # still changing: a graph of no saved version must not pass as built
    raise KilnError(
        f"the kernel sources of {spec['instance']} changed during each of {SOURCE_TRIES} traces",
        Location(str(spec["sources"][0])) if spec.get("sources") else None,
        hint="save the file, then run the build again",
    )


def _fetch_or_run(spec: dict, run, keyed_sources: tuple) -> str:
    """``fetch_or_run``; ``keyed_sources``: the trace's sources as keyed (nothing stored
    when they changed meanwhile)."""
    settings = spec.get("cache")
    if not settings or not settings.get("enabled") or spec["dumps"]:
        run(spec)
        return COMPILED
    settled = _settled.pop(spec["artifact"], None)
    if (
        settled is not None
        and settled.spec is spec
        and settled.stat == file_stat(spec["artifact"])
        and settled.made_from == _key_inputs_stat(spec)
    ):
        # written from the cache by this chain's first task, from the input it still has:
        # its key then is the one the walk computed, and the artifact is unchanged since
        return settled.how
    session = session_for(CacheConfig(**settings))
    key = stage_key(spec)
    if session.remote is not None:
        session.claim(chain_id(spec))  # a chain fetched ahead is waited for, not fetched twice
    ahead: dict[str, dict[str, bytes]] = {}  # the chain's later actions, fetched with this one
    if walks_chain(spec):  # one remote trip for the whole chain (stored once written)
        then = keys_after(spec["chain"], spec["stage_index"], None, stage_key)
        trip = session.lookup_run(key, then, keep=False)
        outputs, how = (trip[0][1], trip[0][2]) if trip else (None, COMPILED)
        ahead = {later_key: found for later_key, found, _ in trip[1:]}
    else:
        outputs, how = session.lookup(key, keep=False)
    if outputs is not None and "artifact" not in outputs:
        # some other action's entry (a report's): rebuilt over it; what came with it is
        # stored as fetched, for the later tasks to find
        for held_key, found in [(key, outputs), *ahead.items()]:
            session.keep_written(held_key, found)
        outputs, how, ahead = None, COMPILED, {}
    if (
        how == FETCHED
        and "prefetch" in spec
        and session.prefetcher is None
        and multiprocessing.parent_process() is None
        and worth_prefetching(session)
    ):
        # a clean clone from a slow remote, it seems: fetch the other chains ahead
        chains, threads = spec["prefetch"].chains, session.config.prefetch_threads
        session.prefetch(
            lambda taken: Prefetcher(session, chains, stage_key, threads=threads, taken=taken)
        )
    artifact = Path(spec["artifact"])
    produced: dict[str, dict[str, bytes]] = {}
    if outputs is None and spec.get("executor"):
        from kiln.tasks.remote_exec import run_chain_remotely

        produced = run_chain_remotely(spec, session)
        if key in produced:
            outputs, how = produced[key], COMPILED
    if outputs is not None:
        write_outputs(artifact, outputs, spec["root"], session, key)
        log.info("%s %s: %s from cache %s", spec["instance"], spec["stage"], how, artifact)
        written = [(spec, artifact, outputs)]
        settled = write_rest_of_chain(spec, session, outputs, produced, written, ahead)
        record_many(spec["root"], written)  # one manifest update for the whole walk
        _settled.update(settled)  # only once the manifest lists them
        return how
    side = run(spec) or []
    if sources_identity(spec) != keyed_sources:
        return COMPILED  # traced from other bytes than the key's: never stored under it
    try:
        found, files = {}, {}
        for name, path in [("artifact", artifact)] + [
            (SIDE + n, artifact.parent / n) for n in side
        ]:
            data, identity = read_with_identity(path)
            found[name] = data if name == "artifact" else portable(data, spec["root"])
            if found[name] == data:  # the store's bytes are the file's: share the file
                files[name] = (str(path), identity)
        session.store(key, found, files)
    except OSError as exc:  # a full or read-only cache disk costs speed, not the build
        session.store_failed(exc)
    return COMPILED


def write_rest_of_chain(
    spec: dict,
    session,
    outputs: dict[str, bytes],
    produced: dict | None,
    written: list[tuple[dict, Path, dict[str, bytes]]],
    ahead: dict[str, dict[str, bytes]] | None = None,
) -> dict[str, Settled]:
    """Write the chain's later artifacts from the cache now, while their keys follow.

    Each later stage's key needs only the digest of the output before it, so
    a clean clone (or a chain just built on Dask) walks the whole chain in
    one task; the later tasks find their artifact settled and only check it.
    A stage that dumps or is tuned stops the walk: its own task decides.
    ``produced``: outputs a remote executor just built, by key (already stored).
    ``ahead``: the later actions fetched with the first, by key (held back
    from the store, see ``CacheSession.lookup``). Appends what it wrote to
    ``written`` (for the caller's one manifest update) and returns the
    settled artifacts by path.
    """
    chain = spec.get("chain")
    settled: dict[str, Settled] = {}
    ahead = dict(ahead or {})  # fetched with an earlier stage, in one trip
    if not walks_chain(spec):
        return settled
    input_digest = sha256(outputs["artifact"])
    graph_digest = input_digest if "trace" in spec else None
    first_dir = Path(spec["artifact"]).parent
    first = spec["stage_index"] + 1  # the first stage written ahead
    rest = chain[first:]
    try:
        for position, later in enumerate(rest):
            if not walkable(later):
                break
            key = stage_key(later, input_digest=input_digest, graph_digest=graph_digest)
            if produced and key in produced:
                found, how = produced[key], COMPILED
            elif key in ahead:
                found, how = ahead.pop(key), FETCHED
            else:
                then = keys_after(chain, first + position, graph_digest, stage_key)
                run = session.lookup_run(key, then, keep=False)
                if not run:
                    break
                _, found, how = run[0]
                ahead = {later_key: outputs for later_key, outputs, _ in run[1:]}
            if "artifact" not in found:
                session.keep_written(key, found)  # stored as fetched; its task builds over it
                break  # some other action's entry: the stage's own task rebuilds over it
            artifact = Path(later["artifact"])
            # the chain's first write swept this out dir a moment ago
            write_outputs(
                artifact, found, later["root"], session, key, sweep=artifact.parent != first_dir
            )
            written.append((later, artifact, found))
            log.info(
                "%s %s: %s from cache %s (written ahead)",
                later["instance"],
                later["stage"],
                how,
                artifact,
            )
            stat = file_stat(later["artifact"])
            if stat is None:
                break
            made_from = _key_inputs_stat(later)
            if None in made_from:
                break
            settled[later["artifact"]] = Settled(later, how, stat, made_from)
            input_digest = sha256(found["artifact"])
    except OSError as exc:  # the walk only saves time: its stages' own tasks do the work
        log.warning("could not write ahead from the cache after %s: %s", spec["artifact"], exc)
    finally:
        for later_key, found in ahead.items():  # fetched, not written: stored as they are
            session.keep_written(later_key, found)
    return settled


def walks_chain(spec: dict) -> bool:
    """Whether this process writes the rest of ``spec``'s chain ahead (write_rest_of_chain).

    Not in a worker that may not run the later tasks: another process would
    find nothing settled and write everything again.
    """
    return bool(spec.get("chain")) and (
        multiprocessing.parent_process() is None or whole_chains_here()
    )


def _rel(path: str, root: str) -> str:
    try:
        return os.path.relpath(path, root)
    except ValueError:
        return path
