"""Waiting for a batch on Dask (tasks/execution/remote_exec.py): a scheduler that stops
answering, or a worker that stops while it builds, ends the wait within the deadline."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("distributed", reason="the dask executor needs kiln[distributed]")

from kiln.tasks.execution import remote_exec  # noqa: E402
from kiln.tasks.execution.remote_exec import ClusterLost, DaskExecutor  # noqa: E402


class PendingFuture:
    key = "run_jobs-1"

    def result(self, timeout=None):
        time.sleep(timeout or 0)
        raise TimeoutError


class Client:
    """A client whose scheduler answers ``run_on_scheduler`` as ``scheduler`` would,
    or never (``scheduler`` None: a stopped process keeps its connection open)."""

    status = "running"

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.never = threading.Event()

    def run_on_scheduler(self, fn):
        if self.scheduler is None:
            self.never.wait()
        return fn(dask_scheduler=self.scheduler)


def executor(monkeypatch, scheduler) -> DaskExecutor:
    monkeypatch.setattr(remote_exec, "CONNECT_TIMEOUT", 0.5)
    monkeypatch.setattr(remote_exec, "PROBE_EVERY", 0.0)
    monkeypatch.setattr(remote_exec, "POLL", 0.02)
    made = DaskExecutor.__new__(DaskExecutor)
    made.client, made._asker = Client(scheduler), None  # noqa: SLF001 (the object under test)
    return made


def test_a_scheduler_that_stops_answering_ends_the_wait(monkeypatch):
    start = time.monotonic()
    with pytest.raises(ClusterLost, match="stopped answering"):
        executor(monkeypatch, None).wait(PendingFuture())
    assert time.monotonic() - start < 5


def test_a_worker_unheard_of_while_it_builds_ends_the_wait(monkeypatch):
    silent = SimpleNamespace(last_seen=time.time() - 30)
    scheduler = SimpleNamespace(
        tasks={PendingFuture.key: SimpleNamespace(processing_on=silent)},
        workers={"tcp://a": silent, "tcp://b": object()},
    )
    with pytest.raises(ClusterLost, match="worker that has not answered for 30 s"):
        executor(monkeypatch, scheduler).wait(PendingFuture())


def test_a_cluster_without_workers_ends_the_wait(monkeypatch):
    scheduler = SimpleNamespace(tasks={}, workers={})
    with pytest.raises(ClusterLost, match="has had no workers"):
        executor(monkeypatch, scheduler).wait(PendingFuture())


def test_a_healthy_cluster_is_waited_for(monkeypatch):
    class Heard:  # heartbeats all along
        @property
        def last_seen(self):
            return time.time()

    heard = Heard()
    scheduler = SimpleNamespace(
        tasks={PendingFuture.key: SimpleNamespace(processing_on=heard)}, workers={"a": heard}
    )
    done = PendingFuture()
    calls = []

    def result(timeout=None):
        calls.append(timeout)
        if len(calls) < 60:  # well past CONNECT_TIMEOUT, answered all along
            time.sleep(timeout)
            raise TimeoutError
        return [b"chain"]

    done.result = result
    assert executor(monkeypatch, scheduler).wait(done) == [b"chain"]
