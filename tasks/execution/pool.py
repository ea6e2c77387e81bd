"""``kiln compile -n N``: chains on a local process pool (concurrent.futures).

A worker that dies breaks the pool (``BrokenProcessPool`` on every
future), so the build never hangs on it. The batches that a worker had
begun are suspects: one of them may kill every process that runs it (a
segfault in a stage, ``os._exit``, memory). Each of their chains is built
again alone, in a fresh process of its own, ``workers`` at a time: a chain
that kills that one too fails as its instance (``WorkerDied``), and the
others build. The batches no worker had begun go to a fresh pool. The
build process itself never runs a suspect.

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
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from multiprocessing.connection import wait as wait_for_any

import msgpack

from kiln.fsutil import write_bytes_atomic
from kiln.logconfig import warn
from kiln.tasks.chain.instance_spec import batch_from_wire, batch_to_wire
from kiln.tasks.execution.chain_worker import encode_death, pool_worker_setup, run_jobs
from kiln.tasks.execution.workers import START_METHOD_ENV, guard_worker
from kiln.tasks.model.importpath import add_project_root

WIRE_FILE = "batch-"  # + number: a batch's chains, read by the worker that runs it
WORKER_FILE = "worker-"  # + pid: one per pool worker, so the build can stop them
STARTED_FILE = "started-"  # + batch number: a worker began that batch
ALONE_FILE = "alone-"  # + run number: the result of a chain built in a process of its own


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
    try:
        open(os.path.join(scratch, f"{WORKER_FILE}{os.getpid()}"), "wb").close()
    except FileNotFoundError:  # born as the build closed the pool: nothing is left to do
        os._exit(0)


def _run_to_file(wire_path: str, scratch: str, number: int) -> str:
    """Run the batch in ``wire_path``; its results go to a file of their own, whose path
    is the answer."""
    open(os.path.join(scratch, f"{STARTED_FILE}{number}"), "wb").close()
    with open(wire_path, "rb") as f:
        results = run_jobs(f.read())
    fd, path = tempfile.mkstemp(dir=scratch, prefix="results-")
    with os.fdopen(fd, "wb") as f:
        f.write(msgpack.packb(results))
    return path


def after_break(batches: dict[int, bool]) -> tuple[list[int], list[int]]:
    """(to a fresh pool, each chain alone): what becomes of the unfinished batches
    (number -> whether a worker had begun it) when the pool broke.

    A batch a worker had begun may be what killed it; one no worker had
    begun cannot be. When none had begun (a worker died starting), a fresh
    pool would break the same way: every chain goes alone. Each break thus
    takes at least one batch out of the pool: the build ends.
    """
    begun = sorted(n for n, started in batches.items() if started)
    if not begun:
        return [], sorted(batches)
    return sorted(n for n, started in batches.items() if not started), begun


class _Sent:
    """A batch as submitted: the pool's future for it, or its chains' runs alone."""

    __slots__ = ("number", "wire", "future", "runs")

    def __init__(self, number: int, wire: bytes):
        self.number = number
        self.wire = wire
        self.future: Future | None = None
        self.runs: list[_Run] | None = None

    def unfinished(self) -> bool:
        future = self.future
        if self.runs is not None or future is None or future.cancelled():
            return False
        return not future.done() or future.exception() is not None


class PoolExecutor:
    def __init__(self, workers: int, root: str):
        self.workers = workers
        self.root = root
        self.context = multiprocessing.get_context(start_method())
        self.scratch = tempfile.mkdtemp(prefix="kiln-pool-")
        self.sent: dict[Future, _Sent] = {}  # by the handle submit answered, until waited
        self.count = 0
        self.broke = False
        self.alone = Alone(self.context, workers, root, self.scratch)
        self.pool: ProcessPoolExecutor | None = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=self.context,
            initializer=_init,
            initargs=(self.root, self.scratch),
        )

    def submit(self, wire: bytes) -> Future:
        """A batch of chains (``batch_to_wire``'s bytes): a handle that ``wait`` takes.

        The handle is not the pool's future, which may move to a fresh pool.
        Nothing but the pool itself cancels the pool's futures: one cancelled
        from here while a worker died made its thread fail (InvalidStateError,
        a traceback at Ctrl-C); ``close`` cancels what never started.
        """
        sent = _Sent(self.count, wire)
        self.count += 1
        self._submit(sent)
        handle: Future = Future()
        self.sent[handle] = sent
        return handle

    def _submit(self, sent: _Sent) -> None:
        if self.pool is None:
            self.pool = self._new_pool()
        # the pool starts its workers inside submit: with Ctrl-C blocked here they are
        # born with it blocked (fork keeps the mask), so one that lands before their
        # initializer ignores it cannot print a KeyboardInterrupt traceback
        # the batch goes through a file too: the pool's feeder thread, blocked writing a
        # large batch into the pipe of a worker killed at Ctrl-C, hung the shutdown
        # (Python before 3.11.7); a path is written at once
        wire_path = os.path.join(self.scratch, f"{WIRE_FILE}{sent.number}")
        if not os.path.exists(wire_path):
            write_bytes_atomic(wire_path, sent.wire)
        with _ctrl_c_blocked():
            sent.future = self.pool.submit(_run_to_file, wire_path, self.scratch, sent.number)

    def wait(self, handle: Future) -> list[bytes]:
        """The batch's results, in order; a chain whose process died answers ``encode_death``."""
        sent = self.sent[handle]
        while sent.runs is None:
            try:
                path = sent.future.result()
            except BrokenProcessPool:
                self._recover()
                continue
            del self.sent[handle]
            try:
                with open(path, "rb") as f:
                    return msgpack.unpackb(f.read())
            finally:
                os.unlink(path)
        del self.sent[handle]
        return self.alone.wait(sent.runs)

    def _recover(self) -> None:
        """The pool broke: its unfinished batches go to a fresh pool or alone (after_break)."""
        broken, self.pool = self.pool, None
        self._kill_workers()  # the pool ends them too, but waits for them: one may not end
        if broken is not None:
            broken.shutdown(wait=True)
        self._forget_workers()
        unfinished = {s.number: s for s in self.sent.values() if s.unfinished()}
        begun = {n: os.path.exists(self._started(n)) for n in unfinished}
        again, alone = after_break(begun)
        if not self.broke:
            self.broke = True
            warn(
                "a worker of the process pool died; the chains it may have been "
                "building are built again, each in a process of its own"
            )
        for number in alone:
            sent = unfinished[number]
            sent.runs, sent.wire = self.alone.add(sent.wire), b""
        for number in again:
            self._submit(unfinished[number])

    def _started(self, number: int) -> str:
        return os.path.join(self.scratch, f"{STARTED_FILE}{number}")

    def close(self) -> None:
        running = any(s.future is not None and not s.future.done() for s in self.sent.values())
        self.alone.close()
        if self.pool is not None:
            if running:  # the build is over without them: stop the workers, not wait for them
                self._kill_workers()
            # the pool's thread is waited for even then (its workers are dead, it ends at
            # once): still closing its pipes as Python exits, it failed there with a traceback
            self.pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(self.scratch, ignore_errors=True)

    def _kill_workers(self) -> None:
        """Kill every worker: those that said their pid, and any still starting (a child
        process of this build not yet past its initializer would run a queued batch to
        its end, and the pool's shutdown would wait for it)."""
        pids = {child.pid for child in multiprocessing.active_children()}
        for name in os.listdir(self.scratch):
            if name.startswith(WORKER_FILE):
                try:
                    pids.add(int(name[len(WORKER_FILE) :]))
                except ValueError:
                    pass
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:  # gone already
                pass

    def _forget_workers(self) -> None:
        """A broken pool's workers are gone: their pids may be reused, never to be killed."""
        for name in os.listdir(self.scratch):
            if name.startswith(WORKER_FILE):
                os.unlink(os.path.join(self.scratch, name))


class _Run:
    """One chain built in a process of its own; ``result`` once that process ended."""

    __slots__ = ("wire", "path", "process", "result")

    def __init__(self, wire: bytes, path: str):
        self.wire = wire
        self.path = path
        self.process = None
        self.result: bytes | None = None


class Alone:
    """Chains that may kill their process, each in a fresh process, ``workers`` at a time.

    Processes start and are reaped while the build waits for a result (no
    thread of its own): the first ``workers`` start when added.
    """

    def __init__(self, context, workers: int, root: str, scratch: str):
        self.context = context
        self.workers = max(1, workers)
        self.root = root
        self.scratch = scratch
        self.queue: deque[_Run] = deque()
        self.running: dict[int, _Run] = {}  # by the process's sentinel
        self.count = 0

    def add(self, wire: bytes) -> list[_Run]:
        """Runs for each chain of the batch ``wire``, queued in order."""
        runs = []
        for job in batch_from_wire(wire):
            runs.append(
                _Run(batch_to_wire([job]), os.path.join(self.scratch, f"{ALONE_FILE}{self.count}"))
            )
            self.count += 1
        self.queue.extend(runs)
        self._start_more()
        return runs

    def wait(self, runs: list[_Run]) -> list[bytes]:
        for run in runs:
            while run.result is None:
                self._start_more()
                if not self.running:  # never: each run added is queued or running
                    raise RuntimeError("a chain to build alone was lost")
                for sentinel in wait_for_any(list(self.running)):
                    self._finish(self.running.pop(sentinel))
        return [run.result for run in runs]

    def _start_more(self) -> None:
        while self.queue and len(self.running) < self.workers:
            run = self.queue.popleft()
            run.process = self.context.Process(
                target=_run_alone, args=(run.wire, self.root, run.path), name="kiln-alone"
            )
            with _ctrl_c_blocked():
                run.process.start()
            run.wire = b""
            self.running[run.process.sentinel] = run

    def _finish(self, run: _Run) -> None:
        run.process.join()
        code = run.process.exitcode
        run.process.close()
        try:  # written whole or not at all: an answer here is the chain's
            with open(run.path, "rb") as f:
                (run.result,) = msgpack.unpackb(f.read())
            os.unlink(run.path)
        except FileNotFoundError:
            run.result = encode_death(code or 0)  # it ended without answering: it died

    def close(self) -> None:
        """Kill what still runs (the build is over without it), forget what never started."""
        self.queue.clear()
        for run in self.running.values():
            run.process.kill()
        for run in self.running.values():
            run.process.join()
        self.running.clear()


def _run_alone(wire: bytes, root: str, path: str) -> None:
    """In a process of its own: one chain; its result to ``path``, whole or not at all."""
    pool_worker_setup()
    guard_worker()
    add_project_root(root)
    results = run_jobs(wire)
    with open(path + ".tmp", "wb") as f:
        f.write(msgpack.packb(results))
    os.replace(path + ".tmp", path)


@contextmanager
def _ctrl_c_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread meanwhile: a process started here is born with it
    blocked, and unblocks it once it ignores it (pool_worker_setup)."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
