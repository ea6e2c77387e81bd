"""Ctrl-C says one line, through `kiln` and through plain `doit` alike."""

from __future__ import annotations

import sys

INTERRUPTED = "kiln: interrupted"


def quiet_interrupt_traceback() -> None:
    """Make an uncaught KeyboardInterrupt print ``INTERRUPTED`` instead of a traceback.

    Plain `doit` lets Ctrl-C escape its main; only the printing changes here:
    Python still ends the process by SIGINT (exit status 130 in a shell), and
    every other uncaught exception goes to the hook that was there before.
    """
    previous = sys.excepthook
    if getattr(previous, "kiln_quiet_interrupt", False):
        return

    def hook(kind, value, tb):
        if issubclass(kind, KeyboardInterrupt):
            print(INTERRUPTED, file=sys.stderr, flush=True)
            return
        previous(kind, value, tb)

    hook.kiln_quiet_interrupt = True
    sys.excepthook = hook
