"""AheadRunner: doit's one-thread runner, where a task begun elsewhere runs once that is done."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from doit import cmd_run
from doit.cmd_base import ModuleTaskLoader
from doit.doit_cmd import DoitMain
from doit.runner import Runner as PlainRunner
from kiln.tasks.ahead_runner import AheadRunner, use_ahead_runner


class Hook:
    """``begin(task)``: the Future of each task named in ``ahead`` (settled by the test)."""

    def __init__(self, *ahead: str, raises: bool = False):
        self.calls: list[str] = []
        self.futures: dict[str, Future] = {name: Future() for name in ahead}
        self.raises = raises

    def __call__(self, task) -> Future | None:
        self.calls.append(task.name)
        if self.raises:
            raise RuntimeError("no cluster")
        return self.futures.get(task.name)

    def settle(self, *names: str) -> None:
        for name in names:
            self.futures[name].set_result(None)


def done(*names: str) -> Hook:
    """A hook whose Futures are done before the runner gets them."""
    hook = Hook(*names)
    hook.settle(*names)
    return hook


STUCK_AFTER = 10  # seconds: a run waiting for a task that never comes fails, not hangs


def _stuck(signum, frame):
    raise TimeoutError(f"the run still waited after {STUCK_AFTER} s")


@pytest.fixture
def ahead(monkeypatch) -> Iterator[Callable[[Callable[[object], Future | None]], None]]:
    """Install AheadRunner with a test's hook; doit's runner and the hook are undone after."""
    monkeypatch.setattr(cmd_run, "Runner", cmd_run.Runner)
    monkeypatch.setattr(AheadRunner, "begin", AheadRunner.__dict__["begin"])
    monkeypatch.setattr(AheadRunner, "end", AheadRunner.__dict__["end"])

    def install(hook: Callable[[object], Future | None], end=lambda: None) -> None:
        use_ahead_runner(hook, end)
        assert cmd_run.Runner is AheadRunner

    previous = signal.signal(signal.SIGALRM, _stuck)
    signal.alarm(STUCK_AFTER)
    try:
        yield install
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _act(ran: list[str], name: str, effect) -> bool | None:
    ran.append(name)
    return None if effect is None else effect()


def _creator(ran: list[str], name: str, spec: dict):
    fields = {k: v for k, v in spec.items() if k != "effect"}
    action = (_act, [ran, name, spec.get("effect")])
    return lambda: {"actions": [action], "verbosity": 0, **fields}


def _namespace(ran: list[str], tasks: dict[str, dict]) -> dict:
    """One plain Python-action task per entry; each appends its name to ``ran``, then
    calls its ``effect`` (False: the task fails)."""
    return {f"task_{name}": _creator(ran, name, spec) for name, spec in tasks.items()}


def _run(tmp_path: Path, tasks: dict[str, dict], *args: str) -> tuple[int, list[str]]:
    """doit run in this process, its dep file in ``tmp_path``: (exit code, tasks in run order)."""
    ran: list[str] = []
    argv = ["run", "--db-file", str(tmp_path / "db"), "--backend", "json", *args]
    return DoitMain(ModuleTaskLoader(_namespace(ran, tasks))).run(argv), ran


def test_a_begun_task_runs_once_its_future_is_done_and_before_what_needs_it(
    tmp_path, ahead, capsys
):
    hook = Hook("a")
    ahead(hook)
    tasks = {
        "a": {},
        "b": {"task_dep": ["a"]},
        "c": {"effect": lambda: hook.settle("a")},  # the remote work of `a` ends meanwhile
    }
    rc, ran = _run(tmp_path, tasks, "b", "c")
    assert rc == 0
    assert ran == ["c", "a", "b"]  # doit's plain runner: a, b, c
    assert hook.calls == ["a", "c", "b"]  # `b` is handed out only once `a` has run


def test_a_future_settled_on_another_thread_is_waited_for(tmp_path, ahead, capsys):
    events: list[tuple[str, str]] = []

    def begin(task) -> Future:
        events.append(("begun", task.name))
        future: Future = Future()

        def settle():
            events.append(("settled", task.name))
            future.set_result(None)

        threading.Timer(0.02, settle).start()
        return future

    ahead(begin)
    tasks = {
        "a": {"effect": lambda: events.append(("ran", "a"))},
        "b": {"task_dep": ["a"], "effect": lambda: events.append(("ran", "b"))},
    }
    rc, ran = _run(tmp_path, tasks, "b")
    assert rc == 0 and ran == ["a", "b"]
    assert events == [
        ("begun", "a"),
        ("settled", "a"),
        ("ran", "a"),
        ("begun", "b"),
        ("settled", "b"),
        ("ran", "b"),
    ]


def test_tasks_whose_futures_end_in_reverse_order_all_run_once_in_that_order(
    tmp_path, ahead, capsys
):
    names = [f"t{i}" for i in range(5)]
    hook = Hook(*names)
    ahead(hook)
    tasks: dict[str, dict] = {name: {} for name in names}
    tasks["join"] = {"task_dep": names}
    tasks["go"] = {"effect": lambda: hook.settle(*reversed(names))}
    rc, ran = _run(tmp_path, tasks, "join", "go")
    assert rc == 0
    assert ran == ["go", "t4", "t3", "t2", "t1", "t0", "join"]
    assert sorted(hook.calls) == sorted([*names, "join", "go"])  # each begun once


def test_a_task_the_hook_leaves_runs_at_once_as_under_doits_own_runner(
    tmp_path, ahead, monkeypatch, capsys
):
    tasks = {"a": {}, "b": {"task_dep": ["a"]}, "c": {}, "d": {"task_dep": ["b", "c"]}}
    monkeypatch.setattr(cmd_run, "Runner", PlainRunner)
    (tmp_path / "plain").mkdir()
    rc, plain = _run(tmp_path / "plain", tasks, "d")
    assert rc == 0 and plain == ["c", "a", "b", "d"]  # doit's order for these dependencies
    hook = Hook()
    ahead(hook)
    rc, ran = _run(tmp_path, tasks, "d")
    assert rc == 0 and ran == plain
    assert hook.calls == plain


def test_a_hook_that_raises_runs_the_task_at_once(tmp_path, ahead, capsys):
    hook = Hook("a", raises=True)
    ahead(hook)
    rc, ran = _run(tmp_path, {"a": {}, "b": {"task_dep": ["a"]}, "c": {}}, "b", "c")
    assert rc == 0
    assert ran == ["a", "b", "c"]
    assert hook.calls == ["a", "b", "c"]


def test_a_future_that_ends_in_an_exception_still_runs_its_task(tmp_path, ahead, capsys):
    hook = Hook("a")
    hook.futures["a"].set_exception(RuntimeError("KilledWorker"))
    ahead(hook)
    rc, ran = _run(tmp_path, {"a": {}, "b": {"task_dep": ["a"]}}, "b")
    assert rc == 0 and ran == ["a", "b"]


@pytest.mark.parametrize("keep_going, expected", [(True, ["f", "g"]), (False, ["f"])])
def test_a_task_run_at_once_that_fails_stops_the_rest_unless_continue(
    tmp_path, ahead, capsys, keep_going, expected
):
    ahead(Hook())
    tasks = {"f": {"effect": lambda: False}, "g": {}}
    rc, ran = _run(tmp_path, tasks, *(["--continue"] if keep_going else []), "f", "g")
    assert rc == 1
    assert ran == expected


@pytest.mark.parametrize(
    "keep_going, back, rc_expected, expected",
    [
        (True, ("p", "w"), 2, ["go", "p", "w"]),
        # without --continue nothing more starts; a task whose remote work is back is
        # under way (its results would be lost), one still out is not run
        (False, ("p", "w"), 1, ["go", "p", "w"]),
        (False, ("p",), 1, ["go", "p"]),
    ],
)
def test_a_begun_task_that_fails_stops_the_rest_unless_continue(
    tmp_path, ahead, capsys, keep_going, back, rc_expected, expected
):
    hook = Hook("p", "w")
    ahead(hook)
    tasks = {
        "p": {"effect": lambda: False},
        "w": {},
        "d": {"task_dep": ["p"]},  # never runs: its input failed
        "go": {"effect": lambda: hook.settle(*back)},
    }
    rc, ran = _run(tmp_path, tasks, *(["--continue"] if keep_going else []), "d", "w", "go")
    assert rc == rc_expected  # doit's 2: `d` not run for want of `p`
    assert ran == expected


def _files(tmp_path: Path) -> dict[str, dict]:
    """``a`` makes a.out from src, ``b`` makes b.out from a.out (so it needs ``a``), and
    ``report``, which has no file dependencies, runs after ``b`` every time."""
    src, a_out, b_out = tmp_path / "src", tmp_path / "a.out", tmp_path / "b.out"

    def copy(source: Path, target: Path):
        return lambda: target.write_text(source.read_text() + "+") and None

    return {
        "a": {"file_dep": [str(src)], "targets": [str(a_out)], "effect": copy(src, a_out)},
        "b": {"file_dep": [str(a_out)], "targets": [str(b_out)], "effect": copy(a_out, b_out)},
        "report": {"task_dep": ["b"]},
    }


def test_up_to_date_tasks_are_never_begun(tmp_path, ahead, capsys):
    def build() -> tuple[int, list[str], list[str]]:
        """(rc, tasks run, tasks begun) of one run for ``report``."""
        hook = done("a", "b")
        ahead(hook)
        rc, ran = _run(tmp_path, _files(tmp_path), "report")
        return rc, ran, hook.calls

    (tmp_path / "src").write_text("v1")
    assert build() == (0, ["a", "b", "report"], ["a", "b", "report"])
    assert (tmp_path / "b.out").read_text() == "v1++"
    assert build() == (0, ["report"], ["report"])
    (tmp_path / "src").write_text("v2")
    assert build() == (0, ["a", "b", "report"], ["a", "b", "report"])
    assert (tmp_path / "b.out").read_text() == "v2++"


def test_a_task_with_a_setup_task_is_begun_once_after_its_setup_ran(tmp_path, ahead, capsys):
    hook = done("s", "prep")
    ahead(hook)
    rc, ran = _run(tmp_path, {"s": {"setup": ["prep"]}, "prep": {}}, "s")
    assert rc == 0
    assert ran == ["prep", "s"]
    assert hook.calls == ["prep", "s"]


def test_ctrl_c_in_an_action_ends_the_run_and_keeps_what_finished(tmp_path, ahead, capsys):
    (tmp_path / "src").write_text("v1")

    def interrupt():
        raise KeyboardInterrupt

    src = str(tmp_path / "src")
    tasks = {
        "a": {"file_dep": [src]},
        "b": {"file_dep": [src]},
        "k": {"task_dep": ["a", "b"], "effect": interrupt},
    }
    ended: list[str] = []
    ahead(done("a"), lambda: ended.append("end"))
    ran: list[str] = []
    argv = ["run", "--db-file", str(tmp_path / "db"), "--backend", "json", "k"]
    with pytest.raises(KeyboardInterrupt):
        DoitMain(ModuleTaskLoader(_namespace(ran, tasks))).run(argv)
    assert ran == ["b", "a", "k"]  # `a` waited for its Future; `b` ran meanwhile
    assert ended == ["end"]  # what the hook started is stopped, however the run ends

    tasks["k"] = {"task_dep": ["a", "b"]}
    hook = done("a")
    ahead(hook)
    rc, ran = _run(tmp_path, tasks, "k")
    assert rc == 0
    assert ran == ["k"]  # doit saved `a` and `b` as done
    assert hook.calls == ["k"]


def _press_ctrl_c_once_the_runner_waits() -> None:
    """SIGINT, as a terminal sends it, once the main thread blocks in AheadRunner's loop
    itself (its one wait: nothing of ours is called from there)."""
    main = threading.main_thread().ident
    waiting = AheadRunner._run_all_ready.__code__

    def press():
        deadline = time.monotonic() + STUCK_AFTER / 2
        while sys._current_frames()[main].f_code is not waiting:
            if time.monotonic() > deadline:
                return  # the run then fails on its own watchdog
            time.sleep(0.001)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=press, daemon=True).start()


def test_ctrl_c_while_waiting_for_a_begun_task_ends_the_run_and_keeps_what_finished(
    tmp_path, ahead, request
):
    (tmp_path / "src").write_text("v1")
    src = str(tmp_path / "src")
    tasks: dict[str, dict] = {
        "a": {"file_dep": [src]},  # its chain never comes back: the user presses Ctrl-C
        "b": {"file_dep": [src], "effect": _press_ctrl_c_once_the_runner_waits},
    }
    ahead(Hook("a"))
    # a test run started in the background has SIGINT ignored: Ctrl-C's own handler here
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    ran: list[str] = []
    argv = ["run", "--db-file", str(tmp_path / "db"), "--backend", "json", "a", "b"]
    with pytest.raises(KeyboardInterrupt):
        DoitMain(ModuleTaskLoader(_namespace(ran, tasks))).run(argv)
    assert ran == ["b"]

    hook = done("a")
    ahead(hook)
    rc, ran = _run(tmp_path, tasks, "a", "b")
    assert rc == 0 and ran == ["a"] and hook.calls == ["a"]
