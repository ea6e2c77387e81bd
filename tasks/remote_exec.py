"""Stage chains on a Dask cluster: one Dask task per kernel instance, bytes in, bytes out.

The client (a build's doit run: the chain is sent when its first task is
ready, see tasks/chains_ahead.py, or by that task's action) sends the
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
import dataclasses
import hashlib
import logging
import multiprocessing
import socket
import threading
from concurrent.futures import Future
from typing import NamedTuple

from kiln.tasks.cached import sources_identity, stage_key
from kiln.tasks.chain_payload import chain_payload
from kiln.tasks.digest import stage_module_info
from kiln.tasks.executor import DISTRIBUTED_HINT, scheduler_host_port
from kiln.tasks.local_cluster import local_client

from kiln.cache.store import sha256
from kiln.errors import KilnError

STALE_WORKERS_HINT = (
    "install the same Kiln version on the workers (or restart them after an upgrade)"
)
CONNECT_TIMEOUT = 10  # seconds to reach a scheduler before the build gives it up
_client_lock = threading.Lock()
_clients: dict[tuple, object] = {}
_failed: dict[tuple, KilnError] = {}  # could not connect: the first action reports it
_reported: set[tuple] = set()  # ... and the others build locally without a word
_lost: set[tuple] = set()  # given up mid-build (one warning): the rest builds locally
_warned: set[int] = set()  # ids of batch errors already warned about
_prestarted: set[tuple] = set()  # executors whose client prestart has started
_startable: set[tuple] = set()  # executors a lookup thread may start or connect (allow_start)


def _key(executor: dict) -> tuple:
    return (executor.get("address"), executor.get("workers"))


def dask_client(executor: dict):
    """The build's Client; None: build here (doit's process runner, or the cluster is gone).

    A scheduler that cannot be reached is one error, raised to the first
    caller only (a fresh copy: each caller adds its own notes); every later
    chain is built locally without a word.
    """
    key = _key(executor)
    try:
        return _connect(executor)
    except KilnError as err:
        with _client_lock:
            if key in _reported:
                return None
            _reported.add(key)
        raise dataclasses.replace(err, notes=[]) from None


def connected_client(executor: dict, *, start: bool = True):
    """The build's Client when it is (or can be) connected; None, never an error.

    For chains sent ahead of their tasks: a connection error is the first
    action's to report (``dask_client``), with the action's own notes.
    ``start=False``: only a client connected or being connected (by ``prestart``)
    this build, or one ``allow_start`` let start; None rather than start one (a
    closed build's cluster, again).
    """
    key = _key(executor)
    if not start and key not in _clients and key not in _prestarted and key not in _startable:
        return None
    try:
        return _connect(executor)
    except KilnError:
        return None


def _connect(executor: dict):
    """One Client per build: to ``address``, or to a LocalCluster Kiln starts and closes."""
    key = _key(executor)
    with _client_lock:
        if key in _lost:
            return None
        client = _clients.get(key)
        if client is not None:
            return client
        if key in _failed:  # tried once this build (maybe by prestart)
            raise _failed[key]
        address = executor.get("address")
        if not address and multiprocessing.parent_process() is not None:
            # inside a worker process of doit's process runner (`doit -n N`): one
            # LocalCluster per process would oversubscribe the machine; run locally
            return None
        try:
            from distributed import Client
        except ImportError:
            raise KilnError("the dask executor needs distributed", hint=DISTRIBUTED_HINT) from None
        quiet_dask_logs()
        try:
            client = _scheduler_client(Client, address) if address else local_client(executor)
        except Exception as exc:  # refused, timed out, a bad address: one message
            _failed[key] = _connect_error(executor, exc)
            raise _failed[key] from None
        _clients[key] = client
        return client


def _scheduler_client(Client, address: str):
    """A Client of the scheduler at ``address``, or an error within CONNECT_TIMEOUT.

    Dask bounds the connection but not the scheduler's reply to it: a server
    that accepts and never answers (a wrong service on the port, a stopped
    process) held the build forever. The attempt left behind is a daemon thread.
    """
    from kiln.cache.remote import DeadlineCaller

    _probe(address)
    outcome = DeadlineCaller().call(
        lambda: Client(address, timeout=CONNECT_TIMEOUT), (), CONNECT_TIMEOUT
    )
    if outcome is None:
        raise TimeoutError(f"no answer from the scheduler within {CONNECT_TIMEOUT} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _probe(address: str) -> None:
    """Raise at once when nothing listens at ``address``, within CONNECT_TIMEOUT otherwise.

    Dask retries a refused connection until its timeout, so a mistyped port
    cost every build the whole CONNECT_TIMEOUT; and a host that does not
    answer must cost it once, not once here and again in Dask.
    """
    host_port = scheduler_host_port(address)
    if host_port is not None:
        socket.create_connection(host_port, timeout=CONNECT_TIMEOUT).close()


def _connect_error(executor: dict, exc: Exception) -> KilnError:
    address, source = executor.get("address"), executor.get("source") or "KILN_SCHEDULER"
    reason = printable_reason(exc)
    if not address:
        return KilnError(
            f"cannot start a Dask LocalCluster: {reason}",
            hint="build without --executor dask (or executor.kind: dask) to build here",
        )
    drop = {"--scheduler": "drop --scheduler", "KILN_SCHEDULER": "unset KILN_SCHEDULER"}.get(
        source, "remove executor.address from pipeline.yaml"
    )
    return KilnError(
        f"cannot reach the Dask scheduler {address} (from {source}): {reason}",
        hint=f"start one with `dask scheduler` and check {source}, or {drop} for a LocalCluster",
    )


def printable_reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def quiet_dask_logs() -> None:
    """Dask's own log lines (reconnect errors, shutdown warnings) stay out of the build's
    output: Kiln says what matters once, as a warning."""
    # distributed's config gives some of its loggers levels of their own
    names = [n for n in logging.root.manager.loggerDict if n.split(".")[0] in _NOISY]
    for name in (*_NOISY, *names):
        logging.getLogger(name).setLevel(logging.CRITICAL)


_NOISY = ("distributed", "tornado")


def give_up(executor: dict, client, reason: str, no_workers: bool = False) -> None:
    """The cluster cannot build: one warning, and every later chain builds locally."""
    key = _key(executor)
    with _client_lock:
        if key in _lost:
            return
        _lost.add(key)
        if _clients.get(key) is client:
            del _clients[key]
    from kiln.tasks.chain_batches import ClusterLost, batcher_for

    from kiln.logconfig import warn

    where = executor.get("address") or "LocalCluster"
    if no_workers:
        warn(f"the Dask scheduler {where} has had {reason}; building the rest locally")
    else:
        warn(f"lost the Dask scheduler {where} ({reason}); building the rest locally")
    batcher_for(client).close(ClusterLost(reason, no_workers))
    # closing a client whose scheduler is gone can take its whole timeout: not on this thread
    threading.Thread(target=_close, args=(client,), name="kiln-dask-close", daemon=True).start()


def prestart(executor: dict, stage_modules: list[str]) -> None:
    """Start the client (and a LocalCluster) while doit loads tasks; errors resurface later.

    The workers import the stages (numpy with them: about a second) meanwhile
    too, so the first chains do not wait for it. Once per build and executor:
    the CLI starts it as soon as the project is loaded, before the kernels
    are found and selected, and the build asks again.
    """
    with _client_lock:
        if _key(executor) in _prestarted:
            return
        _prestarted.add(_key(executor))

    def start():
        try:
            client = _connect(executor)
            if client is not None:
                warm_workers(client, stage_modules)
        except Exception:  # the first action that needs the client reports it
            pass

    threading.Thread(target=start, name="kiln-dask-start", daemon=True).start()


def allow_start(executor: dict) -> None:
    """Let this build's remote-cache lookups start the client when a chain first needs it.

    A build that does not prestart (see tasks/build.py ``start_executor``)
    would otherwise send nothing ahead until a task's own action connected:
    every lookup answered meanwhile left its chain to run alone, one after
    the other. ``close_clients`` takes it back.
    """
    with _client_lock:
        _startable.add(_key(executor))


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
    _ahead.clear()  # chains sent ahead of tasks that never ran (a failure, Ctrl-C)
    with _client_lock:
        clients = list(_clients.values())
        _clients.clear()
        _prestarted.clear()
        _startable.clear()
    for client in clients:
        _close(client)


def _close(client) -> None:
    cluster = getattr(client, "cluster", None)
    try:
        client.close(timeout=CONNECT_TIMEOUT)
        if cluster is not None:
            cluster.close(timeout=CONNECT_TIMEOUT)
    except BaseException:  # closing is best effort: the build's result is already known
        pass


atexit.register(close_clients)


class SentAhead(NamedTuple):
    """A chain sent to the cluster before its first task ran (tasks/chains_ahead.py)."""

    sent: tuple  # the kernel sources' identity when their bytes were read
    payload: dict
    chain: list[dict]
    client: object
    result: Future  # run_chain's result, once its batch is back


# the first stage's artifact path -> its chain on the cluster; taken by that stage's action
_ahead: dict[str, SentAhead] = {}


def send_ahead(spec: dict, *, start: bool = True) -> Future | None:
    """Send the chain from ``spec`` now; its action takes the result (run_chain_remotely).

    None: not sent (no cluster, or it is being given up); the action then
    does what it would have done anyway. ``start``: see ``connected_client``.
    """
    from kiln.tasks.chain_batches import BatcherClosed, ClusterLost, batcher_for

    client = connected_client(spec["executor"], start=start)
    if client is None:
        return None
    sent = sources_identity(spec)
    payload, chain = chain_payload(spec)
    try:
        result = batcher_for(client).submit(payload)
    except (BatcherClosed, ClusterLost):
        return None
    _ahead[spec["artifact"]] = SentAhead(sent, payload, chain, client, result)
    return result


def run_chain_remotely(spec: dict, session) -> dict[str, dict[str, bytes]]:
    """Run the chain from ``spec`` on Dask and store every stage's output in ``session``.

    Returns the outputs by action key, so the caller writes them without
    reading them back from the store; empty when the chain was not built there.
    A chain sent ahead of this action (``send_ahead``) is not sent again.
    """
    from kiln.tasks.chain_batches import BatcherClosed, ClusterLost, batcher_for

    ahead = _ahead.pop(spec["artifact"], None)
    if ahead is not None and ahead.chain[0] is spec:
        sent, payload, chain, client, slot = ahead
    else:
        sent = sources_identity(spec)
        payload, chain = chain_payload(spec)
        client = dask_client(spec["executor"])
        if client is None:
            return {}
        slot = None
    try:
        if slot is None:
            slot = batcher_for(client).submit(payload)
        result = slot.result()
    except ClusterLost as exc:  # no workers, or no scheduler, for too long
        give_up(spec["executor"], client, str(exc), exc.no_workers)
        return {}
    except BatcherClosed:  # the build is ending (Ctrl-C): nothing more is built
        raise
    except Exception as exc:
        if _connection_lost(client, exc):  # the scheduler went away
            give_up(spec["executor"], client, "the connection to it was lost")
            return {}
        _warn_once(exc)  # workers lost past Dask's retries: this batch builds here
        return {}
    if "refused" in result:
        raise KilnError(
            f"a Dask worker runs different Kiln code: {result['refused']}",
            hint=STALE_WORKERS_HINT,
        )
    if sources_identity(spec) != sent:
        # a kernel file saved while the chain was out: its key would name the new bytes
        return {}  # and the outputs are of the old ones; the trace runs here instead
    outputs = result["outputs"]
    graph_digest = payload.get("graph_sha256")
    if "trace" in spec and outputs:
        graph_digest = sha256(outputs[0]["artifact"])
    input_digest = None
    produced = {}
    for stage_spec, found in zip(chain, outputs, strict=False):
        key = stage_key(stage_spec, input_digest=input_digest, graph_digest=graph_digest)
        try:
            session.store(key, found)
        except OSError as exc:  # a full or read-only cache costs speed; the bytes are here
            session.store_failed(exc)
        session.produced.add(key)
        produced[key] = found
        input_digest = sha256(found["artifact"])
    return produced


def _connection_lost(client, exc: Exception) -> bool:
    """Whether ``exc`` means the client lost its scheduler (not a batch's own failure)."""
    from concurrent.futures import CancelledError

    if getattr(client, "status", "running") != "running":
        return True
    return isinstance(exc, CancelledError | OSError) or type(exc).__name__ == "ClosedClientError"


def _warn_once(exc: Exception) -> None:
    """One warning per failed batch: its chains all carry the same error object."""
    with _client_lock:
        if id(exc) in _warned:
            return
        _warned.add(id(exc))
    from kiln.logconfig import warn

    warn(f"Dask could not build a batch of chains ({printable_reason(exc)}); building them here")


def kiln_code_digest(modules: list[str]) -> str:
    return hashlib.sha256("|".join(stage_module_info(m)[0] for m in modules).encode()).hexdigest()
