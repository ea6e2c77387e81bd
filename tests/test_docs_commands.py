"""Every shell command the docs show runs as written, in a copy of the example project.

Commands are the lines of fenced ```sh / ```bash / ```shell blocks and the
``$ `` lines of ```console blocks in README.md and docs/*.md. Each doc's
commands run in order, in one scratch copy of the example project (built
once for the whole module), with the kiln and doit of this Python on PATH.
A command must exit 0, or the status the doc declares: ``# exit N`` at the
end of the command, or ``<!-- expect-exit: N -->`` on the line before its
block. It must never print a traceback.

Commands that cannot run here are skipped, each with its reason: a block
after ``<!-- docs-test: skip (reason) -->``, or a command matching SKIPS
below (installs, GPUs, hardware, remote servers). Skipped commands are
printed (``pytest -rA`` or ``-s`` shows them).

A block that looks like commands but has no language tag would escape all
this, so that is a failure too: tag synopses and output ```text.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL = {"sh", "bash", "shell"}
TIMEOUT_S = 240


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


# (pattern searched in the command, reason, whether it applies here)
SKIPS: list[tuple[str, str, bool]] = [
    (r"\bpip install\b", "installs packages (needs the network)", True),
    (r"\bpython3? -m venv\b", "creates a virtual environment", True),
    (r"\biree-cuda\b", "needs a CUDA GPU", True),
    (r"--target (board|npu)\b", "needs a hardware runner plugin", True),
    (r"tcp://", "needs a running Dask scheduler", True),
    (r"s3://", "needs an S3 server", True),
    (r"\|\s*dot\b", "needs Graphviz's dot", shutil.which("dot") is None),
    (r"\biree-cpu\b", "needs the [iree] extra", not _installed("iree.compiler")),
    (r"--executor dask\b", "needs the [distributed] extra", not _installed("distributed")),
]
# Commands of docs this branch does not edit that cannot run as written.
# Each is a doc bug to fix at its source; the entry goes when the doc is fixed.
KNOWN: dict[tuple[str, str], str] = {}
SKIP_MARK = re.compile(r"<!--\s*docs-test:\s*skip\s*\((.+)\)\s*-->")
EXIT_MARK = re.compile(r"<!--\s*expect-exit:\s*(\d+)\s*-->")
EXIT_COMMENT = re.compile(r"#\s*exit\s+(\d+)\s*$")
LOOKS_LIKE_A_COMMAND = re.compile(r"^(\$ )?(KILN_\w+=\S*\s+)?(kiln|doit|python3?|pip)\s")


@dataclass(frozen=True)
class Command:
    doc: str  # path relative to the repository
    line: int
    text: str
    expect: int = 0
    skip: str | None = None

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


def fenced_blocks(path: Path):
    """(language, first line number, lines, marker line before the fence) per fenced block."""
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        match = re.match(r"^\s*```(\S*)", lines[i])
        if not match:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].lstrip().startswith("```"):
            end += 1
        before = next((x for x in reversed(lines[:i]) if x.strip()), "")
        yield match[1], i + 2, lines[i + 1 : end], before
        i = end + 1


def _logical_lines(lines: list[str], first: int, console: bool):
    """(line number, text) of each command, backslash continuations joined."""
    pending, start = "", 0
    for n, raw in enumerate(lines, first):
        text = raw.strip()
        if not pending:
            if console:
                if not text.startswith("$ "):
                    continue
                text = text[2:]
            if not text or text.startswith("#"):
                continue
            start = n
        if text.endswith("\\"):
            pending += text[:-1].rstrip() + " "
            continue
        yield start, pending + text
        pending = ""


def _skip_reason(doc: str, text: str) -> str | None:
    bare = re.sub(r"\s+#.*$", "", text).strip()
    if (doc, bare) in KNOWN:
        return KNOWN[(doc, bare)]
    for pattern, reason, applies in SKIPS:
        if applies and re.search(pattern, text):
            return reason
    return None


def _name(path: Path) -> str:
    return path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)


def doc_commands(path: Path) -> list[Command]:
    doc = _name(path)
    commands = []
    for lang, first, lines, before in fenced_blocks(path):
        if lang not in SHELL and lang != "console":
            continue
        skip = SKIP_MARK.search(before)
        block_exit = EXIT_MARK.search(before)
        for n, text in _logical_lines(lines, first, console=lang == "console"):
            own_exit = EXIT_COMMENT.search(text)
            expect = int(own_exit[1]) if own_exit else int(block_exit[1]) if block_exit else 0
            reason = skip[1] if skip else _skip_reason(doc, text)
            commands.append(Command(doc, n, text, expect, reason))
    return commands


def untagged_command_blocks(path: Path) -> list[str]:
    found = []
    for lang, first, lines, _ in fenced_blocks(path):
        body = [x.strip() for x in lines if x.strip() and not x.strip().startswith("#")]
        if lang == "" and body and LOOKS_LIKE_A_COMMAND.match(body[0]):
            found.append(f"{_name(path)}:{first - 1}: {body[0]}")
    return found


DOCS_WITH_COMMANDS = [p for p in DOCS if doc_commands(p)]


def tool_path(tmp: Path) -> str:
    """PATH with this Python's kiln, doit and python first (shims where no script exists)."""
    bin_dir = Path(sys.executable).parent
    shims = tmp / "shims"
    shims.mkdir(exist_ok=True)
    for name, module in (("kiln", "kiln"), ("doit", "doit"), ("python", None), ("python3", None)):
        if (bin_dir / name).exists():
            continue
        shim = shims / name
        run = f'"{sys.executable}"' + (f" -m {module}" if module else "")
        shim.write_text(f'#!/bin/sh\nexec {run} "$@"\n')
        shim.chmod(0o755)
    return os.pathsep.join([str(shims), str(bin_dir), os.environ.get("PATH", "")])


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The example project, built once (``doit compile``), and the environment to run in."""
    tmp = tmp_path_factory.mktemp("docs")
    base = tmp / "example"
    base.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "build", ".kiln", ".doit.db*")
    for name in ("pipeline.yaml", "dodo.py"):
        shutil.copy2(REPO / name, base / name)
    for name in ("kernels", "apps", "docs/examples"):  # docs/examples: small projects of docs
        shutil.copytree(REPO / name, base / name, ignore=ignore)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env.update(
        PATH=tool_path(tmp),
        KILN_CACHE_DIR=str(tmp / "cache"),  # shared: IREE compiles once for every doc
        BROWSER="true",  # kiln view --open opens nothing
        NO_COLOR="1",
    )
    proc = run(Command("(setup)", 0, "doit compile"), base, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return base, env


def run(command: Command, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", command.text],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


@pytest.mark.parametrize("doc", DOCS_WITH_COMMANDS, ids=_name)
def test_every_command_in_the_doc_runs(doc: Path, example, tmp_path):
    base, env = example
    project = tmp_path / "project"
    shutil.copytree(base, project, symlinks=True)  # copy2 keeps mtimes: the copy is up to date
    failures, ran = [], 0
    for command in doc_commands(doc):
        if command.skip:
            print(f"skipped {command}  ({command.skip})")
            continue
        try:
            proc = run(command, project, env)
        except subprocess.TimeoutExpired:
            failures.append(f"{command}\n  timed out after {TIMEOUT_S} s")
            continue
        ran += 1
        output = proc.stdout + proc.stderr
        if proc.returncode != command.expect or "Traceback (most recent call last)" in output:
            tail = "\n".join("  | " + x for x in output.rstrip().splitlines()[-25:])
            failures.append(
                f"{command}\n  exit {proc.returncode} (the doc expects {command.expect})\n{tail}"
            )
    assert not failures, f"{len(failures)} of {ran} commands failed:\n\n" + "\n\n".join(failures)
    if ran == 0:
        pytest.skip(f"every command of {doc.name} is skipped here")


def test_command_blocks_are_tagged():
    found = [hit for path in DOCS for hit in untagged_command_blocks(path)]
    assert not found, (
        "fenced blocks that look like commands have no language: tag runnable ones ```sh "
        "(or ```console with $ lines) and synopses or output ```text:\n" + "\n".join(found)
    )


def test_extraction_reads_markers_continuations_and_console_prompts(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text(
        "```sh\nkiln compile   # build\nkiln bench problem:conv -N 1 \\\n    -C 8\n"
        "kiln test --target sim  # exit 1\n```\n\n"
        "<!-- docs-test: skip (needs a board) -->\n```bash\nkiln run x --target sim\n```\n"
        "<!-- expect-exit: 2 -->\n```console\n$ kiln nope\nerror: no such command\n```\n"
        "```\nkiln status\n```\n"
    )
    got = [(c.line, c.text, c.expect, c.skip) for c in doc_commands(doc)]
    assert got == [
        (2, "kiln compile   # build", 0, None),
        (3, "kiln bench problem:conv -N 1 -C 8", 0, None),
        (5, "kiln test --target sim  # exit 1", 1, None),
        (10, "kiln run x --target sim", 0, "needs a board"),
        (14, "kiln nope", 2, None),
    ]
    assert len(untagged_command_blocks(doc)) == 1
