"""Recorded build/test/bench results and the build profile (tasks/checks/results.py, reporter)."""

from __future__ import annotations

from kiln.tasks.checks import results
from kiln.tasks.dag.reporter import assign_workers


def test_failures_are_kept_until_the_failed_task_succeeds(tmp_path):
    diag = {"message": "boom"}
    results.update_failures(tmp_path, {"k.a": {"task": "compile:k.a", "diagnostic": diag}}, set())
    assert results.read_failures(tmp_path)["k.a"]["diagnostic"] == diag
    # another task succeeding does not clear it; the failed one does
    results.update_failures(tmp_path, {}, {"compile:k.b", "test:k.a@sim"})
    assert "k.a" in results.read_failures(tmp_path)
    results.update_failures(tmp_path, {}, {"compile:k.a"})
    assert results.read_failures(tmp_path) == {}


def test_corrupt_result_files_read_as_nothing(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "failures.json").write_text("{not json")
    (tmp_path / "test-sim.json").write_text("[")
    assert results.read_failures(tmp_path) == {}
    assert results.instance_results(tmp_path, "test") == {}


def test_overlapping_tasks_get_different_workers():
    records = [
        {"task": "a", "start": 0.0, "end": 2.0},
        {"task": "b", "start": 1.0, "end": 3.0},
        {"task": "c", "start": 2.0, "end": 4.0},
    ]
    assign_workers(records)
    assert [r["worker"] for r in records] == [0, 1, 0]


def test_a_worker_named_by_the_build_is_kept_and_the_rest_get_lanes_by_overlap():
    records = [
        {"task": "a", "start": 0.0, "end": 2.0, "worker": 1},  # from an -n worker
        {"task": "b", "start": 0.5, "end": 3.0, "worker": 1},
        {"task": "u", "start": 1.0, "end": 1.0},  # found up to date by the parent
        {"task": "v", "start": 1.0, "end": 1.0},
    ]
    assign_workers(records)
    assert [r["worker"] for r in records] == [1, 1, 0, 0]


def test_chrome_trace_has_one_complete_event_per_task():
    records = [
        {"task": "compile:k.a", "start": 10.0, "end": 10.5, "outcome": "ran", "worker": 0},
        {
            "task": "compile:k.b",
            "start": 10.5,
            "end": 10.5,
            "outcome": "up-to-date",
            "worker": 1,
        },
    ]
    trace = results.chrome_trace(records)
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["ts"], e["dur"], e["tid"]) for e in events] == [
        ("compile:k.a", 0.0, 500000.0, 0),
        ("compile:k.b", 500000.0, 0.0, 1),
    ]
    assert {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"} == {
        "worker 0",
        "worker 1",
    }


def test_task_instance_names():
    assert results.task_instance("compile:gemm.small") == ("gemm.small", "compile")
    assert results.task_instance("compile:gemm") is None  # not <kernel>.<shapes>
    assert results.task_instance("test:gemm.small@sim") is None
