"""The queue-ahead `-n` runner: doit's order and results, with jobs queued before workers ask."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest
from doit import cmd_run
from doit.cmd_base import ModuleTaskLoader
from doit.doit_cmd import DoitMain
from doit.runner import JobHold
from kiln.tasks.queue_ahead import (
    JOBS_AHEAD_PER_WORKER,
    JobFeeder,
    QueueAheadRunner,
    use_queue_ahead_runner,
)

CHAINS, STEPS = 30, 3


@pytest.fixture
def queue_ahead(monkeypatch):
    monkeypatch.setattr(cmd_run, "MRunner", cmd_run.MRunner)  # restored after the test
    use_queue_ahead_runner()
    assert cmd_run.MRunner is QueueAheadRunner


def _log(path: str, line: str) -> None:
    # one write of a short line to an O_APPEND file: lines from both workers never interleave
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def _step(log: str, name: str, fail: bool = False):
    _log(log, f"start {name} {os.getpid()}")
    if fail:
        return False
    # a task takes some time, as a real one does: with instant tasks the build process
    # could start dozens of its own while the failed task's worker waited for a core,
    # before the failure's result was even read (a loaded 2-core machine did)
    time.sleep(0.005)
    _log(log, f"end {name}")
    return True


def _namespace(log: Path, failing: str = "") -> dict:
    """CHAINS chains of STEPS tasks each, and a task that needs the last step of every chain."""

    def task_step():
        for chain in range(CHAINS):
            for step in range(STEPS):
                name = f"c{chain}s{step}"
                yield {
                    "name": name,
                    "actions": [(_step, [str(log), name, name == failing])],
                    "task_dep": [f"step:c{chain}s{step - 1}"] if step else [],
                    "verbosity": 0,
                }

    def task_join():
        return {
            "actions": [(_step, [str(log), "join"])],
            "task_dep": [f"step:c{chain}s{STEPS - 1}" for chain in range(CHAINS)],
            "verbosity": 0,
        }

    return {"task_step": task_step, "task_join": task_join}


def _run(tmp_path: Path, *args: str, failing: str = "") -> tuple[int, list[str]]:
    log = tmp_path / "log.txt"
    argv = ["run", "--db-file", str(tmp_path / "db"), "--backend", "json", *args, "join"]
    rc = DoitMain(ModuleTaskLoader(_namespace(log, failing))).run(argv)
    return rc, log.read_text().splitlines() if log.exists() else []


def test_every_task_runs_once_after_its_dependencies(tmp_path, queue_ahead, capsys):
    rc, lines = _run(tmp_path, "-n", "2")
    assert rc == 0
    starts = [line.split()[1] for line in lines if line.startswith("start")]
    assert sorted(starts) == sorted(
        [f"c{c}s{s}" for c in range(CHAINS) for s in range(STEPS)] + ["join"]
    )
    ended: set[str] = set()
    for line in lines:
        word, name = line.split()[:2]
        if word == "end":
            ended.add(name)
            continue
        if name == "join":
            assert ended >= {f"c{c}s{STEPS - 1}" for c in range(CHAINS)}
        else:
            chain, step = name[1:].split("s")
            if int(step):
                assert f"c{chain}s{int(step) - 1}" in ended, f"{name} started before its input"
    # -n 2: the build process and one worker process share the tasks
    runners = {line.split()[2] for line in lines if line.startswith("start")}
    assert runners == {str(os.getpid()), *runners} and len(runners) == 2


def test_a_failed_task_stops_only_what_needs_it(tmp_path, queue_ahead, capsys):
    rc, lines = _run(tmp_path, "-n", "2", "--continue", failing="c3s1")
    assert rc == 2  # doit: a failure, and tasks left unrun for want of their input
    starts = {line.split()[1] for line in lines if line.startswith("start")}
    assert "c3s1" in starts
    assert "c3s2" not in starts and "join" not in starts  # they need the failed task
    assert {f"c{c}s{STEPS - 1}" for c in range(CHAINS) if c != 3} <= starts


def test_without_continue_no_new_task_starts_after_a_failure(tmp_path, queue_ahead, capsys):
    rc, lines = _run(tmp_path, "-n", "2", failing="c0s0")
    assert rc == 1
    starts = [line.split()[1] for line in lines if line.startswith("start")]
    # still run: jobs queued when c0s0 failed, and one for each result read before its
    # result (at most one queue's worth each); nothing after that
    limit = 2 * (1 + JOBS_AHEAD_PER_WORKER)
    assert len(starts) - starts.index("c0s0") - 1 <= 2 * limit
    assert len(starts) < CHAINS * STEPS and "join" not in starts


def test_a_second_run_sends_what_doit_finds_out_of_date(tmp_path, queue_ahead, capsys):
    assert _run(tmp_path, "-n", "2")[0] == 0
    (tmp_path / "log.txt").unlink()
    rc, lines = _run(tmp_path, "-n", "2")
    # tasks with no dependencies to check are never up to date: doit runs them all again
    assert rc == 0 and len([x for x in lines if x.startswith("start")]) == CHAINS * STEPS + 1


def test_every_task_of_a_chain_runs_in_the_worker_that_started_it(
    tmp_path, queue_ahead, monkeypatch, capsys
):
    import kiln.tasks.queue_ahead as queue_ahead_module

    # "step:c4s1" belongs to chain "c4" (Kiln's own compile tasks: their kernel instance)
    def chain_of(name: str) -> str | None:
        group, _, task = name.partition(":")
        return task.partition("s")[0] if group == "step" else None

    monkeypatch.setattr(queue_ahead_module, "chain_of", chain_of)
    rc, lines = _run(tmp_path, "-n", "2")
    assert rc == 0
    workers_of: dict[str, set[str]] = {}
    for line in lines:
        if line.startswith("start c"):
            name, pid = line.split()[1:3]
            workers_of.setdefault(name.partition("s")[0], set()).add(pid)
    assert len(workers_of) == CHAINS and all(len(p) == 1 for p in workers_of.values())
    assert len(set().union(*workers_of.values())) == 2  # yet both workers had chains


class _Job:
    def __init__(self, name):
        self.name = name

    def __eq__(self, other):
        return self.name == getattr(other, "name", other)

    def __repr__(self):
        return self.name


class _FakeRunner:
    """Stands in for doit's runner: hands out a scripted list of jobs."""

    def __init__(self, script):
        self.script = [_Job(x) if isinstance(x, str) else x for x in script]
        self.completed_seen: list = []
        self.free_proc = 0

    def get_next_job(self, completed):
        self.completed_seen.append(completed)
        return self.script.pop(0) if self.script else None


