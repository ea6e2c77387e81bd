"""Writing the page (kiln/report/page.py): statuses from the task graph, critical path."""

from __future__ import annotations

import networkx as nx

from kiln.report.page import build_critical_path, mark_out_of_date


def _graph():
    g = nx.DiGraph()
    for inst in ("a.s", "b.s"):
        for stage in ("trace", "visa"):
            stale = inst == "b.s" and stage == "visa"
            reasons = ["file changed: k.py"] if stale else []
            g.add_node(
                f"compile:{inst}.{stage}",
                kind="compile",
                instance=inst,
                stage=stage,
                reasons=reasons,
            )
        g.add_edge(f"compile:{inst}.trace", f"compile:{inst}.visa")
    return g


def test_a_built_instance_that_would_rerun_is_out_of_date():
    entries = [{"row": {"name": n, "status": s}} for n, s in
               (("a.s", "built"), ("b.s", "built"), ("c.s", "failed"))]  # fmt: skip
    mark_out_of_date(entries, _graph())
    assert [e["row"]["status"] for e in entries] == ["built", "out of date", "failed"]


def test_build_critical_path_is_the_longest_chain_of_recorded_tasks():
    records = [
        {"task": "compile:a.s.trace", "start": 0.0, "end": 1.0},
        {"task": "compile:a.s.visa", "start": 1.0, "end": 1.5},
        {"task": "compile:b.s.trace", "start": 0.0, "end": 0.2},
        {"task": "compile:b.s.visa", "start": 0.2, "end": 3.0},
    ]
    assert build_critical_path(_graph(), records) == ["compile:b.s.trace", "compile:b.s.visa"]
    assert build_critical_path(_graph(), []) == []


def test_build_critical_path_of_independent_tasks_is_the_one_that_took_longest():
    # no edges: each task's own time counts, not only that of a task after another
    g = nx.DiGraph()
    for name in ("compile:a.small", "compile:a.large", "compile:a.extra"):
        g.add_node(name, kind="compile", instance=name[8:], stage="compile", reasons=[])
    records = [
        {"task": "compile:a.small", "start": 0.0, "end": 0.0},  # up to date
        {"task": "compile:a.large", "start": 0.0, "end": 0.0},
        {"task": "compile:a.extra", "start": 0.0, "end": 0.043},
    ]
    assert build_critical_path(g, records) == ["compile:a.extra"]
    # a no-op build: nothing took any time, so no chain is marked
    assert build_critical_path(g, [dict(r, end=r["start"]) for r in records]) == []
