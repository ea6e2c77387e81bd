"""Writing the report page: the data of a selection, the build views, one HTML file."""

from __future__ import annotations

from pathlib import Path

from kiln.fsutil import write_bytes_atomic
from kiln.outpaths import write_output
from kiln.report.data import build_profile, collect
from kiln.report.html import render_page


def write_report(project, instances, out: Path, diff: dict | None = None) -> int:
    """Write the report of ``instances`` to ``out`` atomically; returns its size in bytes."""
    page = render_report(project, instances, out, diff)
    write_page(out, page)
    return len(page)


def write_page(out: Path, page: bytes) -> None:
    """Write a rendered page to ``out`` atomically."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    write_output(Path(out), lambda p: write_bytes_atomic(p, page))


def render_report(project, instances, out: Path, diff: dict | None = None) -> bytes:
    """The report page's bytes, as it would be written at ``out``."""
    entries = collect(project, instances)
    g, tasks, critical = _build_views(project, instances)
    mark_out_of_date(entries, g)
    profile = build_profile(project)
    return render_page(
        project.pipeline.project or "kiln",
        entries,
        out,
        tasks=tasks,
        profile=profile,
        profile_critical=_profile_critical(critical, profile),
        diff=diff,
    ).encode()


def _build_views(project, instances):
    """The task DAG (networkx, and as the page draws it) and the build's critical path."""
    from kiln.report.layout import drawn_graph
    from kiln.tasks.checks.results import read_profile
    from kiln.tasks.dag.taskgraph import task_graph

    g = task_graph(project, instances, why=True)
    drawn = drawn_graph(
        g,
        lambda n: n + ("\n" + "; ".join(g.nodes[n]["reasons"]) if g.nodes[n]["reasons"] else ""),
        lambda n: "rerun" if g.nodes[n]["reasons"] else g.nodes[n]["stage"],
        centre=False,  # drawn left to right: one row per instance, from the top
    )
    return g, drawn, build_critical_path(g, read_profile(project.state_dir))


def mark_out_of_date(entries: list[dict], g) -> None:
    """A built instance whose compile tasks `kiln status` would rerun is "out of date"."""
    stale = {
        d["instance"] for _, d in g.nodes(data=True) if d["kind"] == "compile" and d["reasons"]
    }
    for entry in entries:
        row = entry["row"]
        if row["status"] == "built" and row["name"] in stale:
            row["status"] = "out of date"


def build_critical_path(g, records: list[dict]) -> list[str]:
    """The chain of dependent tasks of the last build with the longest total duration
    (each task's own time included); empty when no task took any time."""
    import networkx as nx

    took = {r["task"]: max(r["end"] - r["start"], 0.0) for r in records}
    sub = nx.DiGraph(g.subgraph(took))
    # an edge weighs what its target took; one from a start node into every task counts
    # the first task's own time too, so independent tasks compete by their durations
    start = ("start",)
    sub.add_edges_from([(start, task) for task in sub])
    for a, b in sub.edges:
        sub.edges[a, b]["took"] = took[b]
    return nx.dag_longest_path(sub, weight="took", default_weight=0)[1:]


def _profile_critical(path: list[str], profile: list[dict]) -> list[int]:
    on_path = set(path)
    return [i for i, r in enumerate(profile) if r["task"] in on_path]
