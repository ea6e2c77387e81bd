"""`kiln view` and `kiln graph`: their arguments and what they do."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kiln.errors import KilnError


def add_parsers(sub) -> None:
    """The ``view`` and ``graph`` subcommands, added to kiln's subparsers."""
    v = sub.add_parser("view", help="write one self-contained HTML report of the build")
    v.add_argument("filters", nargs="*", metavar="FILTER")
    v.add_argument("--shapes", metavar="NAME", help="only this shape set")
    v.add_argument(
        "-o", "--output", type=Path, metavar="FILE", help="default <out_dir>/report.html"
    )
    v.add_argument("--open", action="store_true", help="open the report in a web browser")
    v.add_argument(
        "--compare", type=Path, metavar="OTHER_OUT_DIR", help="diff against another build"
    )

    g = sub.add_parser("graph", help="print the task DAG of the selection")
    g.add_argument("filters", nargs="*", metavar="FILTER")
    g.add_argument("--shapes", metavar="NAME", help="only this shape set")
    g.add_argument("--format", choices=["dot", "json", "mermaid"], default="dot")
    g.add_argument(
        "--why", action="store_true", help="mark what `kiln status` would rerun, and why"
    )


def selection(project, filters: list[str], shapes: str | None):
    chosen = project.select(filters or None, None, shapes)
    if not chosen:
        raise KilnError(
            "no kernel instance matches "
            + " ".join(repr(f) for f in filters or ["(all)"])
            + (f" with shape set {shapes!r}" if shapes else ""),
            expected="a substring of a kernel path (package.module.function) or instance name",
            found=" ".join(filters) or "(no filter)",
            notes=["instances: " + ", ".join(i.name for i in project.instances)],
        )
    return chosen


def cmd_graph(args: argparse.Namespace) -> int:
    from kiln.tasks.project import Project
    from kiln.tasks.taskgraph import render, task_graph

    project = Project.find()
    g = task_graph(project, selection(project, args.filters, args.shapes), why=args.why)
    sys.stdout.write(render(g, args.format))
    return 0


def cmd_view(args: argparse.Namespace) -> int:
    from kiln.fsutil import write_bytes_atomic
    from kiln.report.data import build_profile, collect
    from kiln.report.html import render_page
    from kiln.tasks.project import Project

    project = Project.find()
    instances = selection(project, args.filters, args.shapes)
    out = args.output or Path(project.out_dir) / "report.html"
    diff = None
    if args.compare is not None:
        from kiln.report.compare import compare, format_compare

        if not args.compare.is_dir():
            raise KilnError(
                f"--compare: {args.compare} is not a directory",
                expected="the out dir of another build (holding <kernel>/<shapes>/kernel.sched)",
                found=str(args.compare),
            )
        diff = compare(Path(project.out_dir), args.compare)
        sys.stdout.write(format_compare(diff))
    entries = collect(project, instances)
    tasks, critical = _build_views(project, instances)
    profile = build_profile(project)
    page = render_page(
        project.pipeline.project or "kiln",
        entries,
        out,
        tasks=tasks,
        profile=profile,
        profile_critical=_profile_critical(critical, profile),
        diff=diff,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(out, page.encode())
    print(f"kiln: wrote {out} ({len(entries)} kernel instances, {len(page) // 1024} KiB)")
    if args.open:
        import webbrowser

        webbrowser.open(out.resolve().as_uri())
    return 0


def _build_views(project, instances):
    """The task DAG as the page draws it, and the build's critical path (task names)."""
    from kiln.report.layout import drawn_graph
    from kiln.tasks.results import read_profile
    from kiln.tasks.taskgraph import task_graph

    g = task_graph(project, instances, why=True)
    drawn = drawn_graph(
        g,
        lambda n: n + ("\n" + "; ".join(g.nodes[n]["reasons"]) if g.nodes[n]["reasons"] else ""),
        lambda n: "rerun" if g.nodes[n]["reasons"] else g.nodes[n]["stage"],
        centre=False,  # drawn left to right: one row per instance, from the top
    )
    return drawn, build_critical_path(g, read_profile(project.state_dir))


def build_critical_path(g, records: list[dict]) -> list[str]:
    """The chain of dependent tasks of the last build with the longest total duration."""
    import networkx as nx

    took = {r["task"]: max(r["end"] - r["start"], 0.0) for r in records}
    sub = nx.DiGraph(g.subgraph(took))
    if not sub.number_of_nodes():
        return []
    for a, b in sub.edges:
        sub.edges[a, b]["took"] = took[b]
    path = nx.dag_longest_path(sub, weight="took", default_weight=0)
    return path


def _profile_critical(path: list[str], profile: list[dict]) -> list[int]:
    on_path = set(path)
    return [i for i, r in enumerate(profile) if r["task"] in on_path]


def write_profile(project, path: Path) -> None:
    """`kiln compile --profile FILE`: the last build's tasks as Chrome-trace JSON."""
    import json

    from kiln.fsutil import write_bytes_atomic
    from kiln.tasks.results import chrome_trace, read_profile

    path.parent.mkdir(parents=True, exist_ok=True)
    trace = chrome_trace(read_profile(project.state_dir))
    write_bytes_atomic(path, json.dumps(trace, indent=1, sort_keys=True).encode())
    print(f"kiln: wrote the build profile to {path} (open it in Perfetto)")
