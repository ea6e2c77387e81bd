"""The pipes between an `-n` build and its workers (tasks/worker_pipes.py)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading

import pytest
from kiln.tasks.worker_pipes import JOB_BYTES_IN_FLIGHT, WorkerChannel, WorkerEnd, WorkerPool


class _Job:
    def __init__(self, name: str, size: int = 100):
        self.name = name
        self.body = "x" * size


@pytest.fixture
def channel():
    made = WorkerChannel()
    yield made
    made.close()


def _read_all(channel: WorkerChannel) -> list[str]:
    end, names = WorkerEnd(channel), []
    while channel.job_reader.poll():
        names.append(end.next_job().name)
    return names


def test_a_busy_worker_gets_no_more_job_bytes_than_its_pipe_surely_holds(channel):
    channel.worker_started()
    size = JOB_BYTES_IN_FLIGHT // 3
    for name in "abcd":
        channel.put(_Job(name, size))
    # three fit in flight (each pickled a little over a third is too much for the third)
    written = _read_all(channel)
    assert written == ["a", "b"] and [n for n, _ in channel.held] == ["c", "d"]
    assert channel.running() == "a"
    channel.answered("a")  # room for one more
    assert _read_all(channel) == ["c"] and [n for n, _ in channel.held] == ["d"]
    assert channel.running() == "b"


def _reader(channel: WorkerChannel) -> tuple[threading.Thread, list[str]]:
    """A worker stand-in that reads one job, in a thread."""
    names: list[str] = []
    thread = threading.Thread(target=lambda: names.append(WorkerEnd(channel).next_job().name))
    thread.start()
    return thread, names


def test_an_idle_worker_takes_a_job_of_any_size(channel):
    channel.worker_started()
    thread, names = _reader(channel)
    channel.put(_Job("huge", 10 * JOB_BYTES_IN_FLIGHT))  # more than a pipe holds
    thread.join()
    assert names == ["huge"] and not channel.held and channel.running() == "huge"


def test_nothing_past_the_budget_is_written_before_the_worker_reads(channel):
    # before the worker process starts nobody reads: even a first job waits if too big
    channel.put(_Job("huge", 10 * JOB_BYTES_IN_FLIGHT))
    assert [n for n, _ in channel.held] == ["huge"] and channel.running() is None
    thread, names = _reader(channel)
    channel.worker_started()
    thread.join()
    assert names == ["huge"] and not channel.held and channel.running() == "huge"


def test_results_must_come_back_in_the_order_jobs_were_sent(channel):
    channel.worker_started()
    channel.put(_Job("a"))
    channel.put(_Job("b"))
    with pytest.raises(RuntimeError, match="answered 'b' before 'a'"):
        channel.answered("b")


def test_unstarted_jobs_are_every_job_after_the_running_one_in_order(channel):
    channel.worker_started()
    for name in "abc":
        channel.put(_Job(name, JOB_BYTES_IN_FLIGHT // 2))
    assert channel.running() == "a"
    assert [name for name, _ in channel.unstarted()] == ["b", "c"]


def _echo(end: WorkerEnd) -> None:
    while (job := end.next_job()) is not None:
        if job.name == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        end.put({"name": job.name})
    end.put({"bye": True})


def _start(end: WorkerEnd):
    process = multiprocessing.get_context("fork").Process(target=_echo, args=(end,))
    process.start()
    return process


def test_the_pool_reads_results_and_sees_a_worker_die():
    pool = WorkerPool(2, _start)
    try:
        pool.start(0)
        pool.start(1)
        pool.channels[0].put(_Job("a"))
        pool.channels[1].put(_Job("die"))
        pool.channels[1].put(_Job("after"))
        seen = {}
        while len(seen) < 2:
            slot, message = pool.next_message()
            seen[slot] = message
        assert seen[0] == {"name": "a"} and seen[1] is None  # slot 1's process ended
        pool.channels[0].answered("a")
        running, exitcode = pool.replace(1, restart=False)
        assert running == "die" and exitcode == -signal.SIGKILL
        # the job queued behind the fatal one went to the new worker in slot 1
        assert pool.next_message() == (1, {"name": "after"})
        pool.channels[1].answered("after")
        pool.stop(lambda message: pytest.fail(f"unexpected {message}"))
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.close()
    assert [p.exitcode for p in pool.processes.values()] == [0, 0]  # both said goodbye
