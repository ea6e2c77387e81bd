"""The `kiln` command line: every subcommand, its options and its help text.

kiln/cli/command.py parses with this and dispatches; the completion scripts are
generated from the same parser, so what the help, the parser and the shell
know cannot drift apart. Building the parser imports no numpy.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kiln.cli.cache_commands import add_cache_parser, add_executor_flags
from kiln.cli.help import COMMAND_EPILOG, SUMMARIES, USAGE, top_help
from kiln.outpaths import output_path

DUMP_FLAGS = ("dfg", "visa", "ir", "graph", "schedule", "summary", "mlir")


class KilnParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors end with where to read more (exit 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n  hint: see `{self.prog} --help`\n")


class TopParser(KilnParser):
    """The top-level parser: its help lists Kiln's commands by group."""

    def format_help(self) -> str:
        return top_help(self)


def build_parser() -> KilnParser:
    """The whole `kiln` command line (doit's pass-through commands excepted)."""
    p = TopParser(
        prog="kiln",
        usage=USAGE,
        description="Kiln: build, test and run compute kernels declared in pipeline.yaml.",
        add_help=False,
    )
    p.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    p.add_argument(
        "-V",
        "--version",
        action="store_true",
        help="print the versions of kiln, doit, Python, IREE",
    )
    add_global_flags(p, suppress=False)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", prog="kiln", parser_class=KilnParser)

    _add_build_commands(sub)
    _add_check_commands(sub)
    _add_look_commands(sub)
    _add_project_commands(sub)
    for name, parser in sub.choices.items():
        _finish(parser, name)
    return p


def add_global_flags(parser: argparse.ArgumentParser, suppress: bool = True) -> None:
    """-f/-v/-q: before the command, and after it where the command has no such flag."""
    default = argparse.SUPPRESS if suppress else None
    flags = (
        (
            ("-f", "--file"),
            dict(
                metavar="PATH",
                dest="pipeline_file",
                help="the pipeline file (or its directory) to use instead of the "
                "nearest pipeline.yaml at or above the working directory",
            ),
        ),
        (
            ("-v", "--verbose"),
            dict(
                action="store_const",
                const=2,
                dest="verbosity",
                help="say more: every task, and where its artifact came from",
            ),
        ),
        (
            ("-q", "--quiet"),
            dict(
                action="store_const",
                const=0,
                dest="verbosity",
                help="say less: only failures and the summary",
            ),
        ),
    )
    for names, kwargs in flags:
        try:
            parser.add_argument(*names, default=default, **kwargs)
        except argparse.ArgumentError:
            pass  # the command has its own meaning for the letter


