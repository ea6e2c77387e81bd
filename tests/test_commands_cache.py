"""`kiln cache` helpers: sizes as people write them, and executor flags."""

from __future__ import annotations

import argparse
import os

import pytest

from kiln.commands_cache import apply_executor_flags, parse_size
from kiln.errors import KilnError


@pytest.mark.parametrize(
    "text, size",
    [("0", 0), ("1024", 1024), ("500M", 500 * 1024**2), ("2G", 2 * 1024**3), ("1.5KiB", 1536)],
)
def test_sizes_with_units(text, size):
    assert parse_size(text) == size


def test_a_bad_size_names_the_flag():
    with pytest.raises(KilnError) as info:
        parse_size("lots")
    assert "--max-size" in info.value.message and info.value.found == "lots"


def test_a_scheduler_implies_the_dask_executor(monkeypatch):
    env: dict[str, str] = {}
    monkeypatch.setattr(os, "environ", env)  # the flags must not leak into other tests
    args = argparse.Namespace(executor=None, scheduler="tcp://h:8786", process=3)
    apply_executor_flags(args)
    assert env == {"KILN_EXECUTOR": "dask", "KILN_SCHEDULER": "tcp://h:8786", "KILN_JOBS": "3"}
