"""Which compile tasks send their stage chain to Dask before they run, and how the action
then takes that chain's result instead of sending it again."""

from __future__ import annotations

import time
from concurrent.futures import Future
from pathlib import Path

import pytest
from doit.task import Task
from kiln.tasks import cached, chain_batches, chains_ahead, remote_exec
from kiln.tasks.cached import Settled, fetch_or_run, stage_key
from kiln.tasks.compile import _run_stage

from kiln.cache.config import CacheConfig
from kiln.cache.session import session_for
from kiln.cache.store import LocalStore, sha256
from tests.support.remote_state import empty_build_state, lir_schedule_chain

EXECUTOR = {"kind": "dask", "address": "tcp://h:8786", "workers": 1, "source": "--scheduler"}
CHAIN_OUTPUTS = {"outputs": [{"artifact": b"lir bytes"}, {"artifact": b"sched bytes"}]}


class FakeClient:
    status = "running"

    def close(self, timeout=None):
        pass


class CountingBatcher:
    """A batcher whose chains come back at once with CHAIN_OUTPUTS; it counts them."""

    def __init__(self):
        self.payloads: list[dict] = []

    def submit(self, payload: dict) -> Future:
        self.payloads.append(payload)
        slot: Future = Future()
        slot.set_result(CHAIN_OUTPUTS)
        return slot


@pytest.fixture
def fresh(monkeypatch):
    """A Dask build's per-process state, empty, undone after."""
    empty_build_state(monkeypatch)
    return monkeypatch


class SendAhead:
    """``send_ahead``, recorded: the specs it is given, and a Future (not settled) for each."""

    def __init__(self):
        self.specs: list[dict] = []
        self.futures: list[Future] = []
        self.starts: list[bool] = []  # whether each send may start a cluster

    def __call__(self, spec: dict, *, start: bool = True) -> Future:
        self.specs.append(spec)
        self.starts.append(start)
        self.futures.append(Future())
        return self.futures[-1]


@pytest.fixture
def sent(fresh) -> SendAhead:
    send_ahead = SendAhead()
    fresh.setattr(remote_exec, "send_ahead", send_ahead)
    return send_ahead


def chain(tmp_path: Path, remote: str | None = None) -> tuple[dict, dict]:
    """The lir and schedule stages of one instance under the dask executor, from a vISA file."""
    return lir_schedule_chain(tmp_path, str(tmp_path / "store"), EXECUTOR, remote)


def compile_task(spec: dict) -> Task:
    """A compile task as tasks/compile.py makes it: one ``_run_stage`` action on ``spec``."""
    return Task(f"compile:{spec['instance']}.{spec['stage']}", [(_run_stage, [spec])])


def test_a_stage_the_cache_lacks_sends_its_chain_ahead(tmp_path, sent):
    lir, _ = chain(tmp_path)
    ready = chains_ahead.begin_task(compile_task(lir))
    assert len(sent.specs) == 1 and sent.specs[0] is lir
    assert ready is sent.futures[0]


def test_a_task_that_is_not_a_compile_stage_runs_at_once(tmp_path, sent):
    lir, _ = chain(tmp_path)

    def report(spec):
        pass

    assert chains_ahead.begin_task(Task("report", [(report, [lir])])) is None
    assert chains_ahead.begin_task(Task("compile:k.small.lir", ["true"])) is None
    assert sent.specs == []


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda spec: spec.pop("executor"), id="no-executor"),
        pytest.param(lambda spec: spec.update(cache=None), id="no-cache"),
        pytest.param(lambda spec: spec["cache"].update(enabled=False), id="cache-disabled"),
        pytest.param(lambda spec: spec.update(dumps=[("ir", "out/dumps/lir.msgpack")]), id="dumps"),
    ],
)
def test_a_stage_built_here_is_never_sent_ahead(tmp_path, sent, change):
    lir, _ = chain(tmp_path)
    change(lir)
    assert chains_ahead.begin_task(compile_task(lir)) is None
    assert sent.specs == []


def test_a_stage_its_chains_walk_wrote_is_never_sent_ahead(tmp_path, sent):
    lir, sched = chain(tmp_path)
    (tmp_path / "out").mkdir()
    Path(lir["artifact"]).write_bytes(b"lir bytes")
    settled = Settled(sched, "hit", (1, 2, 3), ())
    other = dict(sched)  # the same artifact, another spec (tasks loaded again): not settled
    cached._settled[sched["artifact"]] = settled
    assert chains_ahead.begin_task(compile_task(sched)) is None
    assert chains_ahead.begin_task(compile_task(other)) is sent.futures[0]
    assert sent.specs == [other]