def _add(sub, name: str, description: str | None = None, epilog: str | None = None):
    summary = SUMMARIES[name]
    return sub.add_parser(
        name,
        help=summary,
        description=description or summary[0].upper() + summary[1:] + ".",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _filters(parser, what: str = "kernels") -> None:
    parser.add_argument(
        "filters",
        nargs="*",
        metavar="FILTER",
        help=f"select {what}: an exact name, kernel.shapeset, a glob (gemm*), "
        "or a substring of the full path (package.module.function) or instance name, "
        "which selects every kernel it is found in; none selects all",
    )


def _package(parser) -> None:
    parser.add_argument(
        "-p",
        "--package",
        action="append",
        default=[],
        metavar="PKG",
        help="only kernels of this package (repeatable)",
    )


def _shapes(parser) -> None:
    parser.add_argument("--shapes", metavar="NAME", help="only this shape set")


def _seed(parser, what: str = "the random inputs") -> None:
    parser.add_argument("--seed", type=seed, default=0, help=f"seed of {what} (default 0)")


def _add_build_commands(sub) -> None:
    c = _add(
        sub,
        "compile",
        epilog="examples:\n  kiln compile\n  kiln compile gemm softmax -n 2\n"
        "  kiln compile gemm.small --dump-schedule s.json   (open s.json in Perfetto)",
    )
    _filters(c)
    _package(c)
    _shapes(c)
    c.add_argument(
        "-n",
        "--process",
        type=parallel_jobs,
        default=None,
        metavar="N",
        help="build with N parallel jobs (0 or 1: in this process)",
    )
    _build_flags(c)
    for kind in DUMP_FLAGS:
        metavar = "DIR" if kind == "summary" else "FILE"
        c.add_argument(
            f"--dump-{kind}",
            metavar=metavar,
            type=output_path,
            help=f"write the {DUMP_HELP[kind]} (one kernel instance only)",
        )
    c.add_argument(
        "--message-format",
        choices=["human", "json"],
        default="human",
        help="diagnostics as text (default) or one JSON object per line, for tools",
    )
    add_executor_flags(c)
    c.add_argument(
        "--profile", type=output_path, metavar="FILE", help="write the build's Chrome trace"
    )

    s = _add(sub, "status", epilog="example:\n  kiln status gemm --all")
    _filters(s, "kernels or an app")
    _package(s)
    s.add_argument("--all", action="store_true", help="list up-to-date tasks too")

    w = _add(
        sub,
        "watch",
        description="Watch the project's kernel modules, pipeline.yaml and stage modules; "
        "on every save, rebuild what changed (and with --target, test it there). "
        "One summary line per round; Ctrl-C stops (exit 0).",
        epilog="examples:\n  kiln watch\n  kiln watch gemm --target sim --debounce 500",
    )
    _filters(w)
    w.add_argument(
        "--target", metavar="T", help="after each build, test the selection on this target"
    )
    w.add_argument(
        "--debounce",
        type=int,
        default=200,
        metavar="MS",
        help="wait this long for more saves before a round (default 200)",
    )
    w.add_argument(
        "--poll",
        action="store_true",
        help="poll for changes instead of OS events (network or container file systems)",
    )

    k = _add(
        sub,
        "clean",
        description="Remove the files Kiln wrote for the selected kernels: their artifacts "
        "(doit's clean of their tasks) and their test and bench results; without a FILTER, "
        "every kernel's, and the out dir's report.html and test-report.json. A file Kiln "
        "did not write is never removed.",
        epilog="examples:\n  kiln clean\n  kiln clean softmax gemm.small\n"
        "  kiln clean compile:gemm.small.edf   (doit task names clean only those tasks)",
    )
    k.add_argument(
        "filters",
        nargs="*",
        metavar="FILTER|TASK",
        help="select kernels as every command does (an exact name, kernel.shapeset, a glob, "
        "or a substring: every kernel it is found in), or name doit tasks "
        "(compile:gemm.small.edf); "
        "none selects all kernels",
    )
    k.add_argument("-n", "--dry-run", action="store_true", help="say what would be removed")
    k.add_argument("-a", "--all", "--clean-all", action="store_true", help="clean every task")
    k.add_argument(
        "-c", "--clean-dep", action="store_true", help="clean the tasks' dependencies too"
    )
    k.add_argument("--forget", action="store_true", help="also forget the tasks' build record")


DUMP_HELP = {
    "dfg": "traced graph as JSON",
    "visa": "vISA text (parses back to the same IR)",
    "ir": "LIR binary (msgpack)",
    "graph": "LIR graph JSON, for a graph viewer",
    "schedule": "schedule as a Chrome trace (open in Perfetto)",
    "summary": "summary.json and summary.txt into DIR",
    "mlir": "MLIR the iree runner compiles",
}


def _add_check_commands(sub) -> None:
    t = _add(
        sub,
        "test",
        epilog="examples:\n  kiln test\n  kiln test gemm --target sim --target iree-cpu\n"
        "  kiln test --junit report.xml\n  kiln test gemm --fuzz 50 --seed 1",
    )
    _filters(t, "kernels or an app")
    t.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="T",
        help="a target of pipeline.yaml (repeatable; default: every target)",
    )
    t.add_argument(
        "--junit", type=output_path, metavar="FILE", help="also write a JUnit XML report"
    )
    t.add_argument(
        "--strict",
        action="store_true",
        help="a vacuous check fails: an oracle output that is all zeros, constant or "
        "non-finite for the inputs (choose them under `inputs:` in pipeline.yaml)",
    )
    t.add_argument(
        "--fuzz",
        type=fuzz_count,
        metavar="N",
        help="check one kernel at N shape bindings drawn for its dims (--seed picks them; "
        "ranges under `fuzz:` in pipeline.yaml) instead of its declared shape sets",
    )
    _seed(t, "the random inputs and, with --fuzz, the shape bindings")
    _build_flags(t)

    r = _add(
        sub, "run", epilog="examples:\n  kiln run gemm --target sim\n  kiln run mlp --target cpu"
    )
    r.add_argument("name", metavar="KERNEL|APP", help="the kernel or app to run")
    r.add_argument("--target", default="cpu", help="where to run it (default cpu)")
    _shapes(r)
    _seed(r)
    r.add_argument(
        "--save-outputs",
        type=output_path,
        metavar="DIR",
        help="write each output as DIR/out0.npy, DIR/out1.npy, ... (an app's as "
        "DIR/<name>.npy), and DIR/outputs.json (each output's dtype and shape): "
        "np.load(FILE) reads every file, bf16 as its exact f32 widening; "
        "kiln.load_outputs(DIR) returns them all in their own dtypes",
    )
    _build_flags(r, fail_fast=False)

    b = _add(
        sub,
        "bench",
        epilog="examples:\n  kiln bench gemm --target sim\n"
        "  kiln bench gemm --target iree-cpu --target iree-cuda\n"
        "  kiln bench gemm --target iree-cpu --shape M=64,K=32,N=16\n"
        "  kiln bench problem:gemm --target iree-cpu   (built-in problems: own flags)\n"
        "  kiln bench problem:conv --dims 3 -D 8 --stride 2,1,1   (one value per spatial dim)\n"
        "  kiln bench problem: conv --bf16 -F 2 -n 16 -c 8 -H 8 -W 8 -k 8 -y 3 -x 3 -p 1 -q 1\n"
        "      (a MIOpen/Fusilli driver line: -F 1|2|4 forward, backward data, backward\n"
        "      weights; also matmul -M -N -K [--transA] [--bf16])\n"
        "  kiln bench --commands convs.txt --output-format csv   (a file of driver lines)",
    )
    _filters(b)
    b.add_argument(
        "--target",
        action="append",
        required=True,
        metavar="T",
        help="a target to time (repeatable: one table, one row per kernel and target)",
    )
    b.add_argument(
        "--commands",
        metavar="FILE",
        help="time every benchmark driver line of FILE (MIOpen/Fusilli conv and matmul "
        "lines; # comments and [SKIP] lines are passed over), one row each",
    )
    b.add_argument(
        "--shape",
        metavar="DIMS",
        help="time the kernel at these sizes instead of its shape sets, e.g. M=64,K=32,N=16",
    )
    b.add_argument("--iter", type=int, default=10, help="timed runs per kernel (default 10)")
    b.add_argument("--warmup", type=int, default=2, help="untimed runs before timing (default 2)")
    b.add_argument("--device", type=int, default=0, help="device index of the target (default 0)")
    b.add_argument(
        "--output-format",
        choices=["table", "csv", "json"],
        default="table",
        help="how results are printed (default table)",
    )
    _build_flags(b)

    u = _add(
        sub,
        "tune",
        description="Price candidate stage options by their makespan on the machine model, "
        "verify the best on the simulator against the oracle, and keep it in tuning.jsonl, "
        "which `kiln compile` applies.",
        epilog="example:\n  kiln tune gemm --shapes large --budget 200",
    )
    _filters(u)
    _shapes(u)
    u.add_argument("--budget", type=int, default=64, metavar="N", help="trials per instance")
    u.add_argument(
        "--strategy",
        choices=["grid", "random", "evolutionary"],
        default="evolutionary",
        help="how candidates are proposed (all deterministic for a given --seed)",
    )
    _seed(u, "the random proposals")
    u.add_argument(
        "-n",
        "--process",
        type=parallel_jobs,
        default=None,
        metavar="N",
        help="price N trials in parallel (0 or 1, the default: in this process)",
    )
    add_executor_flags(u)
    u.add_argument("--force", action="store_true", help="tune again even if a record is current")
    u.add_argument("--show", action="store_true", help="print the records instead of tuning")


