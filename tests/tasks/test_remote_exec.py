"""The build's Dask client: one message for a scheduler it cannot reach, one warning
for a cluster it loses, and the rest of the build local (no real cluster here)."""

from __future__ import annotations

import socket
import time

import pytest
from kiln.tasks import chain_batches, remote_exec
from kiln.tasks.chain_batches import ClusterLost

from kiln.errors import KilnError
from tests.support.remote_state import empty_build_state, lir_schedule_chain

distributed = pytest.importorskip("distributed", reason="the dask executor needs kiln[distributed]")


@pytest.fixture
def fresh(monkeypatch):
    """A Dask build's per-process state, empty, and undone after the test."""
    empty_build_state(monkeypatch)
    return monkeypatch


@pytest.fixture
def listening():
    """A port that accepts connections and never answers (a scheduler Dask gives up on)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def refusing_client(calls: list):
    def client(address, timeout):
        calls.append(address)
        raise OSError(f"Timed out trying to connect to {address} after {timeout} s")

    return client


@pytest.mark.parametrize(
    "source, hint",
    [
        ("--scheduler", "drop --scheduler"),
        ("KILN_SCHEDULER", "unset KILN_SCHEDULER"),
        ("executor.address in pipeline.yaml", "remove executor.address from pipeline.yaml"),
    ],
)
def test_an_unreachable_scheduler_is_one_error_then_the_rest_builds_here(
    fresh, source, hint, listening
):
    calls: list = []
    fresh.setattr(distributed, "Client", refusing_client(calls))
    address = f"tcp://127.0.0.1:{listening}"
    executor = {"kind": "dask", "address": address, "workers": 2, "source": source}
    with pytest.raises(KilnError) as info:
        remote_exec.dask_client(executor)
    err = info.value
    assert f"cannot reach the Dask scheduler {address}" in err.message
    assert source in err.message and hint in err.hint
    err.notes.append("while running stage 'trace' of a.small")  # as the action does
    assert remote_exec.dask_client(executor) is None  # no second message: built here
    assert remote_exec.dask_client(executor) is None
    assert calls == [address]  # one attempt per build


def test_a_refused_scheduler_fails_at_once_without_waiting_for_dask(fresh):
    # nothing listens on a port just closed: Dask would retry it for CONNECT_TIMEOUT
    calls: list = []
    fresh.setattr(distributed, "Client", refusing_client(calls))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    executor = {"kind": "dask", "address": f"tcp://127.0.0.1:{port}", "workers": 2}
    started = time.monotonic()
    with pytest.raises(KilnError) as info:
        remote_exec.dask_client(executor)
    assert time.monotonic() - started < remote_exec.CONNECT_TIMEOUT / 2
    assert "ConnectionRefusedError" in info.value.message
    assert calls == []


def test_a_scheduler_that_accepts_and_never_answers_is_an_error_in_time(fresh, listening):
    # Dask bounds the connection, not the reply: such a server held the build forever
    fresh.setattr(remote_exec, "CONNECT_TIMEOUT", 1)
    executor = {"kind": "dask", "address": f"tcp://127.0.0.1:{listening}", "workers": 2}
    started = time.monotonic()
    with pytest.raises(KilnError) as info:
        remote_exec.dask_client(executor)
    assert time.monotonic() - started < 5
    assert "no answer from the scheduler within 1 s" in info.value.message


def test_the_stored_error_is_never_handed_out_itself(fresh):
    """Each raise is a fresh copy: the notes an action adds stay its own."""
    fresh.setattr(distributed, "Client", refusing_client([]))
    executor = {"kind": "dask", "address": "tcp://127.0.0.1:1", "workers": 2, "source": "x"}
    with pytest.raises(KilnError):
        remote_exec._connect(executor)  # the prestart thread's attempt
    with pytest.raises(KilnError) as info:
        remote_exec.dask_client(executor)
    info.value.notes.append("while running stage 'trace' of a.small")
    stored = remote_exec._failed[remote_exec._key(executor)]
    assert stored.notes == [] and stored is not info.value


class FakeClient:
    status = "running"

    def __init__(self):
        self.closed = False

    def close(self, timeout=None):
        self.closed = True


class FakeBatcher:
    """A batcher whose chains come back at once, from ``run``."""

    def submit(self, payload):
        from concurrent.futures import Future

        slot = Future()
        slot.set_result(self.run(payload))
        return slot


def test_a_lost_cluster_is_one_warning_and_later_chains_go_local_at_once(fresh, capfd):
    client = FakeClient()
    executor = {"kind": "dask", "address": "tcp://h:8786", "workers": 2, "source": "--scheduler"}
    remote_exec._clients[remote_exec._key(executor)] = client
    assert remote_exec.dask_client(executor) is client
    for _ in range(3):  # every waiting chain sees the loss: one warning
        remote_exec.give_up(executor, client, "the connection to it was lost")
    err = capfd.readouterr().err
    assert err.count("kiln: warning:") == 1
    assert "lost the Dask scheduler tcp://h:8786" in err and "building the rest locally" in err
    assert remote_exec.dask_client(executor) is None
    batcher = chain_batches.batcher_for(client)
    with pytest.raises(ClusterLost):
        batcher.submit({"stages": []}).result()


def test_a_cluster_without_workers_says_so(fresh, capfd):
    client = FakeClient()
    executor = {"kind": "dask", "address": None, "workers": 2, "source": None}
    remote_exec.give_up(executor, client, "no workers for 10 s", no_workers=True)
    err = capfd.readouterr().err
    assert "has had no workers for 10 s; building the rest locally" in err


def test_a_failed_batch_is_one_warning_for_all_its_chains(fresh, capfd):
    error = RuntimeError("KilledWorker: run_chains-1")
    for _ in range(8):
        remote_exec._warn_once(error)
    assert capfd.readouterr().err.count("Dask could not build a batch") == 1


@pytest.mark.parametrize(
    "status, exc, lost",
    [
        ("running", RuntimeError("a kernel"), False),
        ("connecting", RuntimeError("x"), True),
        ("running", OSError("comm closed"), True),
        ("running", distributed.client.FutureCancelledError("k", "lost"), True),
    ],
)
def test_what_counts_as_a_lost_scheduler(status, exc, lost):
    client = FakeClient()
    client.status = status
    assert remote_exec._connection_lost(client, exc) is lost


def test_an_unwritable_store_costs_a_dask_build_its_cache_not_the_chain(fresh, tmp_path, capfd):
    """KILN_CACHE_DIR on a file (or a read-only disk): the chain's outputs come back from
    the worker all the same, are written locally, and the store's failure is a warning."""
    from kiln.tasks.cached import fetch_or_run

    (tmp_path / "cache").write_text("a file, not a directory")
    executor = {"kind": "dask", "address": "tcp://h:8786", "workers": 1, "source": "--scheduler"}
    lir, _ = lir_schedule_chain(tmp_path, str(tmp_path / "cache" / "store"), executor)

    class Batcher(FakeBatcher):
        def run(self, payload):
            return {"outputs": [{"artifact": b"lir bytes"}, {"artifact": b"sched bytes"}]}

    fresh.setattr(remote_exec, "dask_client", lambda executor: FakeClient())
    fresh.setattr(chain_batches, "batcher_for", lambda client: Batcher())

    def must_not_run(spec):
        raise AssertionError("the chain was built on the cluster")

    assert fetch_or_run(lir, must_not_run) == "compiled"
    assert (tmp_path / "out" / "kernel.lir").read_bytes() == b"lir bytes"
    assert (tmp_path / "out" / "kernel.sched").read_bytes() == b"sched bytes"
    assert "kiln: warning: the artifact cache" in capfd.readouterr().err


