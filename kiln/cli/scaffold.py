"""`kiln init [DIR]`: a new project that compiles and tests the moment it is written.

Writes pipeline.yaml (project, packages, kernels and the two targets it
tests on; Kiln's built-in stages and machines fill in the rest), a copy of
its JSON Schema that pipeline.yaml's first line points editors at (a path
relative to the project, so it holds for anyone who clones it), a kernels
package with one example kernel, a pytest test of it, dodo.py for plain
`doit`, pyproject.toml (pytest settings), .gitignore and a README. It never
overwrites a file: if any exists, nothing is written.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from pathlib import Path

from kiln.errors import KilnError


def cmd_init(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    written = init_project(root, name=getattr(args, "name", None))
    shown = os.path.relpath(root.absolute(), Path.cwd())
    print(f"kiln: created project {project_name(root, args.name)!r} in {shown}")
    from kiln.logconfig import verbosity

    if verbosity() == 0:  # -q: the one line; the files and the next steps are for a reader
        return 0
    width = max(len(p) for p in written)
    for path in written:
        print(f"  {path:<{width}}  {DESCRIPTIONS[path]}")
    # "./": `cd -dash` would read the name as an option
    where = f"./{shown}" if shown.startswith("-") else shown
    steps = [(f"cd {shlex.quote(where)}", "")] if shown != "." else []
    steps += [
        ("kiln compile", "build the example kernel"),
        ("kiln test", "check the simulator against the cpu oracle"),
    ]
    if not have_pytest():  # Kiln's base install has no pytest: `python -m pytest` would fail
        steps.append(("pip install pytest", "pytest is not installed here; the next step needs it"))
    steps.append(("python -m pytest", "run the kernel's own test"))
    width = max(len(step) for step, _ in steps)
    print("next:")
    for step, why in steps:
        print(f"  {step:<{width}}  {why}".rstrip())
    return 0


def have_pytest() -> bool:
    """Whether this Python can run the new project's test (pytest is not one of Kiln's needs)."""
    import importlib.util

    return importlib.util.find_spec("pytest") is not None


def init_project(root: Path, name: str | None = None) -> list[str]:
    """Write the project's files under ``root``; their paths, relative to it.

    Raises KilnError (exit 2), writing nothing, when ``root`` is a file or any
    of the files already exists; an OSError midway takes back what was written.
    """
    if root.exists() and not root.is_dir():
        raise KilnError(
            f"cannot create a project in {root}: it is a file",
            expected="a directory (new or existing)",
            found=str(root),
        )
    files = project_files(project_name(root, name))
    existing = sorted(rel for rel in files if (root / rel).exists())
    if existing:
        raise KilnError(
            f"kiln init would overwrite {len(existing)} existing file(s) in {root}",
            found=", ".join(existing),
            hint="choose a new or empty directory (kiln init DIR), or move these files away; "
            "nothing was written",
        )
    made: list[Path] = []  # what this call created, to take back if a write fails
    try:
        for rel, text in files.items():
            path = root / rel
            new_dirs = [d for d in (path.parent, *path.parent.parents) if not d.exists()]
            path.parent.mkdir(parents=True, exist_ok=True)
            made += reversed(new_dirs)
            with open(path, "x", encoding="utf-8") as f:  # "x": never replace a file
                made.append(path)
                f.write(text)
    except OSError:
        _remove(made)  # a half-written project would make the retry refuse to overwrite
        raise
    return list(files)


def _remove(made: list[Path]) -> None:
    """Delete the files and then the directories ``made``, newest first, as far as possible."""
    for path in reversed(made):
        try:
            path.rmdir() if path.is_dir() else path.unlink()
        except OSError:
            pass


def project_name(root: Path, name: str | None = None) -> str:
    return name or root.absolute().resolve().name or "kiln-project"


def project_files(name: str) -> dict[str, str]:
    """Relative path -> text of every file a new project gets."""
    return {
        "pipeline.yaml": PIPELINE.format(schema=SCHEMA_FILE, name=yaml_string(name)),
        SCHEMA_FILE: schema_text(),
        "kernels/__init__.py": KERNELS_INIT,
        "kernels/example.py": EXAMPLE_KERNEL,
        "tests/test_example.py": EXAMPLE_TEST,
        "dodo.py": DODO,
        "pyproject.toml": PYPROJECT,
        ".gitignore": GITIGNORE,
        "README.md": README.format(name=name),
    }


def yaml_string(text: str) -> str:
    """``text`` as a YAML double-quoted scalar that keeps letters as typed.

    json.dumps alone writes 'プロジェクト' as "\\u30d7..."; only what a reader
    could not see (controls, line and paragraph separators) stays escaped.
    """
    quoted = json.dumps(text, ensure_ascii=False)
    return "".join(
        c if c.isprintable() else f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}"
        for c in quoted
    )


# The project's copy of pipeline.yaml's JSON Schema, next to it: pipeline.yaml's first
# line names it by a relative path, which the YAML language server resolves against the
# file, so it holds in every clone (an absolute path into one venv would not).
SCHEMA_FILE = "pipeline.schema.json"


def schema_text() -> str:
    """The JSON Schema this Kiln checks pipeline.yaml against, as the project keeps it."""
    from kiln.pipeline.schema import SCHEMA_PATH

    return SCHEMA_PATH.read_text(encoding="utf-8")


DESCRIPTIONS = {
    "pipeline.yaml": "what to build: kernels, shape sets, stages, machine, targets",
    SCHEMA_FILE: "pipeline.yaml's JSON Schema, for editors (`kiln config --schema` refreshes it)",
    "kernels/__init__.py": "the kernel package pipeline.yaml scans",
    "kernels/example.py": "one @device kernel: scale_add",
    "tests/test_example.py": "pytest: the kernel against numpy",
    "dodo.py": "lets plain `doit compile` build this project too",
    "pyproject.toml": "pytest settings (the project root on sys.path)",
    ".gitignore": "build outputs and Kiln's state stay out of git",
    "README.md": "the commands to start with",
}

PIPELINE = """\
# yaml-language-server: $schema={schema}
# What `kiln compile` (or plain `doit compile`) builds. Reference: Kiln's docs/pipeline.md.
project: {name}
out_dir: build/kiln/kernel

