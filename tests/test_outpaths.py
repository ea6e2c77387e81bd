"""Files a command line names: written into a device or FIFO, through a symlink, never replacing
either (kiln/outpaths.py)."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from kiln.fsutil import write_bytes_atomic
from kiln.outpaths import check_output, write_output


def _atomic(data: bytes):
    return lambda p: write_bytes_atomic(p, data)


def test_a_plain_path_is_written_by_the_writer_itself(tmp_path):
    target = tmp_path / "sub" / "s.json"
    seen = []
    write_output(target, lambda p: (seen.append(p), write_bytes_atomic(p, b"{}")))
    assert seen == [target] and target.read_bytes() == b"{}"


def test_a_symlink_is_written_through_and_stays_a_link(tmp_path):
    real = tmp_path / "real.json"
    real.write_bytes(b"old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_output(link, _atomic(b"new bytes"))
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_bytes() == b"new bytes"


def test_a_dangling_symlink_creates_the_file_it_names(tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "made.json")
    write_output(link, _atomic(b"made"))
    assert link.is_symlink() and (tmp_path / "made.json").read_bytes() == b"made"


def _read_fifo(path: Path, into: list) -> threading.Thread:
    thread = threading.Thread(target=lambda: into.append(path.read_bytes()), daemon=True)
    thread.start()
    return thread


def test_a_fifo_is_written_into_not_replaced(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    check_output("--dump-schedule", fifo)  # writable: no probe file beside it
    got: list[bytes] = []
    reader = _read_fifo(fifo, got)
    write_output(fifo, _atomic(b"through the pipe"))
    reader.join(10)
    assert got == [b"through the pipe"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_a_device_node_is_written_into_not_replaced(tmp_path):
    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    write_output(null, _atomic(b"discarded"))
    assert stat.S_ISCHR(os.lstat(null).st_mode)


def test_an_unwritable_special_file_is_refused_up_front(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo, 0o444)
    if os.access(fifo, os.W_OK):  # root writes anything
        pytest.skip("this user can write a read-only FIFO")
    from kiln.errors import KilnError

    with pytest.raises(KilnError, match="--junit: cannot write"):
        check_output("--junit", fifo)


def test_dev_stdout_redirected_to_a_log_is_appended_to_not_replaced(tmp_path):
    """/dev/stdout -> /proc/self/fd/1 -> the log: replacing (or truncating) what the
    links resolve to lost every line printed before it."""
    import subprocess
    import sys

    script = (
        "from pathlib import Path\n"
        "from kiln.fsutil import write_bytes_atomic\n"
        "from kiln.outpaths import write_output\n"
        "print('before', flush=True)\n"
        "write_output(Path('/dev/stdout'), lambda p: write_bytes_atomic(p, b'<xml/>\\n'))\n"
        "print('after')\n"
    )
    log = tmp_path / "log.txt"
    with open(log, "w") as out:
        subprocess.run([sys.executable, "-c", script], stdout=out, check=True)
    assert log.read_text() == "before\n<xml/>\nafter\n"
