"""The one exception family the CLI turns into a message and an exit code."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

# A source excerpt longer than this is clipped around the column it points at:
# a 10,000-deep nesting must not print a 20,000-character line.
MAX_EXCERPT = 160
_CONTROL = {i: f"\\x{i:02x}" for i in (*range(0x20), 0x7F) if i not in (0x09,)}
_CONTROL.update({0x0A: "\\n", 0x0D: "\\r", 0x1B: "\\x1b"})


def printable(text: object) -> str:
    """``text`` with control characters escaped (``\\x1b``, ``\\n``, ``\\x00``).

    Names come from user files; printed raw, an escape sequence in one
    would drive the terminal and a newline would forge a message line.
    """
    return str(text).translate(_CONTROL)


def relative_path(path: object, root: object = None) -> str:
    """``path`` relative to ``root`` (default: the cwd) when it lies inside it."""
    text = str(path)
    try:
        base = os.fspath(root) if root is not None else os.getcwd()
        rel = os.path.relpath(text, base)
    except (OSError, ValueError):
        return text
    return text if rel == ".." or rel.startswith(".." + os.sep) else rel


def clip_excerpt(source: str, column: int | None) -> tuple[str, int | None]:
    """A source line cut to MAX_EXCERPT characters around ``column`` (shifted to match)."""
    if len(source) <= MAX_EXCERPT:
        return source, column
    col = (column or 1) - 1
    start = max(0, min(col - MAX_EXCERPT // 2, len(source) - MAX_EXCERPT))
    text = source[start : start + MAX_EXCERPT]
    prefix = "..." if start else ""
    suffix = "..." if start + MAX_EXCERPT < len(source) else ""
    new_col = None if column is None else col - start + len(prefix) + 1
    return prefix + text + suffix, new_col


@dataclass
class Location:
    """Where a diagnostic points: a file, optionally a line/column and a key path."""

    file: str
    line: int | None = None
    column: int | None = None
    key_path: str | None = None
    source: str | None = None  # the offending source line, shown under the header

    def header(self) -> str:
        text = printable(relative_path(self.file))
        if self.line is not None:
            text += f":{self.line}"
            if self.column is not None:
                text += f":{self.column}"
        return text


@dataclass
class KilnError(Exception):
    """A user-facing error: never shown as a traceback.

    ``message`` says what went wrong; ``expected``/``found`` say what was
    wanted and what was given; ``hint`` is an optional suggestion.
    """

    message: str
    location: Location | None = None
    expected: str | None = None
    found: str | None = None
    hint: str | None = None
    kind: str = "error"
    notes: list[str] = field(default_factory=list)
    # what failures of many instances share (a machine too small for any tile): they are
    # printed once, with the instances they hit (tasks/chain/failure_groups.py)
    cause: str | None = None

    def __post_init__(self) -> None:
        Exception.__init__(self, self.message)

    def __str__(self) -> str:
        return self.render()

    def render(self) -> str:
        """Human form: `file:line:col: error: message` plus detail lines."""
        head = f"{self.kind}: {printable(self.message)}"
        if self.location is not None:
            head = f"{self.location.header()}: {head}"
        lines = [head]
        loc = self.location
        if loc is not None and loc.key_path:
            lines.append(f"  at key: {printable(loc.key_path)}")
        if loc is not None and loc.source is not None:
            raw = loc.source.rstrip()
            column = loc.column
            if column is not None:  # escaping widens the text before the caret too
                column = len(printable(raw[: column - 1])) + 1
            source, column = clip_excerpt(printable(raw), column)
            lines.append(f"  | {source}")
            if column is not None:
                lines.append("  | " + " " * max(column - 1, 0) + "^")
        if self.expected is not None:
            lines.append(f"  expected: {printable(self.expected)}")
        if self.found is not None:
            lines.append(f"  found: {printable(self.found)}")
        for note in self.notes:  # a KILN_DEBUG traceback note keeps its own lines
            lines.append("  note: " + "\n".join(map(printable, str(note).splitlines())))
        if self.hint:
            lines.append(f"  hint: {printable(self.hint)}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """Machine form for `--message-format json`."""
        loc = self.location
        return {
            "kind": self.kind,
            "message": self.message,
            "file": loc.file if loc else None,
            "line": loc.line if loc else None,
            "column": loc.column if loc else None,
            "key_path": loc.key_path if loc else None,
            "source": loc.source if loc else None,
            "expected": self.expected,
            "found": self.found,
            "hint": self.hint,
            "notes": list(self.notes),
        } | ({"cause": self.cause} if self.cause else {})


class Abort(BaseException):
    """Carries a KilnError through a library that turns any Exception into a traceback.

    doit prints the traceback of every Exception raised while it loads
    tasks; this one is not an Exception, so it reaches the entry point
    (the `kiln` CLI or a dodo.py), which prints ``error`` and exits.
    """

    def __init__(self, error: KilnError):
        super().__init__(error.message)
        self.error = error


class PipelineError(KilnError):
    """pipeline.yaml is malformed or refers to something that does not exist."""


class TraceError(KilnError):
    """A @device kernel could not be traced; the location is the kernel's own line."""


