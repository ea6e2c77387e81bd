"""Stage chains on a Dask cluster: one Dask task per kernel instance, bytes in, bytes out.

The client (a doit action running under doit's thread runner) sends the
chain's input bytes (the kernel's sources, or the artifact it starts from),
options and machine model; the worker imports the kernel fresh from those
sources, runs every stage and returns the artifacts' bytes. The client keys
them and puts them in the cache, where the chain's own doit tasks find them
and write their artifacts locally and atomically. A chain that fails on a
worker is simply not stored: the failing stage then runs locally and gives
exactly the local diagnostic.
"""

from __future__ import annotations

import atexit
import hashlib
import multiprocessing
import os
import threading

from kiln.tasks.cached import resolved_options, stage_key
from kiln.tasks.digest import stage_module_info
from kiln.tasks.executor import DISTRIBUTED_HINT

from kiln.cache.store import sha256
from kiln.errors import KilnError
from kiln.fsutil import stat_identity

STALE_WORKERS_HINT = (
    "install the same Kiln version on the workers (or restart them after an upgrade)"
)
_client_lock = threading.Lock()
_clients: dict[tuple, object] = {}
_failed: dict[tuple, KilnError] = {}


def dask_client(executor: dict):
    """One Client per build: to ``address``, or to a LocalCluster Kiln starts and closes."""
    key = (executor.get("address"), executor.get("workers"))
    with _client_lock:
        client = _clients.get(key)
        if client is not None:
            return client
        if key in _failed:  # tried once this build (maybe by prestart): say so at once
            raise _failed[key]
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise KilnError("the dask executor needs distributed", hint=DISTRIBUTED_HINT) from None
        address = executor.get("address")
        if not address and multiprocessing.parent_process() is not None:
            # inside a worker process of doit's process runner (`doit -n N`): one
            # LocalCluster per process would oversubscribe the machine; run locally
            return None
        try:
            if address:
                client = Client(address, timeout=10)
            else:
                cluster = LocalCluster(
                    n_workers=max(int(executor.get("workers") or 1), 1),
                    threads_per_worker=1,
                    processes=True,
                    dashboard_address=None,
                )
                client = Client(cluster)
        except OSError as exc:
            _failed[key] = KilnError(
                f"cannot reach the Dask scheduler {address}: {exc}",
                hint="start one with `dask scheduler`, or drop --scheduler for a local cluster",
            )
            raise _failed[key] from None
        _clients[key] = client
        return client


def prestart(executor: dict, stage_modules: list[str]) -> None:
    """Start the client (and a LocalCluster) while doit loads tasks; errors resurface later.

    The workers import the stages (numpy with them: about a second) meanwhile
    too, so the first chains do not wait for it.
    """

    def start():
        try:
            client = dask_client(executor)
            if client is not None:
                warm_workers(client, stage_modules)
        except Exception:  # the first action that needs the client reports it
            pass

    threading.Thread(target=start, name="kiln-dask-start", daemon=True).start()


def warm_workers(client, stage_modules: list[str]) -> None:
    """One task per worker importing the stages; it runs ahead of the first chains."""
    from distributed import fire_and_forget
    from kiln.tasks.chain_worker import warm_up

    for address in client.scheduler_info().get("workers", {}):
        fire_and_forget(
            client.submit(warm_up, stage_modules, workers=[address], pure=False, priority=10)
        )


def close_clients() -> None:
    """Close every client and the LocalClusters Kiln started; pending futures are cancelled."""
    from kiln.tasks.chain_batches import close_batchers

    close_batchers()
    with _client_lock:
        for client in _clients.values():
            cluster = getattr(client, "cluster", None)
            try:
                client.close()
                if cluster is not None:
                    cluster.close()
            except Exception:
                pass
        _clients.clear()


atexit.register(close_clients)


def chain_payload(spec: dict) -> tuple[dict, list[dict]]:
    """What crosses the wire for the chain starting at ``spec``: bytes and plain data only."""
    from pathlib import Path

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
            "build": _without_graph(s.get("build")),
        }
        for s in chain
    ]
    payload: dict = {"stages": stages, "machine": spec["machine"]}
    if "trace" in spec:
        root = Path(spec["root"])
        payload["trace"] = spec["trace"]
        payload["sources"] = {
            str(Path(p).resolve().relative_to(root.resolve())): source_bytes(p)
            for p in spec.get("sources", ())
        }
    else:
        payload["input"] = Path(spec["input"]).read_bytes()
        payload["input_module"] = spec["input_module"]
        graph = chain[-1].get("build", {}).get("graph")
        payload["graph_sha256"] = (
            sha256(Path(graph).read_bytes()) if graph and Path(graph).is_file() else None
        )
    return payload, chain


def run_chain_remotely(spec: dict, session) -> dict[str, dict[str, bytes]]:
    """Run the chain from ``spec`` on Dask and store every stage's output in ``session``.

    Returns the outputs by action key, so the caller writes them without
    reading them back from the store; empty when the chain was not built there.
    """
    payload, chain = chain_payload(spec)
    client = dask_client(spec["executor"])
    if client is None:
        return {}
    from kiln.tasks.chain_batches import batcher_for

    try:
        result = batcher_for(client).run(payload)
    except Exception as exc:  # workers lost past Dask's retries, a scheduler gone: build here
        from kiln.cache.remote import warn

        warn(f"Dask could not build {spec['instance']} ({type(exc).__name__}: {exc}); built here")
        return {}
    if "refused" in result:
        raise KilnError(
            f"a Dask worker runs different Kiln code: {result['refused']}",
            hint=STALE_WORKERS_HINT,
        )
    outputs = result["outputs"]
    graph_digest = payload.get("graph_sha256")
    if "trace" in spec and outputs:
        graph_digest = sha256(outputs[0]["artifact"])
    input_digest = None
    produced = {}
    for stage_spec, found in zip(chain, outputs, strict=False):
        key = stage_key(stage_spec, input_digest=input_digest, graph_digest=graph_digest)
        session.store(key, found)
        session.produced.add(key)
        produced[key] = found
        input_digest = sha256(found["artifact"])
    return produced


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


def kiln_code_digest(modules: list[str]) -> str:
    return hashlib.sha256("|".join(stage_module_info(m)[0] for m in modules).encode()).hexdigest()


def _without_graph(build: dict | None) -> dict | None:
    """The binary's build metadata minus the local path of the graph (sent as a digest)."""
    return None if build is None else {k: v for k, v in build.items() if k != "graph"}
