"""The process pool of ``kiln compile -n N``: results through files, workers stopped at once,
and a chain that kills its worker failing alone.

The batches here run a stand-in for the chain runner (set before the pool's
workers fork, so they run it too): what is tested is the pool, not the chains.
Each stand-in chain is named for what it does (``_stand_in``).
"""

from __future__ import annotations

import ctypes
import faulthandler
import multiprocessing
import os
import signal
import time
from functools import partial

import pytest

from kiln.driver import BuildInfo, ChainSpec, TraceSpec
from kiln.tasks.chain.instance_spec import ChainJob, batch_from_wire, batch_to_wire
from kiln.tasks.execution import pool
from kiln.tasks.execution.chain_worker import WorkerDied, decode_result, how_it_ended
from kiln.tasks.execution.pool import WORKER_FILE, PoolExecutor, after_break

pytestmark = pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(),
    reason="the stand-in runner reaches the workers by fork",
)


def _large_results(wire: bytes) -> list[bytes]:
    return [wire * 300_000, b"", bytes(range(256))]


def _sleeps(wire: bytes) -> list[bytes]:
    time.sleep(120)
    return []


def _wire(*names: str) -> bytes:
    """A batch of stand-in chains, one per name."""
    build = BuildInfo(kernel="kernels/k.py", shapes="s", compiler="c")
    trace = TraceSpec(module="kernels.k", function="k", bindings=())
    jobs = [
        ChainJob(chain=ChainSpec(name, trace, (), "{}", build), digests=(), root="/p", out_dir="/o")
        for name in names
    ]
    return batch_to_wire(jobs)


def _stand_in(marks: str, wire: bytes) -> list[bytes]:
    """Each chain answers ``name@process``, unless its name says otherwise:
    ``segv`` crashes its process, ``exit7`` exits it, ``slow`` takes 120 s, and
    ``once`` kills the first process that runs it, then builds."""
    results = []
    for job in batch_from_wire(wire):
        name = job.chain.instance
        if name.startswith("segv"):
            faulthandler.disable()  # pytest's, inherited: a page of stack for each crash
            ctypes.string_at(0)
        if name.startswith("exit7"):
            os._exit(7)
        if name.startswith("slow"):
            time.sleep(120)
        if name.startswith("once"):
            try:
                os.close(os.open(os.path.join(marks, name), os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                os.kill(os.getpid(), signal.SIGKILL)  # out of memory, say
        results.append(f"{name}@{multiprocessing.current_process().name}".encode())
    return results


@pytest.fixture
def forked(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_MP_START", "fork")
    monkeypatch.setattr(pool, "run_jobs", partial(_stand_in, str(tmp_path)))
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


def _answers(results: list[bytes]) -> list[str]:
    """Each chain's answer: its name and where it ran, or how its process ended."""
    answers = []
    for data in results:
        if b"@" in data:  # the stand-in's own answer
            answers.append(data.decode())
            continue
        with pytest.raises(WorkerDied) as died:
            decode_result(data)
        answers.append(str(died.value))
    return answers


def test_large_results_come_back_whole_and_leave_no_file(forked, tmp_path):
    forked.setattr(pool, "run_jobs", _large_results)
    executor = PoolExecutor(1, str(tmp_path))
    try:
        results = executor.wait(executor.submit(b"kiln"))
        assert results == [b"kiln" * 300_000, b"", bytes(range(256))]
        left = [n for n in os.listdir(executor.scratch) if n.startswith("results-")]
        assert left == []  # each results file is read once, then removed
    finally:
        executor.close()
    assert not os.path.exists(executor.scratch)


def test_a_chain_that_kills_its_worker_fails_alone_and_the_others_build(forked, tmp_path):
    executor = PoolExecutor(1, str(tmp_path))
    try:
        begun = executor.submit(_wire("a", "segv", "b"))
        queued = executor.submit(_wire("c", "d"))
        answers = _answers(executor.wait(begun))
        # the batch its worker had begun: each chain again, in a process of its own
        assert answers == ["a@kiln-alone", "died of SIGSEGV (signal 11)", "b@kiln-alone"]
        # a batch no worker had begun is no suspect: a fresh pool builds it
        assert [a.split("@")[0] for a in _answers(executor.wait(queued))] == ["c", "d"]
        assert "kiln-alone" not in b"".join(executor.wait(executor.submit(_wire("e")))).decode()
    finally:
        executor.close()


def test_the_warning_is_said_once_and_each_chain_killing_its_process_fails(forked, tmp_path, capfd):
    executor = PoolExecutor(2, str(tmp_path))
    try:
        first = executor.submit(_wire("exit7"))
        second = executor.submit(_wire("segv", "x"))
        assert _answers(executor.wait(first)) == ["exited with code 7 before it answered"]
        assert _answers(executor.wait(second))[0] == "died of SIGSEGV (signal 11)"
    finally:
        executor.close()
    err = capfd.readouterr().err
    assert err.count("warning") == 1 and "a worker of the process pool died" in err, err


def test_a_worker_killed_for_another_reason_costs_its_chains_nothing(forked, tmp_path):
    """Killed once (out of memory, kill -9): built again alone, they answer."""
    executor = PoolExecutor(1, str(tmp_path))
    try:
        results = executor.wait(executor.submit(_wire("a", "once", "b")))
        assert _answers(results) == ["a@kiln-alone", "once@kiln-alone", "b@kiln-alone"]
    finally:
        executor.close()


def test_a_worker_killed_mid_batch_neither_hangs_the_build_nor_loses_the_batch(forked, tmp_path):
    forked.setattr(pool, "run_jobs", _sleeps)
    executor = PoolExecutor(1, str(tmp_path))
    try:
        future = executor.submit(_wire("a"))
        os.kill(_worker_pid(executor), signal.SIGKILL)
        forked.setattr(pool, "run_jobs", partial(_stand_in, str(tmp_path)))  # alone, it builds
        assert _answers(executor.wait(future)) == ["a@kiln-alone"]
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


def test_closing_while_chains_build_alone_stops_them_at_once(forked, tmp_path):
    executor = PoolExecutor(2, str(tmp_path))
    batch = executor.sent[executor.submit(_wire("segv", "slow", "slow2"))]
    deadline = time.monotonic() + 30
    while not batch.future.done() and time.monotonic() < deadline:
        time.sleep(0.02)
    executor._recover()  # what waiting for the batch does first: its chains start alone
    alone = [run.process.pid for run in executor.alone.running.values()]
    assert alone
    started = time.monotonic()
    executor.close()
    assert time.monotonic() - started < 10  # not the 120 s a slow chain takes
    assert all(_gone(pid) for pid in alone)
    assert not os.path.exists(executor.scratch)


def test_after_a_break_what_a_worker_began_goes_alone_the_rest_to_a_fresh_pool():
    assert after_break({0: True, 1: False, 2: True, 3: False}) == ([1, 3], [0, 2])


def test_a_pool_that_broke_before_any_batch_began_sends_every_chain_alone():
    """A worker that dies starting: a fresh pool would break the same way."""
    assert after_break({4: False, 5: False}) == ([], [4, 5])


@pytest.mark.parametrize(
    ("exitcode", "said"),
    [
        (-11, "died of SIGSEGV (signal 11)"),
        (-9, "died of SIGKILL (signal 9)"),
        (7, "exited with code 7 before it answered"),
        (0, "exited with code 0 before it answered"),
    ],
)
def test_how_a_worker_ended_is_said_in_words(exitcode, said):
    assert how_it_ended(exitcode) == said
    assert "out-of-memory" in WorkerDied(-9).hint
