"""Atomic writes: new directories, early cutoff, and nothing half-written left behind."""

from __future__ import annotations

import os

import pytest

from kiln.fsutil import remove_stale_tmp, write_bytes_atomic


def test_a_write_makes_missing_directories(tmp_path):
    target = tmp_path / "a" / "b" / "kernel.edf"
    assert write_bytes_atomic(target, b"bytes") is True
    assert target.read_bytes() == b"bytes"
    assert os.listdir(target.parent) == ["kernel.edf"]  # no temp file left


def test_the_same_bytes_leave_the_file_and_its_mtime_alone(tmp_path):
    target = tmp_path / "graph.json"
    write_bytes_atomic(target, b"{}")
    os.utime(target, ns=(1_000_000_000, 1_000_000_000))
    assert write_bytes_atomic(target, b"{}") is False
    assert target.stat().st_mtime_ns == 1_000_000_000
    assert write_bytes_atomic(target, b"{1}") is True
    assert target.read_bytes() == b"{1}"


def test_a_file_where_the_directory_belongs_is_an_error_and_writes_nothing(tmp_path):
    (tmp_path / "out").write_bytes(b"not a directory")
    with pytest.raises(OSError):
        write_bytes_atomic(tmp_path / "out" / "kernel.lir", b"x")
    assert (tmp_path / "out").read_bytes() == b"not a directory"


def test_stale_temp_files_of_a_killed_writer_are_removed(tmp_path):
    write_bytes_atomic(tmp_path / "kernel.lir", b"x")
    stale = tmp_path / ".kernel.lir.999999.deadbeef.tmp"
    stale.write_bytes(b"half")
    remove_stale_tmp(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["kernel.lir"]