def test_a_stage_the_local_store_holds_is_never_sent_ahead(tmp_path, sent):
    lir, sched = chain(tmp_path)
    LocalStore(tmp_path / "store").store(stage_key(lir), {"artifact": b"lir bytes"})
    assert chains_ahead.begin_task(compile_task(lir)) is None
    # the schedule stage's key is of its input's bytes, which are not stored
    (tmp_path / "out").mkdir()
    Path(lir["artifact"]).write_bytes(b"lir bytes")
    assert chains_ahead.begin_task(compile_task(sched)) is sent.futures[0]
    assert sent.specs == [sched]


def test_a_stage_whose_input_changed_since_it_was_stored_is_sent(tmp_path, sent):
    lir, _ = chain(tmp_path)
    LocalStore(tmp_path / "store").store(stage_key(lir), {"artifact": b"lir bytes"})
    Path(lir["input"]).write_bytes(b"visa text, edited")
    assert chains_ahead.begin_task(compile_task(lir)) is sent.futures[0]
    assert sent.specs == [lir]


def test_a_problem_while_beginning_runs_the_task_at_once(tmp_path, fresh):
    lir, _ = chain(tmp_path)

    def send_ahead(spec):
        raise RuntimeError("the scheduler went away")

    fresh.setattr(remote_exec, "send_ahead", send_ahead)
    assert chains_ahead.begin_task(compile_task(lir)) is None
    Path(lir["input"]).unlink()  # its key cannot be made: the action reports it
    fresh.setattr(remote_exec, "send_ahead", lambda spec: pytest.fail("sent"))
    assert chains_ahead.begin_task(compile_task(lir)) is None


def test_a_chain_not_sent_runs_its_task_at_once(tmp_path, fresh):
    lir, _ = chain(tmp_path)
    fresh.setattr(remote_exec, "send_ahead", lambda spec: None)  # no cluster
    assert chains_ahead.begin_task(compile_task(lir)) is None


def test_with_a_remote_cache_a_chain_it_holds_is_fetched_not_sent(tmp_path, sent):
    remote = str(tmp_path / "remote")
    lir, _ = chain(tmp_path, remote=remote)
    seeding = CacheConfig(local_dir=str(tmp_path / "elsewhere"), remote=remote)
    session_for(seeding).store(stage_key(lir), {"artifact": b"lir bytes"})
    ready = chains_ahead.begin(lir)
    assert ready.result(timeout=10) is None
    assert sent.specs == []
    assert LocalStore(tmp_path / "store").lookup(stage_key(lir)) == {"artifact": b"lir bytes"}


def test_with_a_remote_cache_a_chain_it_lacks_is_sent_and_waited_for(tmp_path, sent):
    lir, _ = chain(tmp_path, remote=str(tmp_path / "remote"))
    ready = chains_ahead.begin(lir)
    deadline = time.monotonic() + 10
    while not sent.specs and time.monotonic() < deadline:  # looked up on a pool thread
        time.sleep(0.005)
    assert sent.specs == [lir]
    assert sent.starts == [False]  # a lookup thread never starts a cluster
    time.sleep(0.02)
    assert not ready.done()  # the chain is still out
    sent.futures[0].set_result(CHAIN_OUTPUTS)
    assert ready.result(timeout=10) is None


def test_an_action_takes_the_chain_sent_ahead_instead_of_sending_it_again(tmp_path, fresh):
    lir, sched = chain(tmp_path)
    batcher = CountingBatcher()
    fresh.setattr(chain_batches, "batcher_for", lambda client: batcher)
    fresh.setitem(remote_exec._clients, remote_exec._key(EXECUTOR), FakeClient())

    def no_second_client(executor):
        raise AssertionError("the chain sent ahead was sent again")

    fresh.setattr(remote_exec, "dask_client", no_second_client)
    ready = remote_exec.send_ahead(lir)
    assert ready is not None and ready.done()
    session = session_for(CacheConfig(**lir["cache"]))
    produced = remote_exec.run_chain_remotely(lir, session)
    assert len(batcher.payloads) == 1
    lir_key = stage_key(lir)
    sched_key = stage_key(sched, input_digest=sha256(b"lir bytes"))
    assert produced == {
        lir_key: {"artifact": b"lir bytes"},
        sched_key: {"artifact": b"sched bytes"},
    }
    store = LocalStore(tmp_path / "store")
    assert store.lookup(lir_key) == {"artifact": b"lir bytes"}
    assert store.lookup(sched_key) == {"artifact": b"sched bytes"}
    assert remote_exec._ahead == {}  # taken


