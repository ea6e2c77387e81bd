"""``kiln compile -n N``: chains on a local process pool (concurrent.futures).

A worker that dies breaks the pool (``BrokenProcessPool`` on every
future): the build never hangs on it, and builds the rest here.

A batch's results come back through a file, not the pool's pipe: all the
workers write into one pipe, and a worker killed (out of memory, kill -9)
half-way through writing tens of MB left a torn message there that the
pool's reader waited on for ever. What crosses the pipe is a path, short
enough for the kernel to write at once (PIPE_BUF). A build that ends with
batches still running (Ctrl-C, SIGTERM, a failure) kills the workers
rather than waiting for their chains.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import tempfile
from concurrent.futures import Future, ProcessPoolExecutor

import msgpack

from kiln.tasks.execution.chain_worker import pool_worker_setup, run_jobs
from kiln.tasks.execution.workers import START_METHOD_ENV, guard_worker
from kiln.tasks.model.importpath import add_project_root

WORKER_FILE = "worker-"  # + pid: one per pool worker, so the build can stop them


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


def _init(root: str, scratch: str) -> None:
    pool_worker_setup()
    guard_worker()  # exits when the build dies: a killed build leaves no worker behind
    add_project_root(root)
    open(os.path.join(scratch, f"{WORKER_FILE}{os.getpid()}"), "wb").close()


def _run_to_file(wire: bytes, scratch: str) -> str:
    """Run a batch; its results go to a file of their own, whose path is the answer."""
    results = run_jobs(wire)
    fd, path = tempfile.mkstemp(dir=scratch, prefix="results-")
    with os.fdopen(fd, "wb") as f:
        f.write(msgpack.packb(results))
    return path


class PoolExecutor:
    def __init__(self, workers: int, root: str):
        context = multiprocessing.get_context(start_method())
        self.scratch = tempfile.mkdtemp(prefix="kiln-pool-")
        self.pending: list[Future] = []
        self.pool = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=context,
            initializer=_init,
            initargs=(root, self.scratch),
        )

    def submit(self, wire: bytes) -> Future:
        """A batch of chains (``batch_to_wire``'s bytes); its future's result lists theirs."""
        # the pool starts its workers inside submit: with Ctrl-C blocked here they are
        # born with it blocked (fork keeps the mask), so one that lands before their
        # initializer ignores it cannot print a KeyboardInterrupt traceback
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            future = self.pool.submit(_run_to_file, wire, self.scratch)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        self.pending = [f for f in self.pending if not f.done()]
        self.pending.append(future)
        return future

    def wait(self, future: Future) -> list[bytes]:
        path = future.result()
        try:
            with open(path, "rb") as f:
                return msgpack.unpackb(f.read())
        finally:
            os.unlink(path)

    def close(self) -> None:
        running = any(not f.done() for f in self.pending)
        if running:  # the build is over without them: stop the workers, not wait for them
            self._kill_workers()
        self.pool.shutdown(wait=not running, cancel_futures=True)
        shutil.rmtree(self.scratch, ignore_errors=True)

    def _kill_workers(self) -> None:
        for name in os.listdir(self.scratch):
            if name.startswith(WORKER_FILE):
                try:
                    os.kill(int(name[len(WORKER_FILE) :]), signal.SIGKILL)
                except (ValueError, OSError):  # gone already
                    pass
