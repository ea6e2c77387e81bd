"""Kiln's logs: off by default; KILN_LOG_INFO=1 turns on info logs.

KILN_LOG_FILE says where they go: ``stdout``, ``stderr`` (the default) or a
file path (appended to). Every Kiln logger is a child of ``kiln``.
"""

from __future__ import annotations

import logging
import os
import sys

_configured = False


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"kiln.{name}")


def setup_logging() -> None:
    """Configure the ``kiln`` logger from the environment (once per process)."""
    global _configured
    if _configured or os.environ.get("KILN_LOG_INFO") != "1":
        return
    dest = os.environ.get("KILN_LOG_FILE", "stderr")
    if dest == "stdout":
        handler: logging.Handler = logging.StreamHandler(sys.stdout)
    elif dest == "stderr":
        handler = logging.StreamHandler(sys.stderr)
    else:
        handler = logging.FileHandler(dest)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    logger = logging.getLogger("kiln")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    _configured = True
