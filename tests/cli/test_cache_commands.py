"""`kiln cache` helpers: sizes as people write them, and executor flags."""

from __future__ import annotations

import argparse
import os

import pytest

from kiln.cli.cache_commands import apply_executor_flags, cmd_cache, parse_size
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


@pytest.mark.parametrize("record", ['"x"', "[1]", '{"hit": null}', '{"hit": "many"}'])
def test_stats_ignore_a_damaged_last_build_record(tmp_path, monkeypatch, capsys, record):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "last-build.json").write_text(record)
    assert cmd_cache(argparse.Namespace(cache_command="stats")) == 0
    out = capsys.readouterr().out
    assert "last build: no record" in out and "None" not in out


@pytest.mark.parametrize("command", ["stats", "verify"])
def test_a_cache_dir_that_is_a_file_is_an_error_not_an_empty_store(tmp_path, monkeypatch, command):
    (tmp_path / "afile").write_text("hi\n")
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "afile"))
    with pytest.raises(KilnError) as caught:
        cmd_cache(argparse.Namespace(cache_command=command))
    assert "is not a directory" in caught.value.render() and "KILN_CACHE_DIR" in caught.value.hint
