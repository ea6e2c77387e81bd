"""The pipes between an `-n` build and one of its worker processes.

Each worker has a pipe of jobs from the parent and a pipe of results back,
both written directly by the process that owns the writing end. doit's
result queue instead hands every message to a feeder thread: two thread
switches and a fight for the GIL per message, about 70,000 context switches
in a cold build of 1,500 kernel instances against about 11,000 this way.

Without a feeder thread a writer can block on a full pipe, so the parent
never writes more jobs to a busy worker than its pipe surely holds
(``JOB_BYTES_IN_FLIGHT``): a job past that waits in the parent until the
worker answers an earlier one. The parent therefore never blocks on a
worker, and a worker blocked on its result pipe is always read in the end.
A worker's own result pipe (none shared) also means a worker killed in the
middle of a write damages no other worker's messages.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import selectors
import signal
import time
from collections import deque
from collections.abc import Callable

# Bytes of jobs written to a busy worker's pipe and not yet answered: well under the
# smallest pipe buffer of the systems Kiln runs on (64 KiB on Linux, 16 KiB at first
# on macOS). A job is a task's pickled attributes, about 1-2 KiB for a stage task.
JOB_BYTES_IN_FLIGHT = 12 * 1024
STOP_GRACE = 5.0  # seconds a stopped worker has to exit before it is killed


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _dumps(obj) -> bytes:
    return pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)


class WorkerChannel:
    """Both pipes of one worker, and the parent's record of what it sent there."""

    def __init__(self):
        self.job_reader, self.job_writer = multiprocessing.Pipe(duplex=False)
        self.result_reader, self.result_writer = multiprocessing.Pipe(duplex=False)
        self.written: deque[tuple[str | None, bytes]] = deque()  # (job, pickled), in order
        self.held: deque[tuple[str | None, bytes]] = deque()  # jobs not written yet
        self.bytes_in_flight = 0
        self.reading = False  # a worker process reads the job pipe

    def worker_started(self) -> None:
        self.reading = True
        self._write_held()

    # -- the parent's side ---------------------------------------------------
    def put(self, job) -> None:
        """Send a job (None: stop once every earlier job is done)."""
        self.put_pickled(None if job is None else job.name, _dumps(job))

    def put_pickled(self, name: str | None, payload: bytes) -> None:
        if self.held or not self._fits(len(payload)):
            self.held.append((name, payload))
        else:
            self._write(name, payload)

    def answered(self, name: str) -> None:
        """The worker's result for job ``name`` was read: write what it makes room for."""
        sent, payload = self.written.popleft()
        if sent != name:  # a worker runs its jobs in the order they were written
            raise RuntimeError(f"worker answered {name!r} before {sent!r}")
        self.bytes_in_flight -= len(payload)
        self._write_held()

    def running(self) -> str | None:
        """The job the worker is on (or will start next): the oldest one unanswered."""
        return self.written[0][0] if self.written else None

    def unstarted(self) -> list[tuple[str | None, bytes]]:
        """Jobs sent after the running one, pickled, in order (to hand to another worker)."""
        return list(self.written)[1:] + list(self.held)

    def close(self) -> None:
        for conn in (self.job_reader, self.job_writer, self.result_reader, self.result_writer):
            conn.close()

    def _fits(self, size: int) -> bool:
        # a started worker with nothing to do is reading its pipe: any job gets through
        if not self.written and self.reading:
            return True
        return self.bytes_in_flight + size <= JOB_BYTES_IN_FLIGHT

    def _write_held(self) -> None:
        while self.held and self._fits(len(self.held[0][1])):
            self._write(*self.held.popleft())

    def _write(self, name: str | None, payload: bytes) -> None:
        self.job_writer.send_bytes(payload)
        self.written.append((name, payload))
        self.bytes_in_flight += len(payload)


