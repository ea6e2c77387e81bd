"""The `kiln` command: Kiln's own commands, and every doit command passed through.

This module only parses and prints: the parser lives in kiln/cli/parser.py,
the commands in the modules COMMANDS names. User-facing errors (KilnError)
become one message and a non-zero exit, never a traceback: exit 2 for bad
input or usage, 1 for a failed build or check.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from pathlib import Path

from kiln.brokenpipe import guard_stdout
from kiln.cli.help import DOIT_COMMANDS, SUMMARIES, TASK_GROUPS
from kiln.cli.parser import build_parser, subcommands
from kiln.errors import Abort, KilnError, environment_error
from kiln.interrupts import INTERRUPTED, note_interrupts
from kiln.logconfig import setup_logging, verbosity

# Kiln's own commands: "module:function" called with the parsed arguments
COMMANDS = {
    "compile": "kiln.cli.commands:cmd_compile",
    "status": "kiln.cli.commands:cmd_status",
    "run": "kiln.cli.commands:cmd_run",
    "inspect": "kiln.cli.commands:cmd_inspect",
    "test": "kiln.cli.commands:cmd_test",
    "bench": "kiln.cli.commands:cmd_bench",
    "tune": "kiln.cli.commands:cmd_tune",
    "view": "kiln.report.commands:cmd_view",
    "graph": "kiln.report.commands:cmd_graph",
    "cache": "kiln.cli.cache_commands:cmd_cache",
    "clean": "kiln.cli.commands:cmd_clean",
    "init": "kiln.cli.scaffold:cmd_init",
    "watch": "kiln.cli.watch:cmd_watch",
    "config": "kiln.cli.config_command:cmd_config",
    "completion": "kiln.cli.completion:cmd_completion",
}
OWN_COMMANDS = tuple(COMMANDS)
DOIT_USAGE_ERROR = 3  # doit's exit status for a bad command line: Kiln's is 2
# The name on the package index ("kiln" there is an unrelated project): `pip install
# 'kiln-kernels[iree]'`; the import name and the command stay `kiln`.
DISTRIBUTION = "kiln-kernels"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    guard_stdout()
    note_interrupts()
    fmt = _message_format(argv)
    try:
        setup_logging()  # a bad KILN_LOG_FILE is a KilnError: one message, no traceback
        return _main(argv)
    except KilnError as err:
        _print_error(err, fmt)
        return getattr(err, "exit_code", 2)
    except Abort as abort:  # a KilnError raised while doit loaded the tasks
        _print_error(abort.error, fmt)
        return 2
    except OSError as exc:  # full disk, permissions, a file where a dir belongs
        _print_error(environment_error(exc), fmt)
        return 2
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2, already printed)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except KeyboardInterrupt:
        if fmt == "json":  # a Ctrl-C before the build began: the summary object all the same
            from kiln.tasks.dag.reporter import summary_json, wrote_summary

            if not wrote_summary():
                try:
                    sys.stdout.write(summary_json(stopped=True))
                    sys.stdout.flush()
                except OSError:  # stdout closed: the exit status still says it
                    pass
        print(INTERRUPTED, file=sys.stderr)
        return 130


def _main(argv: list[str]) -> int:
    flags, rest = split_global_flags(argv)
    if flags.get("version"):
        print(version_text())
        return 0
    if flags.get("help") or not rest:
        print(build_parser().format_help(), end="")
        return 0
    _check_leading_options(rest)
    command = rest[0]
    # own commands take -v/-q after the command too; doit's own -v/-q there are doit's
    # a benchmark driver's line has its own -v and -q (strides, paddings): not Kiln's
    problem = command == "bench" and _problem_bench(rest)
    _one_verbosity(argv if command in OWN_COMMANDS and not problem else argv[: -len(rest)])
    apply_global_flags(flags)
    verbosity()  # KILN_VERBOSITY from the environment, checked before anything runs
    if command == "help":
        return _help(rest[1:])
    if command in OWN_COMMANDS:
        return _dispatch(rest)
    _check_command(command)
    if command in DOIT_COMMANDS and ("--help" in rest[1:] or "-h" in rest[1:]):
        return _help([command])  # doit's commands take no --help: its parser refused it
    from kiln.tasks.dag.build import run_doit

    rc = run_doit(None, rest) or 0  # doit returns None for some commands
    return 2 if rc == DOIT_USAGE_ERROR else rc


def _problem_bench(argv: list[str]) -> bool:
    """`kiln bench problem:...` or `kiln bench --commands FILE`: flags of their own."""
    words = argv[1:]
    return any(a.startswith("problem:") or a.split("=", 1)[0] == "--commands" for a in words)


def _dispatch(argv: list[str]) -> int:
    if argv[0] == "bench" and _problem_bench(argv):
        from kiln.tasks.commands.bench_commands import (
            run_problem_bench,  # problems, driver lines: own flags
        )

        return run_problem_bench(argv[1:])
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # name the command whose options these are not, with its usage
        subparser = {name: sub for name, sub, _ in subcommands(parser)}[args.command]
        subparser.error(f"unrecognized arguments: {' '.join(extra)}")
    apply_global_flags(vars(args))
    if getattr(args, "message_format", None):
        os.environ["KILN_MESSAGE_FORMAT"] = args.message_format
    if getattr(args, "no_wait", False):
        os.environ["KILN_NO_WAIT"] = "1"  # read where the project lock is taken
    from kiln.cli import cache_commands as commands_cache

    commands_cache.apply_executor_flags(args)
    return _command(args.command)(args)


def _command(name: str):
    """The function of one of Kiln's own commands, imported when it runs."""
    import importlib

    module_name, func = COMMANDS[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise KilnError(
            f"`kiln {name}` is not available in this installation",
            found=f"no module {module_name}",
            hint="reinstall kiln, or update it",
        ) from None
    return getattr(module, func)


def _help(topics: list[str]) -> int:
    """`kiln help [COMMAND]`: Kiln's help, or doit's for a doit command."""
    if not topics:
        print(build_parser().format_help(), end="")
        return 0
    topic = topics[0]
    if topic in OWN_COMMANDS or topic == "help":
        return _dispatch([topic, "--help"])
    if topic in DOIT_COMMANDS or topic in ("run", "task", "tabcompletion", "auto"):
        from kiln.tasks.dag.build import run_doit

        rc = run_doit(None, ["help", *topics]) or 0
        print(
            "\nUnder kiln, whatever the defaults above say, the database is "
            ".kiln/doit.sqlite3 (sqlite3)\nand the up-to-date check is pipeline.yaml's "
            "cache.check (timestamp unless it says md5)."
        )
        return rc
    raise _unknown_command(topic)


def _check_command(word: str) -> None:
    """What doit could run goes to doit; any other first word is an unknown command.

    doit runs a doit command, a task (every Kiln task name but a group's has a
    ':'), a ``name=value`` variable or a target, which is a file path. Deciding
    here, before any project is looked for, gives one message inside a project
    and outside one, instead of doit's 'Invalid parameter' or 'no pipeline file'.
    """
    if word.startswith("-") or ":" in word or "=" in word or word in TASK_GROUPS:
        return
    if word in DOIT_COMMANDS or word in ("tabcompletion", "auto"):
        return
    if "/" in word or os.sep in word:  # a target: doit knows whether a task makes it
        return
    raise _unknown_command(
        word, f"`kiln help` lists the commands; a FILTER follows one, as in `kiln compile {word}`"
    )


def _check_leading_options(rest: list[str]) -> None:
    """Options before the command go to doit's `run` (`kiln -n 2 compile`).

    One that `run` does not take is most often a Kiln command's option written
    too early (`kiln -x compile`): say where it goes, not doit's list of its options.
    """
    from doit.cmd_base import DoitCmdBase
    from doit.cmd_run import Run

    valued, flags = set(), set()
    for opt in (*DoitCmdBase.base_options, *Run.cmd_options):
        names = {f"-{opt['short']}" if opt["short"] else "", f"--{opt['long']}"} - {"", "--"}
        (flags if opt["type"] is bool else valued).update(names)
    i = 0
    while i < len(rest) and rest[i].startswith("-") and rest[i] != "--":
        word = rest[i]
        name = word.split("=", 1)[0] if word.startswith("--") else word[:2]
        if name not in flags | valued:
            raise _misplaced_option(word, rest[:i], rest[i + 1 :])
        attached = "=" in word if word.startswith("--") else len(word) > 2
        i += 2 if name in valued and not attached else 1


def _misplaced_option(word: str, before: list[str], after: list[str]) -> KilnError:
    command = next((w for w in after if w in OWN_COMMANDS), None)
    if command is None:
        return KilnError(
            f"unknown option '{word}' before the command",
            expected="kiln [-v|-q] [-f PATH] COMMAND [OPTIONS]: a command's options follow it",
            found=word,
            hint="`kiln help` lists the commands; `kiln help COMMAND` their options",
        )
    at = after.index(command)
    moved = [*before, word, *after[:at]]
    fixed = " ".join(["kiln", command, *moved, *after[at + 1 :]])
    return KilnError(
        f"{word} comes before the command `{command}`: a command's options follow it",
        expected=f"kiln [-v|-q] [-f PATH] {command} [OPTIONS]",
        found=" ".join(["kiln", *before, word, *after]),
        hint=f"write `{fixed}`",
    )


def _unknown_command(word: str, otherwise: str = "run `kiln help`") -> KilnError:
    close = difflib.get_close_matches(word, [*SUMMARIES, *DOIT_COMMANDS], n=1, cutoff=0.6)
    return KilnError(
        f"unknown command '{word}'",
        expected="a Kiln command (`kiln help` lists them), a doit command, "
        "or a task (compile:NAME...; `kiln list` lists them)",
        found=word,
        hint=f"did you mean `kiln {close[0]}`?" if close else otherwise,
    )


# -- global flags ------------------------------------------------------------------

GLOBAL_SWITCHES = {
    "-h": ("help", True),
    "--help": ("help", True),
    "-V": ("version", True),
    "--version": ("version", True),
    "-v": ("verbosity", 2),
    "--verbose": ("verbosity", 2),
    "-q": ("verbosity", 0),
    "--quiet": ("verbosity", 0),
}


def _one_verbosity(words: list[str]) -> None:
    """-v and -q together contradict each other: say so rather than let the last one win."""
    given = [w for w in words if GLOBAL_SWITCHES.get(w, ("",))[0] == "verbosity"]
    levels = {GLOBAL_SWITCHES[w][1]: w for w in reversed(given)}  # level -> its first flag
    if len(levels) > 1:
        raise KilnError(
            f"{levels[2]} and {levels[0]} contradict each other",
            expected="at most one of -v/--verbose and -q/--quiet",
            found=" ".join(given),
            hint="drop one of them",
        )


def split_global_flags(argv: list[str]) -> tuple[dict, list[str]]:
    """The global flags before the command, and the rest (from the command on).

    Stops at the first word that is not a global flag, so doit's own options
    (`kiln -n 2 compile`) still reach doit.
    """
    flags: dict = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in GLOBAL_SWITCHES:
            key, value = GLOBAL_SWITCHES[arg]
            flags[key] = value
        elif arg in ("-f", "--file"):
            if i + 1 >= len(argv):
                raise KilnError(f"{arg} needs a value", expected=f"{arg} PATH/pipeline.yaml")
            flags["pipeline_file"] = argv[i + 1]
            i += 1
        elif arg.startswith("--file="):
            flags["pipeline_file"] = arg.split("=", 1)[1]
        else:
            break
        i += 1
    return flags, argv[i:]


def apply_global_flags(flags: dict) -> None:
    """-f and -v/-q reach the rest of Kiln (and doit's loader) through the environment."""
    if flags.get("pipeline_file") is not None:
        os.environ["KILN_PIPELINE_FILE"] = str(pipeline_file(Path(flags["pipeline_file"])))
    if flags.get("verbosity") is not None:
        os.environ["KILN_VERBOSITY"] = str(flags["verbosity"])


def pipeline_file(path: Path) -> Path:
    """The absolute pipeline file -f names: the file itself, or pipeline.yaml in a directory."""
    path = path.expanduser().absolute()
    if path.is_dir():
        path = path / "pipeline.yaml"
    if not path.is_file():
        raise KilnError(
            f"no pipeline file at {path}",
            expected="-f PATH naming a pipeline.yaml (or the directory holding one)",
            found=str(path),
            hint="start a project there with `kiln init`",
        )
    return path


def version_text() -> str:
    """`kiln --version`: Kiln's own version first, then what it runs on (no imports)."""
    import platform
    from importlib import metadata

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    from kiln import __version__

    compiler = version("iree-base-compiler") or version("iree-compiler")
    runtime = version("iree-base-runtime") or version("iree-runtime")
    if compiler or runtime:
        iree = f"IREE compiler {compiler or 'not installed'}, runtime {runtime or 'not installed'}"
    else:
        iree = "IREE not installed"
    return "\n".join(
        [
            f"kiln {version(DISTRIBUTION) or __version__}",
            f"doit {version('doit') or 'not installed'}",
            f"Python {platform.python_version()}",
            iree,
        ]
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
