"""Chains gathered into Dask tasks: each action gets its own chain's result, or its error."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from kiln.tasks import chain_batches, chain_worker
from kiln.tasks.chain_batches import ChainBatcher, ClusterLost, pack

from tests.support.polling import wait_until


class FakeClient:
    """``submit`` on a thread pool: its futures take ``add_done_callback`` as Dask's do."""

    def __init__(self):
        self.pool = ThreadPoolExecutor(2)
        self.batches: list[list[dict]] = []
        self.lock = threading.Lock()

    def submit(self, fn, batch, **_options):
        with self.lock:
            self.batches.append(batch["chains"])
        return self.pool.submit(fn, batch)


def echo_chain(payload: dict) -> dict:
    if payload.get("fail"):
        raise RuntimeError("worker lost")
    return {"outputs": [{"artifact": payload["name"].encode() + b"|" + payload["sources"]["k.py"]}]}


def test_pack_sends_a_shared_source_tree_once():
    shared = {"k.py": b"def f(): ..." * 100}
    other = {"k.py": b"other"}
    payloads = [
        {"name": "a", "sources": shared},
        {"name": "b", "sources": dict(shared)},  # same bytes object: the same tree
        {"name": "c", "sources": other},
        {"name": "d", "input": b"lir"},
    ]
    batch = pack(payloads)
    assert batch["sources"] == [shared, other]
    assert [c.get("sources_index") for c in batch["chains"]] == [0, 0, 1, None]
    assert all("sources" not in c for c in batch["chains"])
    assert batch["chains"][3] == {"name": "d", "input": b"lir"}


def test_run_chains_gives_each_chain_its_sources_back(monkeypatch):
    monkeypatch.setattr(chain_worker, "run_chain", echo_chain)
    shared, other = {"k.py": b"one"}, {"k.py": b"two"}
    named = (("a", shared), ("b", other), ("c", shared))
    batch = pack([{"name": n, "sources": s} for n, s in named])
    results = chain_worker.run_chains(batch)
    assert [r["outputs"][0]["artifact"] for r in results] == [b"a|one", b"b|two", b"c|one"]


def test_concurrent_actions_share_batches_and_each_get_their_own_result(monkeypatch):
    monkeypatch.setattr(chain_worker, "run_chain", echo_chain)
    client = FakeClient()
    batcher = ChainBatcher(client, batch_size=4, linger=0.05)
    results: dict[str, bytes] = {}
    source = {"k.py": b"src"}

    def action(name: str) -> None:
        result = batcher.submit({"name": name, "sources": source}).result()
        results[name] = result["outputs"][0]["artifact"]

    names = [f"g{i}" for i in range(10)]
    threads = [threading.Thread(target=action, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == {n: f"{n}|src".encode() for n in names}
    sizes = [len(b) for b in client.batches]
    assert sum(sizes) == 10 and max(sizes) <= 4
    assert len(sizes) < 10  # actions arriving together went out together


def test_a_failed_batch_fails_every_chain_in_it(monkeypatch):
    real = chain_worker.run_chains

    def lost(batch: dict) -> list[dict]:  # the Dask task itself fails: its worker died
        if any(c.get("fail") for c in batch["chains"]):
            raise RuntimeError("worker lost")
        return real(batch)

    monkeypatch.setattr(chain_worker, "run_chain", echo_chain)
    monkeypatch.setattr(chain_worker, "run_chains", lost)
    batcher = ChainBatcher(FakeClient(), batch_size=2, linger=0.01)
    with pytest.raises(RuntimeError, match="worker lost"):
        batcher.submit({"name": "x", "fail": True, "sources": {"k.py": b""}}).result()
    # the batcher goes on serving later chains
    later = batcher.submit({"name": "y", "sources": {"k.py": b"ok"}}).result()
    assert later["outputs"][0]["artifact"] == b"y|ok"


def test_closing_fails_every_waiting_chain_and_later_ones(monkeypatch):
    from kiln.tasks.chain_batches import BatcherClosed

    started = threading.Event()

    class StuckClient(FakeClient):
        def submit(self, fn, batch, **_options):
            started.set()
            from concurrent.futures import Future

            return Future()  # never finishes: a cluster that went away

    batcher = ChainBatcher(StuckClient(), batch_size=1, linger=0.0)
    errors: list[BaseException] = []

    def action() -> None:
        try:
            batcher.submit({"name": "x", "sources": {"k.py": b""}}).result()
        except BaseException as exc:
            errors.append(exc)

    waiting = threading.Thread(target=action)
    waiting.start()
    assert started.wait(5)
    batcher.close()
    waiting.join(5)
    assert not waiting.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], BatcherClosed)
    with pytest.raises(BatcherClosed):
        batcher.submit({"name": "y"}).result()


def test_a_chain_that_raises_on_the_worker_fails_alone(monkeypatch):
    def picky(payload: dict) -> dict:
        if payload["name"] == "bad":
            raise ImportError("a kernel module that cannot be imported")
        return echo_chain(payload)

    monkeypatch.setattr(chain_worker, "run_chain", picky)
    names = ("a", "bad", "c")
    results = chain_worker.run_chains(pack([{"name": n, "sources": {"k.py": b"s"}} for n in names]))
    assert results[1] == {"outputs": []}  # rebuilt on the client, with the local diagnostic
    assert [r["outputs"][0]["artifact"] for r in (results[0], results[2])] == [b"a|s", b"c|s"]


