"""Kiln's logs and how much it says: logs are off by default; KILN_LOG_INFO=1 turns
on info logs.

KILN_LOG_FILE says where they go: ``stdout``, ``stderr`` (the default) or a
file path (appended to). Every Kiln logger is a child of ``kiln``.
KILN_VERBOSITY (what -q, the default and -v set) says how much a command prints.
"""

from __future__ import annotations

import logging
import os
import sys

from kiln.errors import KilnError
from kiln.interrupts import interrupted

_configured = False
VERBOSITY_ENV = "KILN_VERBOSITY"
VERBOSITY_LEVELS = {"0": 0, "1": 1, "2": 2}  # -q, the default, -v


def warn(text: str) -> None:
    """A warning on the real stderr: doit swaps sys.stdout/sys.stderr inside actions.

    None after Ctrl-C: what fails then (a worker killed by it, a connection
    cut) is the interrupt's doing, and the build says only that it was interrupted.
    """
    if interrupted():
        return
    stream = sys.__stderr__ or sys.stderr
    print(f"kiln: warning: {text}", file=stream, flush=True)


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"kiln.{name}")


def setup_logging() -> None:
    """Configure the ``kiln`` logger from the environment (once per process)."""
    global _configured
    if _configured or os.environ.get("KILN_LOG_INFO") != "1":
        return
    dest = os.environ.get("KILN_LOG_FILE", "").strip() or "stderr"  # empty: the default
    if dest == "stdout":
        handler: logging.Handler = logging.StreamHandler(sys.stdout)
    elif dest == "stderr":
        handler = logging.StreamHandler(sys.stderr)
    else:
        try:
            handler = logging.FileHandler(dest)
        except OSError as exc:
            raise KilnError(
                "KILN_LOG_FILE cannot be opened for the logs",
                expected="stdout, stderr, or the path of a file Kiln may write (appended to)",
                found=f"{dest}: {exc.strerror or type(exc).__name__}",
                hint="point KILN_LOG_FILE at a writable file, or unset it (logs go to stderr)",
            ) from None
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    logger = logging.getLogger("kiln")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    _configured = True


def verbosity() -> int:
    """0 with -q, 2 with -v, 1 otherwise: KILN_VERBOSITY, which the kiln command sets.

    Another value is an error, not a guess: ``abc`` must not silently mean
    the default, nor ``7`` mean -v.
    """
    raw = os.environ.get(VERBOSITY_ENV, "").strip()
    if not raw:
        return 1
    if raw not in VERBOSITY_LEVELS:
        raise KilnError(
            f"{VERBOSITY_ENV} is not a verbosity level",
            expected="0 (as -q: failures and the summary), 1 (the default) or 2 (as -v)",
            found=os.environ[VERBOSITY_ENV],
            hint=f"set {VERBOSITY_ENV} to 0, 1 or 2, or unset it (-q and -v set it)",
        )
    return VERBOSITY_LEVELS[raw]
