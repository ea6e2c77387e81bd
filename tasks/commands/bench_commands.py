"""`kiln bench problem:...` and `kiln bench --commands FILE`: built-in problems and benchmark
driver lines, one row each.

The file is what MIOpen and Fusilli users keep: one driver line per
configuration (tasks/commands/driver_lines.py reads a line), ``#`` comments, blank
lines and ``[SKIP]`` lines (counted, not timed). Every line is mapped before
anything is timed, so a line Kiln cannot map stops the run at once, at its
file:line, naming the flag.
"""

from __future__ import annotations

import argparse
import sys

from kiln.errors import KilnError, Location
from kiln.tasks.commands.driver_lines import (
    DriverLine,
    is_driver_line,
    line_from_argv,
    parse_line,
    split_line,
)
from kiln.tasks.commands.problems import (
    PREFIX,
    bench_problem,
    check_run,
    parse,
    problem_runner,
    time_problem,
)


def run_command_file(argv: list[str]) -> int:
    """`kiln bench --commands FILE`: every driver line of FILE, one row each."""
    from kiln.tasks.commands.benching import render

    p = argparse.ArgumentParser(prog="kiln bench --commands", allow_abbrev=False)
    p.add_argument("--commands", required=True, metavar="FILE")
    p.add_argument("--target", action="append", metavar="T")
    p.add_argument("--iter", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--output-format", choices=["table", "csv", "json"], default="table")
    args, extra = p.parse_known_args(argv)
    if extra:
        raise KilnError(
            f"kiln bench --commands takes no kernels or problems: {extra[0]}",
            expected="kiln bench --commands FILE [--target T] [--iter N] [--warmup N] "
            "[--device N] [--output-format table|csv|json]",
            found=" ".join(extra),
            hint="the file's lines say what to time",
        )
    args.targets = args.target or []
    check_run(args, "kiln bench --commands")
    args.target = args.targets[0] if args.targets else "cpu"
    lines, skipped = read_commands(args.commands, args)
    for target in dict.fromkeys(line.options.target for line in lines):
        problem_runner(target, args.device)  # every target checked before any line is timed
    rows = []
    for line in lines:
        check_run(line.options, f"{line.where}: {line.name}")
        for problem in line.problems:
            rows.append({"line": line.where, **time_problem(line.name, problem, line.options)})
    print(render(rows, args.output_format), end="")
    if skipped:
        print(f"kiln bench: {skipped} [SKIP] line(s) of {args.commands} not timed", file=sys.stderr)
    return 0


def _column(raw: str, message: str) -> int | None:
    """The column of the flag a message names (``conv: -F cannot ...``) in its line."""
    import re

    named = re.search(r"(?<![\w-])(--?[^\s:/,'\"]+)", message)
    if named is None:
        return None
    found = re.search(rf"(?<!\S){re.escape(named.group(1))}(?=[\s=]|$)", raw)
    return found.start() + 1 if found else None


def read_commands(path: str, defaults: argparse.Namespace) -> tuple[list[DriverLine], int]:
    """Every line of a command file, mapped before anything is timed; (lines, skipped).

    Blank lines and ``#`` comments are passed over; a ``[SKIP]`` line is counted
    and not timed. A line that cannot be mapped stops it all, at its file:line.
    """
    from pathlib import Path

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KilnError(
            f"--commands: cannot read {path}: {getattr(exc, 'strerror', None) or exc}",
            expected="a text file of benchmark driver lines",
            found=path,
        ) from None
    lines, skipped = [], 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("[SKIP]"):
            skipped += 1
            continue
        try:
            words = split_line(stripped)
            if not words:
                continue
            line = parse_line(words, defaults)
        except KilnError as err:
            err.message = err.message.removeprefix("kiln bench problem: ")
            err.location = Location(path, number, _column(raw, err.message), source=raw)
            raise
        line.where = f"{path}:{number}"
        lines.append(line)
    if not lines:
        raise KilnError(
            f"--commands: {path} has no driver line to time",
            expected="lines such as: conv -F 1 -n 1 -c 8 -H 8 -W 8 -k 8 -y 3 -x 3",
            found=f"{skipped} [SKIP] line(s), the rest comments or blank",
        )
    return lines, skipped


def run_problem_bench(argv: list[str]) -> int:
    """Entry point of `kiln bench problem:NAME ...` and `kiln bench --commands FILE`
    (argv after 'bench'); a benchmark driver's line after ``problem:`` is mapped."""
    from kiln.tasks.commands.benching import render

    if any(a == "--commands" or a.startswith("--commands=") for a in argv):
        return run_command_file(argv)
    names = [a for a in argv if a.startswith(PREFIX)]
    if len(names) == 1 and is_driver_line(names[0][len(PREFIX) :], argv[1:]):
        rest = [a for a in argv if a != names[0]]
        line = line_from_argv(names[0][len(PREFIX) :], rest)
        check_run(line.options, f"kiln bench {PREFIX} {line.name}")
        rows = [time_problem(line.name, problem, line.options) for problem in line.problems]
        print(render(rows, line.options.output_format), end="")
        return 0
    name, args = parse(argv)
    print(render(bench_problem(name, args), args.output_format), end="")
    return 0
