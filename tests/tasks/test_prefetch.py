"""Fetching a clone's chains ahead: side by side, into the local store, never twice."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from kiln.tasks.prefetch import (
    PREFETCH_MIN_LATENCY,
    PREFETCH_MIN_READS,
    Prefetcher,
    chain_id,
    worth_prefetching,
)

from kiln.cache.session import FETCHED, HIT, CacheSession
from kiln.cache.store import sha256
from tests.support.polling import wait_until


class SlowRemote:
    """Answers each action read after ``delay`` seconds; counts reads and their overlap."""

    def __init__(self, entries: dict[str, dict[str, bytes]], delay: float = 0.02):
        self.entries = entries
        self.delay = delay
        self.broken = False
        self.fastest_read = delay
        self.asked: list[str] = []
        self.in_flight = self.most_in_flight = 0
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.gate.set()

    def lookup_verified(self, key: str):
        run = self.lookup_run(key, lambda count, digests: None)
        return (run[0][1], run[0][2]) if run else None

    def lookup_run(self, key: str, next_key):
        """One trip, as RemoteStore.lookup_run: ``key`` and the actions after it."""
        with self.lock:
            self.asked.append(key)  # the trip has started
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        assert self.gate.wait(10)
        time.sleep(self.delay)
        with self.lock:
            self.in_flight -= 1
        run = []
        while key is not None:
            if run:
                with self.lock:
                    self.asked.append(key)
            found = self.entries.get(key)
            if found is None:
                break
            digests = {name: sha256(data) for name, data in found.items()}
            run.append((key, found, digests))
            key = next_key(len(run), digests)
        return run


def key_of(spec: dict, input_digest: str | None = None, graph_digest: str | None = None) -> str:
    return f"{spec['artifact']}<-{input_digest}"


def make_chains(tmp_path: Path, count: int, stages: int = 3) -> list[list[dict]]:
    chains = []
    for c in range(count):
        chain = [
            {"artifact": str(tmp_path / f"k{c}" / f"s{s}"), "dumps": [], "instance": f"k{c}"}
            for s in range(stages)
        ]
        for spec in chain:
            spec["chain"] = chain
        chains.append(chain)
    return chains


def entries_for(chains: list[list[dict]], missing_stage: int | None = None) -> dict:
    """The remote's actions for every stage of ``chains`` (keys as the walk computes them)."""
    entries = {}
    for chain in chains:
        digest = None
        for index, spec in enumerate(chain):
            if index == missing_stage:
                break
            outputs = {"artifact": f"{spec['artifact']} bytes".encode()}
            entries[key_of(spec, digest)] = outputs
            digest = sha256(outputs["artifact"])
    return entries


@pytest.fixture
def session(tmp_path):
    from kiln.cache.config import CacheConfig

    return CacheSession(CacheConfig(local_dir=str(tmp_path / "cache")))


def test_chains_are_fetched_side_by_side_into_the_local_store(tmp_path, session):
    chains = make_chains(tmp_path, 12)
    session.remote = SlowRemote(entries_for(chains))
    prefetcher = Prefetcher(session, chains, key_of, threads=4)
    wait_until(prefetcher.idle)
    assert session.remote.most_in_flight == 4  # four reads waited side by side
    stored = {key for key in entries_for(chains) if session.local.get_action(key)}
    assert stored == session.prefetched == set(entries_for(chains))


def test_every_chain_is_walked_to_its_end_and_found_by_its_task(tmp_path, session):
    chains = make_chains(tmp_path, 6)
    entries = entries_for(chains)
    session.remote = SlowRemote(entries, delay=0.001)
    prefetcher = Prefetcher(session, chains, key_of, threads=3)
    wait_until(prefetcher.idle)
    assert session.prefetched == set(entries)
    assert sorted(session.remote.asked) == sorted(entries)  # each action read once
    for chain in chains:
        prefetcher.claim(chain_id(chain[-1]))  # done: returns at once
    # a task finds its action locally, and counts it as fetched (not a local hit)
    key = key_of(chains[5][0])
    assert session.lookup(key) == (entries[key], FETCHED)
    assert len(session.remote.asked) == len(entries)  # the task did not ask the remote