class WorkerEnd:
    """What a worker process holds: its job pipe to read, its result pipe to write."""

    def __init__(self, channel: WorkerChannel):
        self.jobs = channel.job_reader
        self.results = channel.result_writer

    @staticmethod
    def listen_as_worker() -> None:
        """In the worker, first thing: ignore Ctrl-C (the build process stops the
        workers), and take SIGTERM as SystemExit, so that a write in progress
        removes its temp file on the way out."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    def next_job(self):
        return pickle.loads(self.jobs.recv_bytes())

    def put(self, message: dict) -> None:
        self.results.send_bytes(_dumps(message))


class Inbox:
    """The parent's watch over every worker's result pipe and process, with one selector.

    One selector kept for the whole build: ``multiprocessing.connection.wait``
    (and ``Connection.poll``) builds a new one on every call, a cost paid per
    message, which is per task.
    """

    def __init__(self):
        self.selector = selectors.DefaultSelector()

    def watch(self, slot: int, channel: WorkerChannel, process) -> None:
        self.selector.register(channel.result_reader, selectors.EVENT_READ, (slot, True))
        self.selector.register(process.sentinel, selectors.EVENT_READ, (slot, False))

    def forget(self, slot: int, channel: WorkerChannel, process) -> None:
        """Stop watching a worker that said goodbye or died."""
        for item in (channel.result_reader, process.sentinel):
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(item)

    def next_message(
        self, channels: dict[int, WorkerChannel], wait: bool = True
    ) -> tuple[int, dict | None] | None:
        """(slot, message) of the next message from any worker; (slot, None) when a
        worker process ended with nothing more to read. Without ``wait``, None when
        no worker has anything to say yet."""
        while True:
            events = self.selector.select(None if wait else 0)
            ended = None
            for key, _ in events:
                slot, is_result = key.data
                if is_result:  # a message before an end: it may be the worker's last words
                    return slot, pickle.loads(channels[slot].result_reader.recv_bytes())
                ended = slot
            if ended is not None:
                return ended, None
            if not wait:
                return None

    def close(self) -> None:
        self.selector.close()


class WorkerPool:
    """The parent's side of the workers: a channel per slot, its process once started."""

    def __init__(self, slots: int, start: Callable[[WorkerEnd], object]):
        self.start_process = start  # starts a worker process on the given end, returns it
        self.channels = {slot: WorkerChannel() for slot in range(slots)}  # slots 0..slots-1
        self.processes: dict[int, object] = {}
        self.inbox = Inbox()

    def start(self, slot: int) -> None:
        channel = self.channels[slot]
        # Ctrl-C is the build process's to handle: a worker never sees it, not even
        # while it starts (a KeyboardInterrupt in multiprocessing's start-up code
        # prints a traceback). Blocked across the start, SIGINT stays pending for
        # this process; the worker ignores it before unblocking it.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            process = self.processes[slot] = self.start_process(WorkerEnd(channel))
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        channel.worker_started()
        self.inbox.watch(slot, channel, process)

    def next_message(self, wait: bool = True) -> tuple[int, dict | None] | None:
        return self.inbox.next_message(self.channels, wait)

    def replace(self, slot: int, restart: bool) -> tuple[str | None, int | None]:
        """A worker ended unasked: (the job it was on, its exit code). The jobs queued
        behind that one go to a new worker in its slot (started if ``restart`` or any)."""
        process, channel = self.processes.pop(slot), self.channels[slot]
        self.inbox.forget(slot, channel, process)
        process.join()
        running, rest = channel.running(), channel.unstarted()
        channel.close()
        self.channels[slot] = WorkerChannel()
        for name, payload in rest:
            self.channels[slot].put_pickled(name, payload)
        if rest or restart:
            self.start(slot)
        return running, process.exitcode

    def stop(self, on_message: Callable[[dict], None]) -> None:
        """Tell every worker to stop; pass each message before its goodbye to ``on_message``."""
        waiting = set(self.processes)
        for slot in waiting:
            self.channels[slot].put(None)
        while waiting:
            slot, message = self.next_message()
            if message is None or "bye" in message:
                self.inbox.forget(slot, self.channels[slot], self.processes[slot])
                waiting.discard(slot)
            else:
                on_message(message)

    def terminate(self) -> None:
        """Stop every worker: SIGTERM, which a worker answers by removing what it was
        writing and exiting (``listen_as_worker``); SIGKILL for one that does not."""
        for process in self.processes.values():
            if process.is_alive():
                process.terminate()
        deadline = time.monotonic() + STOP_GRACE
        for process in self.processes.values():
            process.join(max(deadline - time.monotonic(), 0))
            if process.is_alive():  # stuck in native code: no handler runs there
                process.kill()

    def close(self) -> None:
        """Wait for every worker process to end, then close the pipes."""
        for process in self.processes.values():
            process.join()
        for channel in self.channels.values():
            channel.close()
        self.inbox.close()
