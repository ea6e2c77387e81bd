"""What pipeline.yaml says about a kernel, checked against the kernel itself, for people.

Two things the project model accepts in silence or says vaguely:

- a shape set that binds a dim no argument of the kernel uses (``Z: 3``) is
  accepted, its value ignored: one warning at its line says so;
- a kernel listed in pipeline.yaml whose function exists but lacks
  ``@device`` was "not a @device function in any package": the error now
  names the function's file and line and says to add ``@device``.

``checked_project`` is how Kiln's commands find their project with both.
(They belong in the project model, tasks/project.py, where every entry
point, plain ``doit`` included, would get them; the commands call them here
until it does.)
"""

from __future__ import annotations

import sys
from pathlib import Path

from kiln.errors import KilnError, PipelineError


def checked_project():
    """``Project.find()``, warning about unused dims and pointing at a missing ``@device``."""
    from kiln.tasks.project import Project

    try:
        project = Project.find()
    except PipelineError as err:
        _point_at_plain_function(err)
        raise
    for warning in unused_dims(project.pipeline, project.kernels):
        print(warning.render(), file=sys.stderr, flush=True)
    return project


def unused_dims(pipeline, kernels: dict) -> list[KilnError]:
    """One warning per shape-set binding of a dim that no argument of its kernel uses.

    ``kernels``: kernel name -> its source (``params``: (argument, dims) pairs).
    """
    found = []
    for spec in pipeline.kernels:
        source = kernels.get(spec.name)
        if source is None:
            continue
        used = {d for _, dims in source.params for d in dims or () if isinstance(d, str)}
        args = ", ".join(
            f"{arg}[{', '.join(map(str, dims))}]" if dims else arg for arg, dims in source.params
        )
        for set_name, bindings in spec.shapes:
            for dim, value in bindings:
                if dim in used:
                    continue
                found.append(
                    KilnError(
                        f"shape set {set_name!r} of kernel {spec.name!r} binds {dim}, which no "
                        f"argument of {source.name} uses: the value is ignored",
                        location=pipeline.locate(f"kernels.{spec.name}.shapes.{set_name}.{dim}"),
                        expected="dims of its arguments: " + (", ".join(sorted(used)) or "(none)"),
                        found=f"{dim}: {value}; {source.name}({args})",
                        hint=f"remove {dim}, or name it in an argument's Tensor[...] annotation",
                        kind="warning",
                    )
                )
    return found


def _point_at_plain_function(err: PipelineError) -> None:
    """A "not a @device function" error for a function that exists: say where, add @device."""
    suffix = " is not a @device function in any package"
    if not (err.message.startswith("kernel ") and err.message.endswith(suffix)):
        return
    name = err.message[len("kernel ") : -len(suffix)].strip("'\"")
    location = err.location
    if location is None or not location.file:
        return
    try:
        from kiln.tasks.project import find_pipeline

        root = find_pipeline().parent
        from kiln.pipeline import load_pipeline

        packages = load_pipeline(root / "pipeline.yaml").packages
    except Exception:  # only a better hint: the error stands as it is
        return
    where = plain_function(root, packages, name.rsplit(".", 1)[-1])
    if where is None:
        return
    file, line = where
    err.notes.append(f"{file}:{line}: def {name.rsplit('.', 1)[-1]}(...) has no @device")
    err.hint = f"add `@device` (from kiln import device) above def {name.rsplit('.', 1)[-1]}"


def plain_function(root: Path, packages, name: str) -> tuple[str, int] | None:
    """(file, line) of a top-level ``def name`` in the packages' modules (discovery found
    no @device one, so this one lacks it)."""
    import ast

    for package in packages:
        base = root.joinpath(*package.split("."))
        files = sorted(base.rglob("*.py")) if base.is_dir() else [base.with_suffix(".py")]
        for file in files:
            try:
                tree = ast.parse(file.read_text(encoding="utf-8"))
            except (OSError, SyntaxError, ValueError):
                continue
            for node in tree.body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                    return file.relative_to(root).as_posix(), node.lineno
    return None