def test_a_source_saved_while_its_chain_is_out_is_never_stored_under_its_key(fresh, tmp_path):
    """The key of a chain back from Dask is made from the files as they are now: a kernel
    saved meanwhile would file the old version's graph under the new version's key."""
    import os

    from kiln.tasks.cached import fetch_or_run, stage_key

    from kiln.cache.config import CacheConfig
    from kiln.cache.store import LocalStore

    source = tmp_path / "k.py"
    source.write_text("version 1")
    config = CacheConfig(local_dir=str(tmp_path / "store"))
    executor = {"kind": "dask", "address": "tcp://h:8786", "workers": 1, "source": "--scheduler"}
    spec = {"root": str(tmp_path), "instance": "k.small", "stage": "trace", "stage_index": 0}
    spec.update(module="kiln.stages.trace", options={}, machine={}, dumps=[], executor=executor)
    spec.update(trace={"module": "k", "function": "k"}, sources=[str(source)])
    spec.update(artifact=str(tmp_path / "out" / "graph.json"), cache=config.to_dict())
    spec["chain"] = [spec]

    class Batcher(FakeBatcher):
        def run(self, payload):
            (sent,) = payload["sources"].values()
            if sent == b"version 1":  # saved while the worker traces what was sent
                source.write_text("version 2!")
                st = source.stat()
                os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
            return {"outputs": [{"artifact": b"graph of " + sent}]}

    fresh.setattr(remote_exec, "dask_client", lambda executor: FakeClient())
    fresh.setattr(chain_batches, "batcher_for", lambda client: Batcher())

    def trace_here(spec):  # what the chain sent back was of the old bytes: traced here
        from kiln.fsutil import write_bytes_atomic

        write_bytes_atomic(spec["artifact"], b"graph of " + source.read_bytes())

    fetch_or_run(spec, trace_here)
    assert (tmp_path / "out" / "graph.json").read_bytes() == b"graph of version 2!"
    stored = LocalStore(config.local_dir).lookup(stage_key(spec))
    assert stored == {"artifact": b"graph of version 2!"}
