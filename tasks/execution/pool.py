"""``kiln compile -n N``: chains on a local process pool (concurrent.futures).

A worker that dies breaks the pool (``BrokenProcessPool`` on every
future): the build never hangs on it, and builds the rest here.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from concurrent.futures import Future, ProcessPoolExecutor

from kiln.tasks.execution.chain_worker import pool_worker_setup, run_jobs
from kiln.tasks.execution.workers import START_METHOD_ENV, guard_worker
from kiln.tasks.model.importpath import add_project_root


def start_method() -> str:
    """fork where the system has it (workers start with Kiln imported), else spawn.

    ``KILN_MP_START`` chooses (fork, forkserver, spawn); a bad value is
    refused before the build by the CLI.
    """
    wanted = os.environ.get(START_METHOD_ENV, "").strip()
    methods = multiprocessing.get_all_start_methods()
    if wanted in methods:
        return wanted
    return "fork" if "fork" in methods else "spawn"


def _init(root: str) -> None:
    pool_worker_setup()
    guard_worker()  # exits when the build dies: a killed build leaves no worker behind
    add_project_root(root)


class PoolExecutor:
    def __init__(self, workers: int, root: str):
        context = multiprocessing.get_context(start_method())
        self.pool = ProcessPoolExecutor(
            max_workers=workers, mp_context=context, initializer=_init, initargs=(root,)
        )

    def submit(self, wire: bytes) -> Future:
        """A batch of chains (``batch_to_wire``'s bytes); its future's result lists theirs."""
        # the pool starts its workers inside submit: with Ctrl-C blocked here they are
        # born with it blocked (fork keeps the mask), so one that lands before their
        # initializer ignores it cannot print a KeyboardInterrupt traceback
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            return self.pool.submit(run_jobs, wire)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def wait(self, future: Future) -> list[bytes]:
        return future.result()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