# Kernel packages: modules scanned for @device functions.
packages:
  - kernels

# Each kernel, and the sizes of its symbolic dims: one build per shape set.
kernels:
  scale_add:
    dtype: f32
    shapes:
      small: {{N: 1024}}
      large: {{N: 65536}}

# Kiln's built-in stages (trace, visa, lir, schedule, edf), machine models
# (npu-v1, the default, and npu-tiny) and targets fill in the rest: `kiln config`
# prints them. Write `stages:`, `machine:` or `machines:` here to change them.

# Where kernels run: `kiln test` checks every target against the cpu oracle.
# With `pip install 'kiln-kernels[iree]'`, add
#   iree-cpu: {{runner: iree, options: {{device: llvm-cpu}}}}
targets:
  cpu: {{runner: cpu}}
  sim: {{runner: sim, machine: npu-v1}}
"""

KERNELS_INIT = '"""This project\'s kernels: every @device function here can be built."""\n'

EXAMPLE_KERNEL = '''\
"""An example kernel: edit it, then `kiln compile` and `kiln test` (or `kiln watch`)."""

# ruff: noqa: F821  (Tensor["N"] names a symbolic dim, bound by pipeline.yaml's shapes)

from kiln import Tensor, device


@device
def scale_add(x: Tensor["N"], y: Tensor["N"]):
    """2 * x + y, elementwise: plain Python over tensors, with NumPy's semantics."""
    return 2.0 * x + y
'''

EXAMPLE_TEST = '''\
"""The example kernel, run eagerly on numpy arrays (the cpu target), against numpy."""

import numpy as np

from kernels.example import scale_add


def test_scale_add_matches_numpy():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1024).astype(np.float32)
    y = rng.standard_normal(1024).astype(np.float32)
    np.testing.assert_allclose(scale_add(x, y), 2.0 * x + y, rtol=1e-6)
'''

DODO = '''\
"""`doit compile` here: hands pipeline.yaml's tasks to plain doit (`kiln compile` needs no dodo)."""

from kiln.tasks.dag.loader import dodo_namespace

globals().update(dodo_namespace())
'''

PYPROJECT = """\
# pytest finds the kernels package from the project root.
[tool.pytest.ini_options]
testpaths = ["tests"]
pythonpath = ["."]

# plain `doit dumpdb` reads Kiln's state file (sqlite3), as `kiln dumpdb` does, and
# `doit info` of a name that is no task is one line, as `kiln info` says it
[tool.doit.plugins.command]
dumpdb = "kiln.tasks.dag.doit_commands:KilnDumpDB"
info = "kiln.tasks.dag.doit_commands:KilnInfo"
"""

GITIGNORE = """\
# Kiln's build outputs and state
build/
.kiln/
# Python
.venv/
__pycache__/
.pytest_cache/
"""

README = """\
# {name}

Compute kernels built with Kiln.

- `kernels/`: `@device` kernels; `pipeline.yaml` says which to build, at which shapes
- `kiln compile`: build every kernel (or `kiln compile scale_add`); `doit compile` works too
- `kiln test`: check every target of pipeline.yaml against the cpu oracle
- `kiln watch --target sim`: rebuild and test on every save
- `kiln status`: what would rebuild, and why
- `python -m pytest`: the kernels' own tests (`pip install pytest` first: Kiln does not need it)
- `pipeline.schema.json`: what editors check pipeline.yaml against; `kiln config --schema`
  refreshes it after an upgrade of Kiln
- `kiln help`: every command
"""
