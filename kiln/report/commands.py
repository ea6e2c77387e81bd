"""`kiln view` and `kiln graph`: their arguments and what they do."""

from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext
from pathlib import Path

from kiln.errors import KilnError
from kiln.outpaths import check_output, output_path, writing


def add_parsers(sub) -> None:
    """The ``view`` and ``graph`` subcommands, added to kiln's subparsers."""
    v = sub.add_parser("view", help="write one self-contained HTML report of the build")
    v.add_argument("filters", nargs="*", metavar="FILTER", help="only these kernels (default all)")
    v.add_argument("--shapes", metavar="NAME", help="only this shape set")
    v.add_argument(
        "-o", "--output", type=output_path, metavar="FILE", help="default <out_dir>/report.html"
    )
    v.add_argument("--open", action="store_true", help="open the report in a web browser")
    v.add_argument(
        "--compare", type=Path, metavar="OTHER_OUT_DIR", help="diff against another build"
    )

    g = sub.add_parser("graph", help="print the task DAG of the selection")
    g.add_argument("filters", nargs="*", metavar="FILTER", help="only these kernels (default all)")
    g.add_argument("--shapes", metavar="NAME", help="only this shape set")
    g.add_argument(
        "--format",
        choices=["dot", "json", "mermaid"],
        default="dot",
        help="Graphviz dot (default), JSON, or a Mermaid diagram",
    )
    g.add_argument(
        "--why", action="store_true", help="mark what `kiln status` would rerun, and why"
    )


def selection(project, filters: list[str], shapes: str | None, command: str):
    from kiln.tasks.model.selection import select

    return select(project, filters, shape_set=shapes, command=command).instances


def cmd_graph(args: argparse.Namespace) -> int:
    from kiln.tasks.chain.manifest import building_nothing
    from kiln.tasks.dag.taskgraph import render, task_graph

    project = _project()
    with building_nothing():
        instances = selection(project, args.filters, args.shapes, "graph")
        g = task_graph(project, instances, why=args.why)
    sys.stdout.write(render(g, args.format))
    return 0


def cmd_view(args: argparse.Namespace) -> int:
    from kiln.tasks.chain.manifest import building_nothing

    with building_nothing():
        return _view(args)


def _view(args: argparse.Namespace) -> int:
    from kiln.report.page import write_report

    if args.output == Path("-"):  # the page on stdout, for a pipe; messages on stderr
        return _view_to_stdout(args)
    if args.output is not None:
        check_output("-o/--output", args.output)
    project = _project()
    instances = selection(project, args.filters, args.shapes, "view")
    out = args.output or Path(project.out_dir) / "report.html"
    diff = None
    if args.compare is not None:
        from kiln.report.compare import compare, format_compare

        _check_compare_dir(project, args.compare)
        declared = {inst.name for inst in instances}
        diff = compare(
            Path(project.out_dir), args.compare, declared, _selected_names(args, instances)
        )
        sys.stdout.write(format_compare(diff))
    with writing("-o/--output", out) if args.output is not None else nullcontext():
        size = write_report(project, instances, out, diff)
    print(f"kiln: wrote {out} ({len(instances)} kernel instances, {size // 1024} KiB)")
    if args.open:
        open_in_browser(out)
    return 0


def open_in_browser(page: Path) -> bool:
    """Open ``page`` in a web browser; without one (a server, a container), say where it is.

    The report was written either way, so a missing browser is a note on
    stderr, not a failure: the exit status stays 0.
    """
    import webbrowser

    uri = page.resolve().as_uri()
    try:
        opened = webbrowser.open(uri)
    except webbrowser.Error as exc:  # e.g. $BROWSER naming a program that fails
        opened, why = False, f" ({exc})"
    else:
        why = ""
    if not opened:
        print(
            f"kiln: no web browser found to open the report{why}; it is at {page.resolve()} "
            f"(open {uri} in a browser, or set BROWSER to one)",
            file=sys.stderr,
        )
    return opened


def _check_compare_dir(project, other: Path) -> None:
    """``other`` must hold a build: a checkout's root compared as "everything added"."""
    from kiln.report.compare import SCHEDULE

    expected = f"the out dir of another build (holding <kernel>/<shapes>/{SCHEDULE})"
    if not other.is_dir():
        raise KilnError(
            f"--compare: {other} is not a directory", expected=expected, found=str(other)
        )
    if next(other.glob(f"*/*/{SCHEDULE}"), None) is not None:
        return
    hint = "point it at the out dir of a build (`kiln compile` writes it)"
    out_dir = Path(project.out_dir)
    if out_dir.is_relative_to(project.root):
        # the other checkout's root: its out dir is likely where this project keeps its own
        nested = other / out_dir.relative_to(project.root)
        if next(nested.glob(f"*/*/{SCHEDULE}"), None) is not None:
            hint = f"did you mean --compare {nested}?"
    raise KilnError(
        f"--compare: {other} holds no build",
        expected=expected,
        found=f"no {SCHEDULE} under {other}",
        hint=hint,
    )


def _view_to_stdout(args: argparse.Namespace) -> int:
    from kiln.report.page import render_report

    if args.open or args.compare is not None:
        raise KilnError(
            "-o - writes the report to stdout: there is no file to --open or compare into",
            expected="-o FILE with --open or --compare",
            found="-o - " + ("--open" if args.open else "--compare"),
        )
    project = _project()
    instances = selection(project, args.filters, args.shapes, "view")
    page = render_report(project, instances, Path(project.out_dir) / "report.html")
    sys.stdout.flush()
    sys.stdout.buffer.write(page)
    sys.stdout.flush()
    print(f"kiln: wrote the report to stdout ({len(instances)} kernel instances)", file=sys.stderr)
    return 0


def _selected_names(args, instances):
    """Which instance names a compare covers: the selection, and (for instances the
    other build has and this pipeline lacks) names matching the same filters."""
    if not args.filters and not args.shapes:
        return None
    names = {inst.name for inst in instances}

    def keep(name: str) -> bool:
        if name in names:
            return True
        shapes = name.rpartition(".")[2]
        if args.shapes and shapes != args.shapes:
            return False
        return not args.filters or any(f in name for f in args.filters)

    return keep


def write_profile(project, path: Path) -> None:
    """`kiln compile --profile FILE`: the last build's tasks as Chrome-trace JSON."""
    import json

    from kiln.fsutil import write_bytes_atomic
    from kiln.outpaths import write_output
    from kiln.tasks.checks.results import chrome_trace, read_profile

    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(chrome_trace(read_profile(project.state_dir)), indent=1, sort_keys=True)
    write_output(path, lambda p: write_bytes_atomic(p, data.encode()))
    print(f"kiln: wrote the build profile to {path} (open it in Perfetto)")


def _project():
    from kiln.tasks.model.project import (
        Project,  # only once a command runs: `kiln --help` stays light
    )

    return Project.find()
