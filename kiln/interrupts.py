"""Ctrl-C says one line, through `kiln` and through plain `doit` alike."""

from __future__ import annotations

import signal
import sys
import threading

INTERRUPTED = "kiln: interrupted"
_interrupted = threading.Event()


def note_interrupts() -> None:
    """Remember a Ctrl-C as it arrives, then raise KeyboardInterrupt as Python does.

    Ctrl-C reaches every process of the terminal's group: a Dask worker still
    starting dies of it, and a thread of the build may see the cluster go
    before the main thread has raised. ``interrupted()`` lets that thread keep
    quiet, so Ctrl-C still prints only ``INTERRUPTED``.
    """
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set a handler
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return  # ignored, or someone's own handler: leave it

    def handler(signum, frame):
        mark_interrupted()
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, handler)


def mark_interrupted() -> None:
    """Say the build is being stopped (Ctrl-C, or SIGTERM taken as one)."""
    _interrupted.set()


def interrupted() -> bool:
    """Whether Ctrl-C has reached this process (see ``note_interrupts``)."""
    return _interrupted.is_set()


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
