"""The LocalCluster a build starts when the dask executor has no scheduler address.

Quiet (no dashboard, no Dask log lines), deaf to the terminal's Ctrl-C,
its workers forked from a server that imported Dask, numpy and the stages
once, and below the build process in priority (kiln.tasks.execution.chain_worker).
"""

from __future__ import annotations

import logging
import signal


def local_client(executor: dict):
    """A LocalCluster of ``workers`` processes, quiet: no dashboard, no logs, no Ctrl-C."""
    from multiprocessing import resource_tracker

    from distributed import Client, LocalCluster

    # Ctrl-C reaches every process of the terminal's group, and a worker still
    # importing when it lands prints a KeyboardInterrupt traceback. The cluster's
    # loop thread, made here, starts the workers: with SIGINT blocked in it, they
    # are born with it blocked (fork and exec keep the mask). A build starts the
    # cluster on a thread of its own, so its main thread still takes Ctrl-C; called
    # on the main thread (kiln tune), a Ctrl-C waits the few seconds of the start.
    # (The resource tracker unblocks SIGINT in the thread that first starts it:
    # started here first, it leaves the mask alone.)
    resource_tracker.ensure_running()
    fork_workers_from_a_server()
    unblock = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        cluster = _cluster(executor, LocalCluster)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, unblock)
    return Client(cluster)


# what the worker processes of a LocalCluster import before the first of them is forked
FORKSERVER_PRELOAD = (
    "distributed",
    "numpy",
    "kiln.tasks.execution.chain_worker",
    *(f"kiln.stages.{name}" for name in ("trace", "visa", "lir", "schedule", "edf")),
)


def fork_workers_from_a_server() -> None:
    """LocalCluster workers forked from one server that imported Dask, numpy and the stages.

    Dask spawns each worker as a fresh interpreter by default: every one
    imported Dask, numpy and the stages itself, about a second of CPU each on
    the cores the build needs, before its first chain. The server imports
    them once and each worker starts with them imported. Only Kiln's own
    modules are preloaded: a project's stage modules are imported per worker,
    as they are now.
    """
    import dask
    from distributed.utils import get_mp_context

    dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})
    # a worker samples its own stacks every 10 ms for the dashboard, which a build
    # never shows: that costs each 5 ms chain (the nannies pass this on to the workers)
    dask.config.set({"distributed.worker.profile.enabled": False})
    get_mp_context().set_forkserver_preload(list(FORKSERVER_PRELOAD))


def _cluster(executor: dict, LocalCluster):
    return LocalCluster(
        n_workers=max(int(executor.get("workers") or 1), 1),
        threads_per_worker=1,
        processes=True,
        # dashboard_address=None still starts the scheduler's HTTP server, on 8787
        # ("Port 8787 is already in use" when taken): a free port on loopback instead
        dashboard_address=None,
        scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
        silence_logs=logging.CRITICAL,
        # the workers ignore SIGINT (kiln.tasks.execution.chain_worker.dask_setup): Ctrl-C is the
        # build's to handle; the workers are stopped when the cluster closes
        preload=["kiln.tasks.execution.chain_worker"],
    )