class _ListQueue(list):
    put = list.append


def test_feeder_fills_to_its_limit_and_no_further():
    runner = _FakeRunner(["a", "b", "c", "d", "e"])
    queue = _ListQueue()
    feeder = JobFeeder(runner, [queue], limit=3)
    feeder.fill(None)
    assert queue == ["a", "b", "c"] and feeder.queued == 3 and not feeder.exhausted
    feeder.done("a")
    feeder.fill("node-a")
    assert queue == ["a", "b", "c", "d"] and feeder.queued == 3
    assert runner.completed_seen == [None, None, None, "node-a"]


def test_feeder_tells_the_dispatcher_of_a_finished_node_once():
    runner = _FakeRunner(["a", "b"])
    feeder = JobFeeder(runner, [_ListQueue()], limit=4)
    feeder.fill("done")
    assert runner.completed_seen == ["done", None, None]  # the last None: nothing left
    assert feeder.exhausted and feeder.queued == 2


def test_feeder_stops_at_a_hold_and_resumes_on_the_next_result():
    runner = _FakeRunner(["a", JobHold(), "b"])
    queue = _ListQueue()
    feeder = JobFeeder(runner, [queue], limit=4)
    feeder.fill(None)
    assert queue == ["a"] and not feeder.exhausted
    feeder.done("a")
    feeder.fill("node-a")
    assert queue == ["a", "b"] and feeder.exhausted


def test_feeder_reports_a_hold_with_nothing_running():
    feeder = JobFeeder(_FakeRunner([JobHold()]), [_ListQueue()], limit=2)
    with pytest.raises(RuntimeError, match="cycle"):
        feeder.fill(None)


def test_feeder_sends_a_chain_to_its_first_worker_and_new_chains_to_the_least_busy():
    queues = [_ListQueue(), _ListQueue()]
    script = ["x.0", "y.0", "z.0", "x.1", "other", "x.2"]
    feeder = JobFeeder(
        _FakeRunner(script),
        queues,
        limit=3,
        group_of=lambda name: name.split(".")[0] if "." in name else None,
    )
    feeder.fill(None)
    assert queues == [["x.0", "z.0"], ["y.0"]]
    feeder.done("y.0")
    feeder.fill("node-y.0")  # x.1 follows x to worker 0, however busy worker 0 is
    assert queues == [["x.0", "z.0", "x.1"], ["y.0"]] and feeder.outstanding == [3, 0]
    feeder.done("x.0")
    feeder.done("z.0")
    feeder.fill("node-z.0")  # no chain: the least busy worker
    assert queues[1] == ["y.0", "other"] and queues[0][-1] == "x.2"
    assert feeder.outstanding == [2, 1] and feeder.placed == {"x.1": 0, "other": 1, "x.2": 0}
    assert set(feeder.owner) == {"x", "y", "z"}  # a job of no chain binds no worker


def _copy(src: str, dst: str) -> None:
    Path(dst).write_text(Path(src).read_text())