def test_a_batch_with_the_wrong_number_of_results_fails_each_chain(monkeypatch):
    monkeypatch.setattr(chain_worker, "run_chains", lambda batch: [])
    batcher = ChainBatcher(FakeClient(), batch_size=1, linger=0.0)
    with pytest.raises(RuntimeError, match="0 results for 1 chains"):
        batcher.submit({"name": "x", "sources": {"k.py": b""}}).result()


class GatedClient(FakeClient):
    """Each batch waits on the worker until the test opens the gate."""

    def __init__(self):
        super().__init__()
        self.gate = threading.Event()

    def submit(self, fn, batch, **options):
        def held(b):
            assert self.gate.wait(10)
            return fn(b)

        return super().submit(held, batch, **options)


def _start(batcher: ChainBatcher, name: str, results: dict) -> threading.Thread:
    def action() -> None:
        results[name] = batcher.submit({"name": name, "sources": {"k.py": b"s"}}).result()

    thread = threading.Thread(target=action)
    thread.start()
    return thread


def _one_batch_out(monkeypatch) -> tuple[GatedClient, ChainBatcher, dict, list]:
    """A batcher allowed one batch out, with that batch (chain "first") held on the worker."""
    monkeypatch.setattr(chain_worker, "run_chain", echo_chain)
    client = GatedClient()
    batcher = ChainBatcher(client, batch_size=4, linger=0.0, ahead=1)
    results: dict = {}
    threads = [_start(batcher, "first", results)]
    wait_until(lambda: len(client.batches) == 1)  # an idle cluster: sent at once, alone
    return client, batcher, results, threads


def test_a_busy_cluster_gets_full_batches_not_a_trickle(monkeypatch):
    client, batcher, results, threads = _one_batch_out(monkeypatch)
    for i in range(4):  # one at a time, while the first batch is out
        threads.append(_start(batcher, f"g{i}", results))
        time.sleep(0.02)
    wait_until(lambda: len(client.batches) == 2)
    client.gate.set()
    for t in threads:
        t.join(10)
    assert [len(b) for b in client.batches] == [1, 4]
    assert sorted(results) == ["first", "g0", "g1", "g2", "g3"]


def test_a_returning_batch_lets_a_partial_one_go(monkeypatch):
    client, batcher, results, threads = _one_batch_out(monkeypatch)
    threads += [_start(batcher, name, results) for name in ("b", "c")]
    wait_until(lambda: batcher.queued() == 2)
    assert len(client.batches) == 1  # two chains wait: the one batch allowed out is out
    client.gate.set()  # it comes back: the two go, without waiting for a full batch
    for t in threads:
        t.join(10)
    assert [len(b) for b in client.batches] == [1, 2]
    assert results["c"]["outputs"][0]["artifact"] == b"c|s"


class CountedClient(GatedClient):
    """A cluster whose scheduler reports ``workers`` workers and a client ``status``."""

    def __init__(self, workers: int, status: str = "running"):
        super().__init__()
        self.workers = workers
        self.status = status

    def scheduler_info(self, n_workers=-1):
        return {"n_workers": self.workers, "workers": {}}


def _watched(monkeypatch, client) -> ChainBatcher:
    monkeypatch.setattr(chain_worker, "run_chain", echo_chain)
    monkeypatch.setattr(chain_batches, "WORKERS_REFRESH", 0.02)
    return ChainBatcher(client, batch_size=1, linger=0.0, ahead=1, lost_after=0.3)


def test_a_cluster_without_workers_is_given_up_and_later_chains_are_refused(monkeypatch):
    client = CountedClient(workers=0)
    batcher = _watched(monkeypatch, client)
    started = time.monotonic()
    with pytest.raises(ClusterLost, match="no workers") as info:
        batcher.submit({"name": "a", "sources": {"k.py": b"s"}}).result()
    assert info.value.no_workers and time.monotonic() - started < 5
    with pytest.raises(ClusterLost):  # at once: no second wait
        batcher.submit({"name": "b", "sources": {"k.py": b"s"}}).result()
    client.gate.set()  # the batch still held on the "worker" ends; nobody waits for it


def test_a_client_that_lost_its_scheduler_is_given_up(monkeypatch):
    client = CountedClient(workers=1, status="connecting")
    batcher = _watched(monkeypatch, client)
    with pytest.raises(ClusterLost) as info:
        batcher.submit({"name": "a", "sources": {"k.py": b"s"}}).result()
    assert not info.value.no_workers
    client.gate.set()


def test_a_slow_worker_keeps_its_chain(monkeypatch):
    client = CountedClient(workers=1)
    batcher = _watched(monkeypatch, client)
    results: dict = {}
    thread = _start(batcher, "slow", results)
    time.sleep(1.0)  # well past lost_after: a live worker is never cut off
    assert batcher.lost is None and "slow" not in results
    client.gate.set()
    thread.join(10)
    assert results["slow"]["outputs"][0]["artifact"] == b"slow|s"
