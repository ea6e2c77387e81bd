"""What pipeline.yaml says about a kernel, checked against the kernel itself, for people.

Two things the project model would otherwise accept in silence or say vaguely:

- a shape set that binds a dim no argument of the kernel uses (``Z: 3``) is
  accepted, its value ignored: one warning at its line says so;
- a kernel listed in pipeline.yaml whose function exists but lacks
  ``@device`` is "not a @device function in any package": the error names
  the function's file and line and says to add ``@device``.

The project model (tasks/model/project.py) calls both while it loads, so every
entry point, plain ``doit`` included, gets them.
"""

from __future__ import annotations

from pathlib import Path

from kiln.errors import KilnError, PipelineError


def unused_dims(pipeline, kernels: dict) -> list[KilnError]:
    """One warning per kernel and dim that shape sets bind but no argument of it uses.

    ``kernels``: kernel name -> its source (``params``: (argument, dims) pairs).
    """
    found = []
    warned = set()  # an entry with a dtype list is several kernels: one warning for it
    for spec in pipeline.kernels:
        source = kernels.get(spec.name)
        entry = spec.entry or spec.name
        if source is None or entry in warned:
            continue
        used = {d for _, dims in source.params for d in dims or () if isinstance(d, str)}
        unused: dict[str, list[tuple[str, object]]] = {}  # dim -> (shape set, value)
        for set_name, bindings in spec.shapes:
            for dim, value in bindings:
                if dim not in used:
                    unused.setdefault(dim, []).append((set_name, value))
        if not unused:
            continue  # the usual case, on every load of every kernel
        warned.add(entry)
        args = ", ".join(
            f"{arg}[{', '.join(map(str, dims))}]" if dims else arg for arg, dims in source.params
        )
        for dim, sets in unused.items():  # one warning per dim, however many sets bind it
            set_name, value = sets[0]
            which = f"shape set {set_name!r}"
            if len(sets) > 1:
                which = "shape sets " + ", ".join(repr(s) for s, _ in sets)
            found.append(
                KilnError(
                    f"{which} of kernel {entry!r} bind{'s' * (len(sets) == 1)} {dim}, "
                    f"which no argument of {source.name} uses: the value is ignored",
                    location=pipeline.locate(f"{spec.key_path}.shapes.{set_name}.{dim}"),
                    expected="dims of its arguments: " + (", ".join(sorted(used)) or "(none)"),
                    found=f"{dim}: {value}; {source.name}({args})",
                    hint=f"remove {dim}, or name it in an argument's Tensor[...] annotation",
                    kind="warning",
                )
            )
    return found


def point_at_plain_function(err: PipelineError, root: Path, packages, name: str) -> None:
    """A "not a @device function" error for a function that exists: say where, add @device."""
    short = name.rsplit(".", 1)[-1]
    try:
        where = plain_function(root, packages, short)
    except Exception:  # only a better hint: the error stands as it is
        return
    if where is None:
        return
    file, line = where
    err.notes.append(f"{file}:{line}: def {short}(...) has no @device")
    err.hint = f"add `@device` (from kiln import device) above def {short}"


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
