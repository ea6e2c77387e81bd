"""The words of `kiln --help`: Kiln's commands by group, examples and exit status.

Kept apart from kiln/cli/parser.py, which builds the parser these describe.
"""

from __future__ import annotations

import argparse
import textwrap

# (name, one-line summary), grouped as `kiln help` shows them
COMMAND_GROUPS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    (
        "Build",
        (
            ("compile", "compile kernels: all of them, or those FILTER selects"),
            ("status", "say which kernels would rebuild, and why"),
            ("watch", "rebuild (and test) what changed on every save"),
            ("clean", "remove the artifacts and results Kiln wrote (or FILTER selects)"),
        ),
    ),
    (
        "Check and measure",
        (
            ("test", "check every target against the cpu oracle"),
            ("run", "run a kernel, or an app of pipeline.yaml, on a target"),
            ("bench", "time kernels on a target (or a built-in problem:NAME)"),
            ("tune", "search tiles, fusion and scheduling; records in tuning.jsonl"),
        ),
    ),
    (
        "Look inside",
        (
            ("view", "write one self-contained HTML report of the build"),
            ("graph", "print the task DAG of the selection"),
            ("inspect", "decode an EDF kernel binary"),
        ),
    ),
    (
        "Project",
        (
            ("init", "start a new project that builds and tests at once"),
            ("config", "show the settings in force: pipeline file, directories, environment"),
            ("cache", "the content-addressed artifact store (KILN_CACHE_DIR)"),
            ("completion", "print a shell completion script (bash, zsh, fish)"),
            ("help", "show this help, or one command's"),
        ),
    ),
)
SUMMARIES = dict(item for _, items in COMMAND_GROUPS for item in items)
# doit commands that `kiln` passes through unchanged
DOIT_COMMANDS = ("list", "info", "forget", "ignore", "reset-dep", "dumpdb", "strace")
# Kiln's doit task groups: a word naming one is a task, not a misspelt command
# (`kiln report` runs doit's report tasks; `kiln clean test` cleans the test tasks)
TASK_GROUPS = ("compile", "test", "report")

EXAMPLES = """\
examples:
  kiln init myproj && cd myproj   start a project (pipeline.yaml, one kernel, a test)
  kiln compile                    build every kernel of pipeline.yaml
  kiln compile gemm --dump-schedule s.json
                                  build gemm and write its schedule for Perfetto
  kiln test --target sim          check the simulator against the cpu oracle
  kiln watch --target sim         rebuild and test on every save
  kiln status                     what would rebuild, and why"""

EXIT_CODES = """\
exit status:
  0    success
  1    a build, test or benchmark failed
  2    usage or input error: bad arguments, pipeline.yaml, a kernel's source
  130  interrupted (Ctrl-C)"""

USAGE = "kiln [-f PATH] [-v | -q] COMMAND [ARGS...]"
COMMAND_EPILOG = (
    "`kiln help` lists every command; exit status: 0 ok, 1 failure, 2 usage or input error."
)


def top_help(parser: argparse.ArgumentParser) -> str:
    """`kiln --help`: usage, commands by group, global options, examples, exit status."""
    width = max(len(name) for name in SUMMARIES) + 2
    lines = [
        f"usage: {USAGE}",
        "       kiln -V | --version",
        "",
        parser.description or "",
    ]
    for group, items in COMMAND_GROUPS:
        lines += ["", f"{group}:"]
        lines += [f"  {name:<{width}}{summary}" for name, summary in items]
    lines += ["", "doit's commands pass through:"]
    lines += textwrap.wrap(
        f"{', '.join(DOIT_COMMANDS)}, ... (`kiln help list`); `kiln TASK...` runs doit tasks",
        78,
        initial_indent="  ",
        subsequent_indent="  ",
    )
    lines += ["", "global options:"]
    for action in parser._actions:  # argparse has no public accessor
        if not action.option_strings:
            continue
        names = ", ".join(action.option_strings)
        if action.metavar:
            names += f" {action.metavar}"
        text = textwrap.wrap(action.help or "", 78 - 20)
        lines.append(f"  {names:<18}{text[0]}")
        lines += [" " * 20 + more for more in text[1:]]
    lines += ["", EXAMPLES, "", EXIT_CODES, "", "`kiln help COMMAND` shows one command's options."]
    return "\n".join(lines) + "\n"