class StageError(KilnError):
    """A compiler stage rejected its input (tile too big, op it cannot lower, ...)."""


class VerifyError(KilnError):
    """An IR invariant was broken after a stage: names the stage, instruction and rule."""


class ArtifactError(KilnError):
    """An artifact on disk is missing, truncated or corrupt."""


class TargetError(KilnError):
    """An execution target is unknown, unavailable, or failed to run a kernel."""


class EnvironmentProblem(KilnError):
    """The machine, not the input: a full disk, a permission, a file where a dir belongs."""


_OS_HINTS = {
    "ENOSPC": "the disk is full: free some space and run again (nothing built was lost)",
    "EDQUOT": "the disk quota is used up: free some space and run again",
    "EACCES": "check the permissions of this path, or point Kiln elsewhere",
    "EPERM": "check the permissions of this path, or point Kiln elsewhere",
    "EROFS": "the file system is read-only: point out_dir / KILN_CACHE_DIR at a writable place",
    "ENOTDIR": "a part of this path is a file where Kiln needs a directory: move it away",
    "EEXIST": "a file is in the way where Kiln needs a directory: move it away",
    "EISDIR": "a directory is in the way where Kiln needs a file: move it away",
    "ELOOP": "a symbolic link loop: fix or remove the link",
}


def environment_error(exc: OSError, doing: str | None = None) -> EnvironmentProblem:
    """One message for an OSError: what failed, on which path, and what to do."""
    import errno

    from kiln.tempnames import temp_target

    code = errno.errorcode.get(exc.errno or 0, "")
    reason = exc.strerror or type(exc).__name__
    path, other = exc.filename, exc.filename2
    target = temp_target(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else None
    if target is not None:  # an atomic write's temp file: name the file being written
        path = target
        if other is not None and os.fspath(other) == target:
            other = None  # the rename onto it
    what = doing or ("cannot use " + (relative_path(path) if path else "a file"))
    message = f"{what}: {reason}"
    if other:
        message += f" (and {relative_path(other)})"
    return EnvironmentProblem(
        message,
        Location(str(path)) if path else None,
        hint=_state_dir_hint(path, code)
        or _OS_HINTS.get(code, "fix the file system problem above and run again"),
    )


def _state_dir_hint(path, code: str) -> str | None:
    """.kiln/ sits beside pipeline.yaml, and neither out_dir nor KILN_CACHE_DIR moves it."""
    if code not in ("EROFS", "EACCES", "EPERM") or path is None:
        return None
    if ".kiln" not in os.path.normpath(os.fspath(path)).split(os.sep):
        return None
    return (
        "Kiln keeps the project's build state in .kiln/ beside pipeline.yaml: "
        "make it writable, or build in a writable copy of the project"
    )


class BuildFailed(KilnError):
    """Some kernels did not build; their diagnostics were printed already (exit 1)."""

    exit_code = 1
