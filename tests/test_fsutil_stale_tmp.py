"""kiln/fsutil.py: temp files of killed writers are removed, a live writer's are kept."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from kiln.fsutil import remove_stale_tmp
from kiln.tempnames import writer_pid


def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], text=True,
                          capture_output=True, check=True)  # fmt: skip
    return int(proc.stdout)


def test_writer_pid_reads_every_temp_name_kiln_makes():
    assert writer_pid(".kernel.edf.123.abcdef12.tmp") == 123
    assert writer_pid(".kernel.edf.123.12345678.tmp") == 123  # an all-digit hex part
    assert writer_pid("visa-0a1b.json.456.tmp") == 456
    assert writer_pid("discovery.tmp789") == 789
    assert writer_pid("pipeline-1f.pickle.42.k3j_2lx.tmp") == 42
    assert writer_pid("notes.tmp") is None and writer_pid("kernel.edf") is None


def test_stale_temp_files_go_and_live_ones_stay(tmp_path):
    dead = dead_pid()
    stale = [f".kernel.edf.{dead}.abcd1234.tmp", f"x.json.{dead}.tmp", f"discovery.tmp{dead}"]
    live = f".kernel.lir.{os.getppid()}.abcd1234.tmp"  # a process that is alive
    for name in [*stale, live, "kernel.edf", "user.tmp"]:
        (tmp_path / name).write_text("x")
    remove_stale_tmp(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live, "kernel.edf", "user.tmp"])


def test_a_dead_writer_not_yet_reaped_leaves_no_temp_file(tmp_path):
    # a killed build's worker, reparented to a PID 1 that never reaps it (many
    # containers): its pid still answers kill(pid, 0), yet it writes nothing more
    if not os.path.exists("/proc/self/stat"):
        pytest.skip("needs Linux /proc")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 10
        while b") Z" not in open(f"/proc/{child.pid}/stat", "rb").read():
            assert time.monotonic() < deadline
        stale = tmp_path / f".kernel.lir.{child.pid}.0123abcd.tmp"
        stale.write_bytes(b"half")
        remove_stale_tmp(tmp_path)
        assert not stale.exists()
    finally:
        child.wait()