def test_a_queued_chain_is_taken_back_by_its_task(tmp_path, session):
    chains = make_chains(tmp_path, 5)
    remote = session.remote = SlowRemote(entries_for(chains))
    remote.gate.clear()  # the one thread is stuck on chain 0
    prefetcher = Prefetcher(session, chains, key_of, threads=1)
    wait_until(lambda: remote.asked)
    prefetcher.claim(chain_id(chains[3][0]))  # queued: its task fetches it itself
    remote.gate.set()
    prefetcher.claim(chain_id(chains[0][0]))  # running: waits for the walk to finish
    assert session.local.get_action(key_of(chains[0][2], _digest_of(chains[0][1])))
    wait_until(prefetcher.idle)
    assert {_chain_of(r) for r in remote.asked} == {"k0", "k1", "k2", "k4"}  # never k3


def _chain_of(key: str) -> str:
    return Path(key.split("<-")[0]).parent.name


def _digest_of(spec: dict) -> str:
    return sha256(f"{spec['artifact']} bytes".encode())


def test_a_walk_stops_at_the_first_stage_the_remote_lacks(tmp_path, session):
    chains = make_chains(tmp_path, 1, stages=4)
    entries = entries_for(chains, missing_stage=2)
    session.remote = SlowRemote(entries, delay=0.001)
    prefetcher = Prefetcher(session, chains, key_of, threads=1)
    wait_until(prefetcher.idle)
    assert session.prefetched == set(entries)  # stages 0 and 1
    assert len(session.remote.asked) == 3  # 0, 1, and the miss; never stage 3
    missed = session.remote.asked[-1]
    assert session.missing_remotely == {missed}
    assert session.lookup(missed) == (None, "compiled")  # its task does not ask again
    assert len(session.remote.asked) == 3


def test_built_chains_and_dump_stages_are_not_fetched(tmp_path, session):
    chains = make_chains(tmp_path, 2)
    built = Path(chains[0][-1]["artifact"])
    built.parent.mkdir(parents=True)
    built.write_bytes(b"built before")
    chains[1][1]["dumps"] = [("visa", "out.visa")]  # its own task runs it, always
    session.remote = SlowRemote(entries_for(chains), delay=0.001)
    prefetcher = Prefetcher(session, chains, key_of, threads=2)
    wait_until(prefetcher.idle)
    assert session.prefetched == {key_of(chains[1][0])}


def test_a_stopped_prefetcher_starts_no_further_walk(tmp_path, session):
    chains = make_chains(tmp_path, 20)
    remote = session.remote = SlowRemote(entries_for(chains), delay=0.005)
    remote.gate.clear()
    prefetcher = Prefetcher(session, chains, key_of, threads=2)
    wait_until(lambda: len(remote.asked) == 2)
    stopper = threading.Thread(target=prefetcher.stop, kwargs={"wait": 10.0})
    stopper.start()
    wait_until(lambda: prefetcher.stopped)
    remote.gate.set()
    stopper.join(10)
    assert not stopper.is_alive() and prefetcher.idle()
    assert {_chain_of(r) for r in remote.asked} == {"k0", "k1"}


def test_chains_taken_before_the_start_are_left_to_their_tasks(tmp_path, session):
    chains = make_chains(tmp_path, 3)
    session.remote = SlowRemote(entries_for(chains), delay=0.001)
    prefetcher = Prefetcher(
        session, chains, key_of=key_of, threads=2, taken={chain_id(chains[1][0])}
    )
    wait_until(prefetcher.idle)
    assert {_chain_of(r) for r in session.remote.asked} == {"k0", "k2"}


def test_only_a_slow_remote_is_worth_fetching_ahead(tmp_path):
    from kiln.cache.config import CacheConfig

    class Remote:
        fastest_read = PREFETCH_MIN_LATENCY / 10  # a shared directory on this machine
        reads = PREFETCH_MIN_READS
        broken = False

    session = CacheSession(CacheConfig(local_dir=str(tmp_path / "c"), prefetch_threads=8))
    assert not worth_prefetching(session)  # no remote at all
    session.remote = Remote()
    assert not worth_prefetching(session)
    Remote.fastest_read = PREFETCH_MIN_LATENCY * 10  # S3
    assert worth_prefetching(session)
    Remote.reads = PREFETCH_MIN_READS - 1
    assert not worth_prefetching(session)  # too early to tell
    Remote.reads, Remote.broken = PREFETCH_MIN_READS, True
    assert not worth_prefetching(session)  # down: nothing to fetch
    off = CacheSession(CacheConfig(local_dir=str(tmp_path / "c"), prefetch_threads=0))
    off.remote = Remote()
    assert not worth_prefetching(off)  # KILN_PREFETCH_THREADS=0


def test_a_local_hit_is_still_a_hit(tmp_path, session):
    session.local.store("k", {"artifact": b"x"})
    assert session.lookup("k") == ({"artifact": b"x"}, HIT)
