"""Point trace errors at the kernel author's own line, never at Kiln's stack (STYLE 9).

The rule: walk the traceback to the innermost frame that is user code,
that is, not inside the ``kiln`` package and not inside an installed
library or the standard library. Errors that have no line of their own
(an unbound dim, a bad return value) point at the kernel's ``def`` line,
its parameter, or its single ``return`` statement.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import os
import sysconfig
import textwrap
import traceback
from collections.abc import Callable
from types import TracebackType

from kiln.errors import Location, TraceError

_KILN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIBRARY_DIRS = tuple(
    sorted(
        {
            os.path.abspath(p)
            for key in ("stdlib", "platstdlib", "purelib", "platlib")
            if (p := sysconfig.get_paths().get(key))
        }
    )
)


DOCS_NOTE = "docs/language.md lists every op with its NumPy equivalent"


class UnsupportedAttributeError(TraceError, AttributeError):
    """``tensor.cumsum()`` and friends: a TraceError that ``hasattr`` still understands."""


def unknown_name(owner: str, name: str, known) -> AttributeError:
    """The error for ``kiln.<name>`` that is not an op: nearest names and where to look."""
    import difflib

    if name.startswith("__"):
        return AttributeError(f"module {owner!r} has no attribute {name!r}")
    close = difflib.get_close_matches(name, sorted(known), n=3)
    return UnsupportedAttributeError(
        f"{owner}.{name} is not a kiln op",
        hint=("did you mean " + " or ".join(f"{owner}.{c}" for c in close) + "?")
        if close
        else None,
        notes=[DOCS_NOTE],
    )


# Python operators NumPy has and kiln does not: symbol -> (NumPy's name, how to write it)
UNSUPPORTED_OPERATORS = {
    "//": ("floor_divide", "kiln.floor(a / b)"),
    "%": ("remainder", "a - kiln.floor(a / b) * b"),
    "divmod": ("divmod", "kiln.floor(a / b) and a - kiln.floor(a / b) * b"),
    "<<": ("left_shift", None),
    ">>": ("right_shift", None),
}


def unsupported_operator(symbol: str) -> TraceError:
    """The error for ``a // b`` and friends: the operator is not a kiln op (not a user bug)."""
    name, spelled = UNSUPPORTED_OPERATORS[symbol]
    shown = f"{symbol}()" if symbol.isalpha() else f"`{symbol}`"
    return TraceError(
        f"{shown} ({name}) is not a kiln op",
        hint=f"write {spelled}" if spelled else None,
        notes=[DOCS_NOTE],
    )


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def is_kiln_file(filename: str) -> bool:
    return _inside(os.path.abspath(filename), _KILN_DIR)


def is_library_file(filename: str) -> bool:
    if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return True
    path = os.path.abspath(filename)
    return any(_inside(path, root) for root in _LIBRARY_DIRS)


def source_line(filename: str, line: int) -> str | None:
    text = linecache.getline(filename, line)
    return text.rstrip("\r\n") if text else None


def frame_location(tb: TracebackType | None) -> Location | None:
    """Location of the innermost user frame of ``tb`` (library frames only as a fallback)."""
    frames = traceback.extract_tb(tb)
    picked = None
    for frame in reversed(frames):
        if not is_kiln_file(frame.filename) and not is_library_file(frame.filename):
            picked = frame
            break
    if picked is None:
        picked = next((f for f in reversed(frames) if not is_kiln_file(f.filename)), None)
    if picked is None or picked.lineno is None:
        return None
    column = picked.colno + 1 if getattr(picked, "colno", None) is not None else None
    return Location(
        file=picked.filename,
        line=picked.lineno,
        column=column,
        source=source_line(picked.filename, picked.lineno),
    )


def _function_ast(fn: Callable) -> tuple[ast.FunctionDef | ast.AsyncFunctionDef, int] | None:
    """The function's own AST node and the file line its source starts at."""
    try:
        lines, start = inspect.getsourcelines(fn)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node, max(start, 1)
    return None


def _at(fn: Callable, line: int) -> Location:
    filename = fn.__code__.co_filename
    return Location(file=filename, line=line, source=source_line(filename, line))


def def_location(fn: Callable) -> Location:
    """The kernel's ``def`` line."""
    found = _function_ast(fn)
    if found is None:
        return _at(fn, fn.__code__.co_firstlineno)
    node, start = found
    return _at(fn, start + node.lineno - 1)


def param_location(fn: Callable, name: str) -> Location:
    """The line of parameter ``name`` in the kernel's signature (else the ``def`` line)."""
    found = _function_ast(fn)
    if found is not None:
        node, start = found
        args = node.args
        for arg in [*args.posonlyargs, *args.args, args.vararg, *args.kwonlyargs, args.kwarg]:
            if arg is not None and arg.arg == name:
                return _at(fn, start + arg.lineno - 1)
    return def_location(fn)


def return_location(fn: Callable) -> Location:
    """The kernel's ``return`` statement when it has exactly one, else its ``def`` line."""
    found = _function_ast(fn)
    if found is None:
        return def_location(fn)
    node, start = found
    returns = [n for n in _own_nodes(node) if isinstance(n, ast.Return)]
    if len(returns) == 1:
        return _at(fn, start + returns[0].lineno - 1)
    return def_location(fn)


def _own_nodes(fn_node: ast.AST):
    """Nodes of a function body, not descending into nested functions, lambdas or classes."""
    stack = list(ast.iter_child_nodes(fn_node))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def located(exc: TraceError, location: Location | None) -> TraceError:
    """Give ``exc`` a location unless it already has one."""
    if exc.location is None and location is not None:
        exc.location = location
    return exc