def test_a_chain_sent_ahead_for_another_spec_is_sent_again(tmp_path, fresh):
    lir, _ = chain(tmp_path)
    batcher = CountingBatcher()
    fresh.setattr(chain_batches, "batcher_for", lambda client: batcher)
    fresh.setitem(remote_exec._clients, remote_exec._key(EXECUTOR), FakeClient())
    remote_exec.send_ahead(lir)
    rebuilt = dict(lir)  # the same artifact, from another load of the tasks
    rebuilt["chain"] = [rebuilt, lir["chain"][1]]
    produced = remote_exec.run_chain_remotely(rebuilt, session_for(CacheConfig(**lir["cache"])))
    assert len(batcher.payloads) == 2
    assert stage_key(lir) in produced
    assert remote_exec._ahead == {}


def test_a_compile_task_begun_ahead_writes_its_chain_from_one_dask_build(tmp_path, fresh):
    """begin_task sends the chain; the stage's action then writes both artifacts from it."""
    lir, sched = chain(tmp_path)
    batcher = CountingBatcher()
    fresh.setattr(chain_batches, "batcher_for", lambda client: batcher)
    fresh.setitem(remote_exec._clients, remote_exec._key(EXECUTOR), FakeClient())
    ready = chains_ahead.begin_task(compile_task(lir))
    assert ready is not None and ready.done()

    def must_not_run(spec):
        raise AssertionError("the chain was built on the cluster")

    assert fetch_or_run(lir, must_not_run) == "compiled"
    assert len(batcher.payloads) == 1
    assert Path(lir["artifact"]).read_bytes() == b"lir bytes"
    assert Path(sched["artifact"]).read_bytes() == b"sched bytes"
    # the schedule task is now settled by the walk: it is not begun
    assert chains_ahead.begin_task(compile_task(sched)) is None
    assert len(batcher.payloads) == 1


def test_a_run_that_ends_drops_its_waiting_lookups_and_sends_nothing_more(tmp_path, fresh, sent):
    """Ctrl-C mid-build: the lookups not started are dropped and those under way send
    nothing (a send could start the cluster the build just closed)."""
    lir, _ = chain(tmp_path, remote=str(tmp_path / "remote"))
    session = session_for(CacheConfig(**lir["cache"]))
    looked_up: list[str] = []

    def slow_fetch_run(key, next_key, *, ahead=False):
        looked_up.append(key)
        time.sleep(0.2)
        return []

    fresh.setattr(session, "fetch_run", slow_fetch_run)
    specs = [dict(lir, artifact=str(tmp_path / f"out{i}" / "kernel.lir")) for i in range(40)]
    for spec in specs:
        spec["chain"] = [spec]
        chains_ahead.begin(spec)
    time.sleep(0.05)  # the first lookups are under way
    started = time.monotonic()
    chains_ahead.end_chains_ahead()
    assert time.monotonic() - started < 0.1  # nothing waited for
    time.sleep(0.4)  # those under way finish
    assert 0 < len(looked_up) <= chains_ahead.LOOKUP_THREADS
    assert sent.specs == []


def test_a_lookup_thread_never_starts_a_cluster(fresh):
    """Only a client connected (or being connected by prestart) this build is used."""
    calls: list[dict] = []
    fresh.setattr(remote_exec, "_connect", lambda executor: calls.append(executor) or "client")
    assert remote_exec.connected_client(EXECUTOR, start=False) is None
    assert calls == []
    assert remote_exec.connected_client(EXECUTOR) == "client"
    fresh.setattr(remote_exec, "_prestarted", {remote_exec._key(EXECUTOR)})
    assert remote_exec.connected_client(EXECUTOR, start=False) == "client"


def test_a_lookup_thread_may_start_the_cluster_once_the_build_allows_it(fresh):
    """A later build starts its cluster on demand: lookups may then start it, until it closes."""
    calls: list[dict] = []
    fresh.setattr(remote_exec, "_connect", lambda executor: calls.append(executor) or "client")
    remote_exec.allow_start(EXECUTOR)
    assert remote_exec.connected_client(EXECUTOR, start=False) == "client"
    assert calls == [EXECUTOR]
    remote_exec.close_clients()  # the build is over: a late lookup starts nothing
    assert remote_exec.connected_client(EXECUTOR, start=False) is None
    assert calls == [EXECUTOR]
