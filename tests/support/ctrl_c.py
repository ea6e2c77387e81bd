"""Child processes that a test stops with Ctrl-C (SIGINT)."""

from __future__ import annotations

import signal


def answer_ctrl_c() -> None:
    """``preexec_fn`` for a child a test will interrupt: SIGINT back to its default.

    A test run started in the background by a non-interactive shell (``cmd &``)
    ignores SIGINT, its children inherit that, and a Python child that starts
    with SIGINT ignored never raises KeyboardInterrupt: Ctrl-C would do nothing.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
