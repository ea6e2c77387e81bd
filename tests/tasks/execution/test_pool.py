"""The process pool of ``kiln compile -n N``: results through files, workers stopped at once.

The batches here run a stand-in for the chain runner (set before the pool's
workers fork, so they run it too): what is tested is the pool, not the chains.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures.process import BrokenProcessPool

import pytest

from kiln.tasks.execution import pool
from kiln.tasks.execution.pool import WORKER_FILE, PoolExecutor

pytestmark = pytest.mark.skipif(
    "fork" not in __import__("multiprocessing").get_all_start_methods(),
    reason="the stand-in runner reaches the workers by fork",
)


def _large_results(wire: bytes) -> list[bytes]:
    return [wire * 300_000, b"", bytes(range(256))]


def _sleeps(wire: bytes) -> list[bytes]:
    time.sleep(120)
    return []


@pytest.fixture
def forked(monkeypatch):
    monkeypatch.setenv("KILN_MP_START", "fork")
    return monkeypatch


def _worker_pid(executor: PoolExecutor, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        names = [n for n in os.listdir(executor.scratch) if n.startswith(WORKER_FILE)]
        if names:
            return int(names[0][len(WORKER_FILE) :])
        time.sleep(0.02)
    raise AssertionError("no pool worker started")


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # dead, not yet reaped
    except FileNotFoundError:
        return True


def test_large_results_come_back_whole_and_leave_no_file(forked, tmp_path):
    forked.setattr(pool, "run_jobs", _large_results)
    executor = PoolExecutor(1, str(tmp_path))
    try:
        results = executor.wait(executor.submit(b"kiln"))
        assert results == [b"kiln" * 300_000, b"", bytes(range(256))]
        left = [n for n in os.listdir(executor.scratch) if not n.startswith(WORKER_FILE)]
        assert left == []  # each results file is read once, then removed
    finally:
        executor.close()
    assert not os.path.exists(executor.scratch)


def test_a_worker_killed_mid_batch_breaks_the_pool_instead_of_hanging(forked, tmp_path):
    forked.setattr(pool, "run_jobs", _sleeps)
    executor = PoolExecutor(1, str(tmp_path))
    try:
        future = executor.submit(b"")
        os.kill(_worker_pid(executor), signal.SIGKILL)
        with pytest.raises(BrokenProcessPool):
            executor.wait(future)
    finally:
        executor.close()


def test_closing_with_a_batch_still_running_stops_its_worker_at_once(forked, tmp_path):
    """Ctrl-C or SIGTERM during a -n build: the workers' chains are not waited for."""
    forked.setattr(pool, "run_jobs", _sleeps)
    executor = PoolExecutor(2, str(tmp_path))
    executor.submit(b"")
    pid = _worker_pid(executor)
    started = time.monotonic()
    executor.close()
    assert time.monotonic() - started < 10  # not the 120 s the batch would take
    deadline = time.monotonic() + 10
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(pid)
    assert not os.path.exists(executor.scratch)