def parallel_jobs(text: str) -> int:
    """argparse ``type=`` of -n, for builds and tuning alike: 0 and 1 both mean this process."""
    jobs = "a whole number of parallel jobs, 0 or more (0 or 1: in this process)"
    return _whole_number(text, jobs)


def seed(text: str) -> int:
    """argparse ``type=`` of --seed: numpy's generators take no negative seed."""
    return _whole_number(text, "a whole number, 0 or more")


def fuzz_count(text: str) -> int:
    """argparse ``type=`` of --fuzz: how many shape bindings, at least one."""
    value = _whole_number(text, "a whole number of shape bindings, 1 or more")
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"expected a whole number of shape bindings, 1 or more, found {text!r}"
        )
    return value


def _whole_number(text: str, expected: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected {expected}, found {text!r}")
    return value


def _add_look_commands(sub) -> None:
    from kiln.report.commands import add_parsers

    add_parsers(sub)
    i = _add(
        sub, "inspect", epilog="example:\n  kiln inspect build/kiln/kernel/gemm/small/kernel.edf"
    )
    i.add_argument("file", type=Path, help="the .edf file")


def _add_project_commands(sub) -> None:
    n = _add(
        sub,
        "init",
        description="Write a new project into DIR (default: the working directory): "
        "pipeline.yaml and its JSON Schema for editors (pipeline.schema.json), "
        "a kernels package with one example kernel, a pytest test for it, "
        "dodo.py, pyproject.toml (pytest settings), .gitignore and a README. "
        "Refuses to overwrite any file.",
        epilog="example:\n  kiln init myproj && cd myproj && kiln compile && kiln test",
    )
    n.add_argument(
        "dir", nargs="?", type=Path, default=Path("."), metavar="DIR", help="where (created if new)"
    )
    n.add_argument("--name", help="the project's name (default: DIR's name)")

    g = _add(
        sub,
        "config",
        description="Show the settings in force: the pipeline file, the directories Kiln "
        "uses (out dir, state dir, cache dir, remote cache), the project's schema copy, "
        "pipeline.yaml merged over Kiln's built-in defaults (each entry with its origin) "
        "and the KILN_* variables that override it.",
        epilog="examples:\n  kiln config\n  kiln config --json\n"
        "  kiln config --schema   (after upgrading Kiln: editors check with the new schema)",
    )
    g.add_argument("--json", action="store_true", help="print one JSON object, for tools")
    g.add_argument(
        "--schema",
        action="store_true",
        help="write pipeline.schema.json next to pipeline.yaml (refreshed when it differs): "
        "the JSON Schema editors check pipeline.yaml with, through its first line "
        "`# yaml-language-server: $schema=pipeline.schema.json`",
    )

    add_cache_parser(sub)

    c = _add(
        sub,
        "completion",
        description="Print a completion script for Kiln's commands and options.",
        epilog="install:\n"
        "  bash:  kiln completion bash > ~/.local/share/bash-completion/completions/kiln\n"
        '  zsh:   kiln completion zsh > "${fpath[1]}/_kiln"\n'
        "  fish:  kiln completion fish > ~/.config/fish/completions/kiln.fish",
    )
    c.add_argument("shell", choices=["bash", "zsh", "fish"], help="the shell to complete for")

    h = _add(sub, "help", epilog="examples:\n  kiln help compile\n  kiln help list")
    h.add_argument("topic", nargs="?", metavar="COMMAND", help="a Kiln or doit command")


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


def _finish(parser: argparse.ArgumentParser, name: str) -> None:
    """Global flags, the epilog's pointer to `kiln help`, and a description for every command."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    if not parser.description and name in SUMMARIES:
        summary = SUMMARIES[name]
        parser.description = summary[0].upper() + summary[1:] + "."
    parser.epilog = f"{parser.epilog}\n\n{COMMAND_EPILOG}" if parser.epilog else COMMAND_EPILOG
    add_global_flags(parser)
    for child_name, child, summary in subcommands(parser):
        if not child.description and summary:
            child.description = summary[0].upper() + summary[1:] + "."
        _finish(child, f"{name} {child_name}")


def subcommands(
    parser: argparse.ArgumentParser,
) -> list[tuple[str, argparse.ArgumentParser, str]]:
    """A parser's subcommands as (name, parser, one-line help); empty when it has none."""
    for action in parser._actions:  # argparse has no public accessor
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return [(n, p, helps.get(n, "")) for n, p in action.choices.items()]
    return []
