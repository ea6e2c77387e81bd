"""Waiting in tests for something another thread does, without fixed sleeps."""

from __future__ import annotations

import time


def wait_until(predicate, seconds: float = 10.0) -> None:
    """Poll ``predicate`` until it holds; fail the test after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)
