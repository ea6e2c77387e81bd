"""The one exception family the CLI turns into a message and an exit code."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Location:
    """Where a diagnostic points: a file, optionally a line/column and a key path."""

    file: str
    line: int | None = None
    column: int | None = None
    key_path: str | None = None
    source: str | None = None  # the offending source line, shown under the header

    def header(self) -> str:
        text = self.file
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

    def __post_init__(self) -> None:
        Exception.__init__(self, self.message)

    def __str__(self) -> str:
        return self.render()

    def render(self) -> str:
        """Human form: `file:line:col: error: message` plus detail lines."""
        head = f"{self.kind}: {self.message}"
        if self.location is not None:
            head = f"{self.location.header()}: {head}"
        lines = [head]
        loc = self.location
        if loc is not None and loc.key_path:
            lines.append(f"  at key: {loc.key_path}")
        if loc is not None and loc.source is not None:
            lines.append(f"  | {loc.source.rstrip()}")
            if loc.column is not None:
                lines.append("  | " + " " * max(loc.column - 1, 0) + "^")
        if self.expected is not None:
            lines.append(f"  expected: {self.expected}")
        if self.found is not None:
            lines.append(f"  found: {self.found}")
        lines.extend(f"  note: {note}" for note in self.notes)
        if self.hint:
            lines.append(f"  hint: {self.hint}")
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
        }


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
