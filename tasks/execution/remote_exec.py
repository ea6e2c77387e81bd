"""Chains on a Dask cluster: one Dask task per kernel instance, bytes in, bytes out.

The build (tasks/execution/ahead.py) sends each stale instance's chain as a
``ChainJob``'s bytes: the kernel's sources by content, the stages with
their resolved options and code digests, the machine model. The worker
imports the kernel fresh from those sources, runs the chain through the
compiler driver and returns the files' bytes; the build writes them
locally and atomically. A chain that fails on a worker is built again
here, which gives exactly the local diagnostic. A scheduler that cannot
be reached, or is lost mid-build, is one warning: the rest builds here.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import socket
import threading
import time
from concurrent.futures import Future

from kiln.errors import KilnError
from kiln.tasks.chain.instance_spec import ExecutorSettings
from kiln.tasks.execution.executor import DISTRIBUTED_HINT, scheduler_host_port
from kiln.tasks.execution.local_cluster import local_client
from kiln.tasks.model.digest import stage_module_info

CONNECT_TIMEOUT = 10  # seconds to reach a scheduler before the build gives it up
POLL = 0.5  # seconds between looks at a lost connection while waiting for a chain
PROBE_EVERY = 2.0  # seconds between asking the scheduler itself while a batch runs


class ClusterLost(ConnectionError):
    """The cluster cannot build: the reason completes "the Dask scheduler X ..."."""


class DaskExecutor:
    """A Client of the build's scheduler (or of a LocalCluster it starts and closes)."""

    def __init__(self, settings: ExecutorSettings):
        try:
            from distributed import Client
        except ImportError:
            raise KilnError("the dask executor needs distributed", hint=DISTRIBUTED_HINT) from None
        quiet_dask_logs()
        self.settings = settings
        self._asker = None  # the DeadlineCaller the scheduler is asked through
        try:
            if settings.address:
                self.client = _scheduler_client(Client, settings.address)
            else:
                self.client = local_client({"workers": settings.workers})
        except Exception as exc:  # refused, timed out, a bad address: one message
            raise _connect_error(settings, exc) from None

    def submit(self, wire: bytes) -> Future:
        """A batch of chains (``batch_to_wire``'s bytes): one Dask task, its result their list."""
        from kiln.tasks.execution.chain_worker import run_jobs

        return self.client.submit(run_jobs, wire, pure=False)

    def wait(self, future) -> list[bytes]:
        """The batch's results; ClusterLost when the scheduler is gone, stops answering,
        has had no workers, or the worker running the batch has not been heard from, for
        CONNECT_TIMEOUT. (A stopped scheduler keeps its connection open, and the
        scheduler drops a stopped worker only after minutes: both held the build.)"""
        lost_since = idle_since = None
        probed = time.monotonic()
        while True:
            try:
                return future.result(timeout=POLL)
            except TimeoutError:
                pass
            except Exception as exc:
                if type(exc).__name__ != "TimeoutError":
                    raise
            now = time.monotonic()
            if self.client.status != "running":
                lost_since = lost_since or now
                if now - lost_since > CONNECT_TIMEOUT:
                    raise ClusterLost(f"lost the scheduler ({self.client.status})")
                continue
            lost_since = None
            if now - probed < PROBE_EVERY:
                continue
            probed = now
            workers, silent = self._ask_scheduler(future.key)
            # a large cluster's workers beat less often (Dask: every n/200 + 1 s above 200)
            if silent > max(CONNECT_TIMEOUT, 10 * (workers / 200 + 1)):
                raise ClusterLost(
                    f"has a worker that has not answered for {silent:.0f} s while it builds"
                )
            if workers:
                idle_since = None
            else:
                idle_since = idle_since or now
                if now - idle_since > CONNECT_TIMEOUT:
                    raise ClusterLost(f"has had no workers for {CONNECT_TIMEOUT} s")

    def _ask_scheduler(self, key) -> tuple[int, float]:
        """(workers, seconds since the worker running ``key`` was heard from), asked of
        the scheduler itself; ClusterLost when it gives no answer within CONNECT_TIMEOUT."""
        from kiln.cache.remote import DeadlineCaller  # imported by _scheduler_client already

        def view(dask_scheduler):  # made here: pickled by value, the scheduler needs no Kiln
            import time as clock

            task = dask_scheduler.tasks.get(key)
            worker = getattr(task, "processing_on", None)
            silent = clock.time() - worker.last_seen if worker is not None else 0.0
            return len(dask_scheduler.workers), silent

        if self._asker is None:  # one thread for every question of this build
            self._asker = DeadlineCaller()
        outcome = self._asker.call(self.client.run_on_scheduler, (view,), CONNECT_TIMEOUT)
        if outcome is None:
            raise ClusterLost(f"stopped answering for {CONNECT_TIMEOUT} s")
        if "error" in outcome:  # the connection dropping (the status says so next), or a
            try:  # scheduler that will not run the question: count its workers as before
                return len(self.client.scheduler_info().get("workers", {})), 0.0
            except Exception:
                return 1, 0.0
        return outcome["value"]

    def close(self) -> None:
        client, self.client = self.client, None
        if client is None:
            return
        # closing a client whose scheduler is gone can take its whole timeout
        thread = threading.Thread(target=_close, args=(client,), daemon=True)
        thread.start()
        thread.join(CONNECT_TIMEOUT)


def _close(client) -> None:
    cluster = getattr(client, "cluster", None)
    try:
        client.close(timeout=CONNECT_TIMEOUT)
        if cluster is not None:
            cluster.close(timeout=CONNECT_TIMEOUT)
    except BaseException:  # closing is best effort: the build's result is already known
        pass


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


def _connect_error(settings: ExecutorSettings, exc: Exception) -> KilnError:
    address, source = settings.address, settings.source or "KILN_SCHEDULER"
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


STALE_WORKERS_HINT = (
    "install the same Kiln version on the workers (or restart them after an upgrade)"
)
_tuning_clients: list[DaskExecutor] = []


def dask_client(executor: dict):
    """A Client for ``kiln tune``'s trials (closed when the process exits)."""
    settings = ExecutorSettings(
        kind="dask",
        workers=executor.get("workers") or 1,
        address=executor.get("address"),
        source=executor.get("source") or "",
    )
    started = DaskExecutor(settings)
    if not _tuning_clients:
        atexit.register(lambda: [e.close() for e in _tuning_clients])
    _tuning_clients.append(started)
    return started.client


def kiln_code_digest(modules: list[str]) -> str:
    """One digest of the stage modules' code: a worker with another refuses to run trials."""
    return hashlib.sha256("|".join(stage_module_info(m)[0] for m in modules).encode()).hexdigest()
