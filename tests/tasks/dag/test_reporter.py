"""Build progress: a live rich display on a terminal, plain lines otherwise."""

from __future__ import annotations

import io
import json

from doit.exceptions import TaskFailed, UnmetDependency
from doit.task import Task

from kiln.errors import KilnError, Location
from kiln.tasks.chain.task_failure import failure
from kiln.tasks.dag.reporter import KilnReporter, last_run_failures


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def task(name):
    return Task(name, [(lambda: None,)])


def test_plain_output_lists_tasks_and_summary(monkeypatch, capsys):
    monkeypatch.setenv("KILN_MESSAGE_FORMAT", "human")
    out = io.StringIO()
    r = KilnReporter(out, {})
    tasks = {t.name: t for t in (task("compile:a.small.trace"), task("compile:b.small.trace"))}
    r.initialize(tasks, list(tasks))
    r.execute_task(tasks["compile:a.small.trace"])
    r.add_success(tasks["compile:a.small.trace"])
    r.skip_uptodate(tasks["compile:b.small.trace"])
    r.complete_run()
    text = out.getvalue()
    assert ". compile:a.small.trace" in text
    assert "kiln: 2 tasks: 1 ran, 1 up to date, 0 failed" in text
    assert not r.live


def test_terminal_gets_a_live_progress_display(monkeypatch, capsys):
    monkeypatch.setenv("KILN_MESSAGE_FORMAT", "human")
    term = FakeTerminal()
    r = KilnReporter(term, {})
    assert r.live
    tasks = {t.name: t for t in (task("compile:a.small.trace"), task("compile:a.small.visa"))}
    r.initialize(tasks, list(tasks))
    assert r.progress.tasks[0].total == 2
    r.execute_task(tasks["compile:a.small.trace"])
    assert "a.small  trace" in r.progress.tasks[0].description
    r.add_success(tasks["compile:a.small.trace"])
    r.add_failure(tasks["compile:a.small.visa"], TaskFailed("boom"))
    r.complete_run()
    assert r.progress.tasks[0].completed == 2
    shown = capsys.readouterr().out
    assert "FAILED compile:a.small.visa" in shown
    assert "2/2" in shown and "1 ran, 0 up to date, 1 failed" in shown


def test_failures_print_the_diagnostic_without_traceback(monkeypatch, capsys):
    monkeypatch.setenv("KILN_MESSAGE_FORMAT", "human")
    r = KilnReporter(io.StringIO(), {})
    err = KilnError(
        "tile too big",
        Location("k.py", 3, 5, source="x = a @ b"),
        expected="<= 100 bytes",
        found="400 bytes",
    )
    r.add_failure(task("compile:a.small.lir"), failure(err))
    printed = capsys.readouterr().err
    assert "FAILED compile:a.small.lir" in printed
    assert "k.py:3:5: error: tile too big" in printed
    assert "expected: <= 100 bytes" in printed and "Traceback" not in printed


def test_json_format_prints_one_object_per_diagnostic(monkeypatch):
    monkeypatch.setenv("KILN_MESSAGE_FORMAT", "json")
    out = io.StringIO()
    r = KilnReporter(out, {})
    err = KilnError("bad", Location("p.yaml", 2, 1, key_path="kernels.x"))
    r.add_failure(task("compile:x.s.trace"), failure(err))
    r.complete_run()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[0]["message"] == "bad" and lines[0]["line"] == 2
    assert lines[0]["key_path"] == "kernels.x" and lines[0]["task"] == "compile:x.s.trace"
    assert lines[1] == {
        "kind": "summary",
        "ran": 0,
        "up_to_date": 0,
        "failed": 1,
        "not_run": 0,
        "skipped": [],
        "failed_tasks": ["compile:x.s.trace"],
    }


def test_tasks_after_a_failure_are_counted_not_reported_again(monkeypatch, capsys):
    monkeypatch.setenv("KILN_MESSAGE_FORMAT", "human")
    out = io.StringIO()
    r = KilnReporter(out, {})
    err = KilnError("cannot trace", Location("kernels/k.py", 8, 12))
    r.add_failure(task("compile:k.small.trace"), failure(err))
    for stage in ("visa", "lir"):
        r.add_failure(task(f"compile:k.small.{stage}"), UnmetDependency("compile:k.small.trace"))
    r.add_success(task("compile:g.small.trace"))
    # plain `doit compile` runs the group task `compile` too: it has no action to count
    r.add_failure(Task("compile", None, task_dep=["compile:k.small.lir"]), UnmetDependency("x"))
    r.complete_run()
    printed = capsys.readouterr().err
    assert printed.count("FAILED") == 1 and "compile:k.small.visa" not in printed
    assert printed.endswith("kiln: 1 failed:\n  compile:k.small.trace (kernels/k.py:8)\n")
    assert "kiln: 4 tasks: 1 ran, 0 up to date, 1 failed, 2 not run (an input failed)" in (
        out.getvalue()
    )
    failed, not_run = last_run_failures()
    assert list(failed) == ["compile:k.small.trace"]
    assert failed["compile:k.small.trace"]["line"] == 8
    assert not_run == ["compile:k.small.visa", "compile:k.small.lir"]


def test_distinct_test_failures_are_not_summed_up_as_one_empty_error(monkeypatch, capsys):
    """A test task fails with text, no diagnostic: every text is its own failure."""
    monkeypatch.setenv("KILN_MESSAGE_FORMAT", "human")
    r = KilnReporter(io.StringIO(), {})
    for name, err in (("a.small", "0.457"), ("a.large", "0.176"), ("b.default", "0.9")):
        r.add_failure(task(f"test:{name}@sim"), TaskFailed(f"FAIL {name}: max abs err {err}"))
    same = "FAIL x: the same mismatch"
    for name in ("c.one", "c.two"):
        r.add_failure(task(f"test:{name}@sim"), TaskFailed(same.replace("x", name)))
    r.complete_run()
    summary = capsys.readouterr().err.split("kiln: 5 failed")[1]
    assert summary.splitlines() == [
        " (4 distinct errors):",
        "  test:a.small@sim",
        "  test:a.large@sim",
        "  test:b.default@sim",
        "  FAIL c.one: the same mismatch",
        "    2 instances: c.one, c.two",
    ]
