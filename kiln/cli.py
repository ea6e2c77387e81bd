"""The `kiln` command: Kiln's own commands, and every doit command passed through.

User-facing errors (KilnError) become one message and a non-zero exit,
never a traceback: exit 2 for bad input, 1 for a failed build or check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from kiln.brokenpipe import guard_stdout
from kiln.commands_cache import add_cache_parser, add_executor_flags
from kiln.errors import Abort, KilnError, environment_error
from kiln.logconfig import setup_logging

DUMP_FLAGS = ("dfg", "visa", "ir", "graph", "schedule", "summary", "mlir")
OWN_COMMANDS = (
    "compile",
    "status",
    "run",
    "inspect",
    "test",
    "bench",
    "tune",
    "view",
    "graph",
    "cache",
)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    guard_stdout()
    setup_logging()
    fmt = _message_format(argv)
    try:
        if argv and argv[0] in OWN_COMMANDS:
            return _dispatch(argv)
        from kiln.tasks.build import run_doit

        return run_doit(None, argv) or 0  # doit returns None for some commands (clean)
    except KilnError as err:
        _print_error(err, fmt)
        return getattr(err, "exit_code", 2)
    except Abort as abort:  # a KilnError raised while doit loaded the tasks
        _print_error(abort.error, fmt)
        return 2
    except OSError as exc:  # full disk, permissions, a file where a dir belongs
        _print_error(environment_error(exc), fmt)
        return 2
    except KeyboardInterrupt:
        print("kiln: interrupted", file=sys.stderr)
        return 130


def _dispatch(argv: list[str]) -> int:
    if argv[0] == "bench" and any(a.startswith("problem:") for a in argv[1:]):
        from kiln.tasks.problems import run_problem_bench  # built-in problems: own flags

        return run_problem_bench(argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    if getattr(args, "message_format", None):
        os.environ["KILN_MESSAGE_FORMAT"] = args.message_format
    if getattr(args, "no_wait", False):
        os.environ["KILN_NO_WAIT"] = "1"  # read where the project lock is taken
    from kiln import commands, commands_cache

    if args.command == "cache":
        return commands_cache.cmd_cache(args)
    commands_cache.apply_executor_flags(args)
    if args.command in ("view", "graph"):
        from kiln.report import commands
    return getattr(commands, f"cmd_{args.command}")(args)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kiln",
        description="Kiln: build, test and run compute "
        "kernels. Other commands (list, info, clean, forget, ...) go to doit.",
    )
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("compile", help="compile kernels (substring filters on package.module.fn)")
    c.add_argument("filters", nargs="*", metavar="FILTER")
    c.add_argument("-p", "--package", action="append", default=[], metavar="PKG")
    c.add_argument("--shapes", metavar="NAME", help="only this shape set")
    c.add_argument("-n", "--process", type=int, default=0, metavar="N", help="parallel jobs")
    _build_flags(c)
    for kind in DUMP_FLAGS:
        metavar = "DIR" if kind == "summary" else "FILE"
        c.add_argument(f"--dump-{kind}", metavar=metavar, type=Path)
    c.add_argument("--message-format", choices=["human", "json"], default="human")
    add_executor_flags(c)
    c.add_argument("--profile", type=Path, metavar="FILE", help="write the build's Chrome trace")

    s = sub.add_parser("status", help="say which tasks would run, and why")
    s.add_argument("filters", nargs="*", metavar="FILTER")
    s.add_argument("-p", "--package", action="append", default=[], metavar="PKG")
    s.add_argument("--all", action="store_true", help="list up-to-date tasks too")

    r = sub.add_parser("run", help="run a kernel, or an app of pipeline.yaml, on a target")
    r.add_argument("name", metavar="KERNEL|APP")
    r.add_argument("--target", default="cpu")
    r.add_argument("--shapes", metavar="NAME")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--save-outputs", type=Path, metavar="DIR")
    _build_flags(r, fail_fast=False)

    i = sub.add_parser("inspect", help="decode an EDF kernel binary")
    i.add_argument("file", type=Path)

    t = sub.add_parser("test", help="check targets against the cpu oracle")
    t.add_argument("filters", nargs="*", metavar="FILTER")
    t.add_argument("--target", action="append", default=[], metavar="T")
    t.add_argument("--junit", type=Path, metavar="FILE")
    t.add_argument("--seed", type=int, default=0)
    _build_flags(t)

    b = sub.add_parser(
        "bench", help="time kernels on a target (or problem:conv|gemm|layernorm|softmax|attention)"
    )
    b.add_argument("filters", nargs="*", metavar="FILTER")
    b.add_argument("--target", required=True, metavar="T")
    b.add_argument(
        "--shape",
        metavar="DIMS",
        help="time the kernel at these sizes instead of its shape sets, e.g. M=64,K=32,N=16",
    )
    b.add_argument("--iter", type=int, default=10)
    b.add_argument("--warmup", type=int, default=2)
    b.add_argument("--device", type=int, default=0)
    b.add_argument("--output-format", choices=["table", "csv", "json"], default="table")
    _build_flags(b)
    add_cache_parser(sub)

    u = sub.add_parser(
        "tune",
        help="search tiles, fusion and scheduling per kernel; records in tuning.jsonl",
        description="Price candidate stage options by their makespan on the machine model, "
        "verify the best on the simulator against the oracle, and keep it in tuning.jsonl, "
        "which `kiln compile` applies. Example: kiln tune gemm --shapes large --budget 200",
    )
    u.add_argument("filters", nargs="*", metavar="FILTER")
    u.add_argument("--shapes", metavar="NAME", help="only this shape set")
    u.add_argument("--budget", type=int, default=64, metavar="N", help="trials per instance")
    u.add_argument(
        "--strategy",
        choices=["grid", "random", "evolutionary"],
        default="evolutionary",
        help="how candidates are proposed (all deterministic for a given --seed)",
    )
    u.add_argument("--seed", type=int, default=0, help="seed of the random proposals")
    u.add_argument("-n", "--process", type=int, default=0, metavar="N", help="parallel trials")
    u.add_argument("--force", action="store_true", help="tune again even if a record is current")
    u.add_argument("--show", action="store_true", help="print the records instead of tuning")

    from kiln.report.commands import add_parsers

    add_parsers(sub)
    return p


def _build_flags(parser: argparse.ArgumentParser, fail_fast: bool = True) -> None:
    """Flags of every command that builds: the project lock and what a failure stops."""
    parser.add_argument(
        "--no-wait",
        action="store_true",
        help="fail at once (exit 2, naming the holder) when another build holds "
        "the project lock, instead of waiting for it (env KILN_NO_WAIT=1)",
    )
    if fail_fast:
        parser.add_argument(
            "-x",
            "--fail-fast",
            action="store_true",
            help="stop at the first failure; by default every kernel that can be "
            "built is built and every failure reported",
        )


def _message_format(argv: list[str]) -> str:
    for i, a in enumerate(argv):
        if a.startswith("--message-format="):
            return a.split("=", 1)[1]
        if a == "--message-format" and i + 1 < len(argv):
            return argv[i + 1]
    return os.environ.get("KILN_MESSAGE_FORMAT", "human")


def _print_error(err: KilnError, fmt: str) -> None:
    if fmt == "json":
        print(json.dumps(err.to_dict(), sort_keys=True))
    else:
        print(err.render(), file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
