"""Atomic writes: new directories, early cutoff, and nothing half-written left behind."""

from __future__ import annotations

import os

import pytest

from kiln.fsutil import (
    remove_stale_tmp,
    stat_identity,
    write_bytes_atomic,
    write_with_identity,
)
from kiln.tempnames import temp_path, temp_target


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


@pytest.mark.parametrize("target", ["d/schedule.json", "/proc/x.xml", "a.b.c", "noext", ".hid"])
def test_a_temp_name_leads_back_to_the_file_it_is_written_for(target):
    assert temp_target(temp_path(target)) == target


@pytest.mark.parametrize(
    "name", ["x.tmp", ".x.12.tmp", ".x.12.zzzzzzzz.tmp", "kernel.edf", ".x.ab.12345678.tmp"]
)
def test_other_names_are_not_temp_names(name):
    assert temp_target(name) is None


def test_a_failed_write_names_the_temp_file_that_leads_to_the_target(tmp_path):
    (tmp_path / "schedule.json").mkdir()
    with pytest.raises(OSError) as info:
        write_bytes_atomic(tmp_path / "schedule.json", b"{}")
    assert temp_target(info.value.filename) == str(tmp_path / "schedule.json")


def test_stale_temp_files_of_a_killed_writer_are_removed(tmp_path):
    write_bytes_atomic(tmp_path / "kernel.lir", b"x")
    stale = tmp_path / ".kernel.lir.999999.deadbeef.tmp"
    stale.write_bytes(b"half")
    remove_stale_tmp(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["kernel.lir"]


def test_a_write_with_identity_names_the_file_as_written(tmp_path):
    target = str(tmp_path / "out" / "kernel.lir")
    identity = write_with_identity(target, b"lir bytes")
    assert identity == stat_identity(os.stat(target))
    assert open(target, "rb").read() == b"lir bytes"
    assert write_with_identity(target, b"lir bytes") is None  # held them: left alone
    assert write_with_identity(target, b"other bytes") != identity


def test_temp_names_never_repeat_in_a_process_or_its_forked_child(tmp_path):
    target = str(tmp_path / "kernel.edf")
    names = {temp_path(target) for _ in range(1000)}
    assert len(names) == 1000 and all(temp_target(name) == target for name in names)
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # the child's names carry its own pid, never its parent's
        os.write(writer, temp_path(target).encode())
        os._exit(0)
    os.close(writer)
    os.waitpid(child, 0)
    name = os.read(reader, 4096).decode()
    assert f".{child}." in name and name not in names


def test_a_symlink_is_replaced_by_the_file_never_written_through(tmp_path):
    from kiln.fsutil import write_bytes_atomic

    elsewhere = tmp_path / "elsewhere.lir"
    elsewhere.write_bytes(b"lir bytes")
    target = tmp_path / "kernel.lir"
    target.symlink_to(elsewhere)
    # the same bytes behind the link: still replaced, so the out dir holds a real file
    assert write_bytes_atomic(target, b"lir bytes") is True
    assert not target.is_symlink() and target.read_bytes() == b"lir bytes"
    assert elsewhere.read_bytes() == b"lir bytes"  # what it pointed at is left alone
    assert write_bytes_atomic(target, b"lir bytes") is False  # a real file: unchanged
