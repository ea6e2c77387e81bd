"""A closed stdout or stderr (``kiln status | head -1``) is not an error and does not stop
a build.

Writes after the reader went away are dropped: the first BrokenPipeError
points file descriptor 1 at /dev/null, so the rest of the run (and
Python's own flush at exit) writes nowhere instead of raising.
"""

from __future__ import annotations

import os
import sys


class PipeSafeStream:
    """Wraps a text stream; a broken pipe turns it into a sink."""

    def __init__(self, stream):
        self._stream = stream
        self.broken = False

    def _sink(self) -> None:
        self.broken = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass

    def write(self, text: str) -> int:
        if self.broken:
            return len(text)
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._sink()
            return len(text)

    def flush(self) -> None:
        if self.broken:
            return
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._sink()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def guard_stdout() -> None:
    """Make ``sys.stdout`` and ``sys.stderr`` pipe-safe (once; harmless to call again).

    stderr too: ``kiln status nosuch 2>&1 | true`` lost its error message to the
    closed pipe and then its exit status (1 for the unwritable message, not 2).
    """
    if not isinstance(sys.stdout, PipeSafeStream) and sys.stdout is not None:
        sys.stdout = PipeSafeStream(sys.stdout)
    if not isinstance(sys.stderr, PipeSafeStream) and sys.stderr is not None:
        sys.stderr = PipeSafeStream(sys.stderr)