def test_no_worker_starts_when_everything_is_up_to_date(tmp_path, queue_ahead, monkeypatch):
    # a worker is forked only for work: a no-op build never imports the stages
    src = tmp_path / "src.txt"
    src.write_text("x")
    namespace = {
        "task_copy": lambda: {
            "actions": [(_copy, [str(src), str(tmp_path / "out.txt")])],
            "file_dep": [str(src)],
            "targets": [str(tmp_path / "out.txt")],
        }
    }
    argv = ["run", "--db-file", str(tmp_path / "db"), "--backend", "json", "-n", "2"]
    assert DoitMain(ModuleTaskLoader(namespace)).run(argv) == 0
    assert (tmp_path / "out.txt").read_text() == "x"

    def no_worker(*args, **kwargs):
        raise AssertionError("a worker was started for an up-to-date build")

    monkeypatch.setattr(QueueAheadRunner, "Child", staticmethod(no_worker))
    assert DoitMain(ModuleTaskLoader(namespace)).run(argv) == 0


def _leaf(log: str, name: str) -> None:
    _log(log, f"start {name} {os.getpid()}")
    time.sleep(0.05)  # long enough that one worker cannot take every leaf alone


def test_every_worker_starts_even_when_one_task_is_ready_at_first(tmp_path, queue_ahead):
    # a single root: only one job can be queued at the start, yet 8 leaves follow it
    log = str(tmp_path / "log.txt")
    namespace = {
        "task_root": lambda: {"actions": [(_log, [log, f"start root {0}"])], "verbosity": 0},
        "task_leaf": lambda: (
            {
                "name": f"l{i}",
                "actions": [(_leaf, [log, f"l{i}"])],
                "task_dep": ["root"],
                "verbosity": 0,
            }
            for i in range(8)
        ),
    }
    argv = ["run", "--db-file", str(tmp_path / "db"), "--backend", "json", "-n", "2", "leaf"]
    assert DoitMain(ModuleTaskLoader(namespace)).run(argv) == 0
    lines = Path(log).read_text().splitlines()
    leaf_workers = {line.split()[2] for line in lines if line.startswith("start l")}
    assert len(leaf_workers) == 2, lines


def _big(log: str, name: str) -> dict:
    _log(log, f"start {name} {os.getpid()}")
    return {"blob": "y" * 300_000}  # a result far larger than any pipe buffer


def test_jobs_and_results_larger_than_a_pipe_buffer_all_get_through(tmp_path, queue_ahead):
    # each job carries 100 KB (its doc), each result 300 KB: no writer may block for good
    log = str(tmp_path / "log.txt")
    namespace = {
        "task_big": lambda: (
            {
                "name": f"b{i}",
                "doc": "x" * 100_000,
                "actions": [(_big, [log, f"b{i}"])],
                "verbosity": 0,
            }
            for i in range(12)
        )
    }
    argv = ["run", "--db-file", str(tmp_path / "db"), "--backend", "json", "-n", "2", "big"]
    assert DoitMain(ModuleTaskLoader(namespace)).run(argv) == 0
    starts = [line.split()[1] for line in Path(log).read_text().splitlines()]
    assert sorted(starts) == sorted(f"b{i}" for i in range(12))


def _die(log: str, name: str) -> None:
    _log(log, f"start {name} {os.getpid()}")
    if multiprocessing.parent_process() is None:  # never the test's own process
        raise AssertionError("the task meant to kill its worker ran in the build process")
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_worker_killed_under_its_task_fails_that_task_and_the_build_goes_on(
    tmp_path, queue_ahead, monkeypatch
):
    import kiln.tasks.queue_ahead as queue_ahead_module

    # every job to the worker: the build process (this test's) runs none itself
    monkeypatch.setattr(queue_ahead_module, "BUILD_PROCESS_HANDICAP", 10**9)
    namespace = _namespace(tmp_path / "log.txt")
    steps = namespace["task_step"]

    def task_step():
        for task in steps():
            if task["name"] == "c2s1":  # its worker dies in the middle of it
                task["actions"] = [(_die, [str(tmp_path / "log.txt"), "c2s1"])]
            yield task

    namespace["task_step"] = task_step
    argv = ["run", "--db-file", str(tmp_path / "db"), "--backend", "json", "-n", "2"]
    report = tmp_path / "report.txt"
    rc = DoitMain(ModuleTaskLoader(namespace)).run(
        [*argv, "--continue", "--output-file", str(report), "join"]
    )
    assert rc == 2  # a failure, and the tasks that needed it not run
    lines = (tmp_path / "log.txt").read_text().splitlines()
    ended = {line.split()[1] for line in lines if line.startswith("end")}
    # every other chain was built, c2 stopped at the task whose worker died
    assert ended == {f"c{c}s{s}" for c in range(CHAINS) for s in range(STEPS)} - {
        "c2s1",
        "c2s2",
    }
    assert "the worker process running this task died (killed by signal 9)" in report.read_text()
