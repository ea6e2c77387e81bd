"""The project lock (kiln/tasks/lock.py): one build at a time, for every entry point.

Unit tests take the lock in this process against holders in helper
processes; the end-to-end ones run `kiln`, `python -m kiln` and `doit`
side by side on one project.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kiln.tasks.dag.lock import LockBusy, acquire, holds_lock, lock_path, read_holder, release
from tests.conftest import REPO, run_kiln
from tests.support.processes import child_pids, is_alive
from tests.tasks.artifacts import clean_build, snapshot

# a helper that takes the lock, says so, and holds it for argv[2] seconds
HOLDER = """\
import sys, time
from pathlib import Path
from kiln.tasks.dag.lock import acquire
acquire(Path(sys.argv[1]), command="holder for a test")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


def start_holder(state_dir: Path, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(state_dir), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_busy_lock_without_wait_names_the_holder(tmp_path):
    holder = start_holder(tmp_path, 30)
    try:
        with pytest.raises(LockBusy) as caught:
            acquire(tmp_path, wait=False)
        assert f"pid {holder.pid}" in caught.value.message
        assert "holder for a test" in caught.value.message
        assert read_holder(lock_path(tmp_path)).pid == holder.pid
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("name", ["KILN_NO_WAIT", "KILN_FAIL_FAST"])
def test_a_switch_that_is_neither_on_nor_off_is_an_error(monkeypatch, name):
    from kiln.errors import KilnError
    from kiln.tasks.dag.loader import fail_fast_requested
    from kiln.tasks.dag.lock import no_wait_requested

    read = {"KILN_NO_WAIT": no_wait_requested, "KILN_FAIL_FAST": fail_fast_requested}[name]
    monkeypatch.setenv(name, "yes please")  # was taken as off without a word
    with pytest.raises(KilnError, match=f"{name} is not on or off"):
        read()
    for value, on in (("1", True), ("ON", True), ("0", False), ("", False)):
        monkeypatch.setenv(name, value)
        assert read() is on


def test_waiting_acquire_gets_the_lock_when_the_holder_exits(tmp_path, capsys):
    holder = start_holder(tmp_path, 0.5)
    acquire(tmp_path)
    try:
        assert holds_lock(tmp_path)
        assert f"waiting for pid {holder.pid}" in capsys.readouterr().err
        assert read_holder(lock_path(tmp_path)).pid == os.getpid()
    finally:
        release(tmp_path)
        holder.wait()
    assert not holds_lock(tmp_path)
    assert lock_path(tmp_path).read_text() == ""  # a clean release leaves no holder


def test_lock_is_reentrant_within_a_process(tmp_path):
    acquire(tmp_path)
    acquire(tmp_path)
    release(tmp_path)
    assert holds_lock(tmp_path)
    release(tmp_path)
    assert not holds_lock(tmp_path)


def test_forked_child_does_not_hold_the_lock(tmp_path):
    acquire(tmp_path)
    pid = os.fork()
    if pid == 0:  # the child outlives the parent's hold on the lock
        time.sleep(60)
        os._exit(0)
    try:
        release(tmp_path)
        code = (
            "import sys; from kiln.tasks.dag.lock import acquire; acquire(sys.argv[1], wait=False)"
        )
        check = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path)], capture_output=True, timeout=30
        )
        assert check.returncode == 0, check.stderr
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def test_lock_recorded_for_a_dead_pid_never_blocks(tmp_path, capsys):
    # an orphan still holds the flock, but the build it belonged to is gone
    orphan = start_holder(tmp_path, 30)
    record = {"pid": _dead_pid(), "host": socket.gethostname(), "command": "kiln compile"}
    lock_path(tmp_path).write_text(json.dumps(record))
    try:
        start = time.monotonic()
        acquire(tmp_path)
        assert time.monotonic() - start < 5
        assert "breaking the lock" in capsys.readouterr().err
        release(tmp_path)
    finally:
        orphan.kill()
        orphan.wait()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_no_wait_fails_fast_naming_the_holder_for_kiln_and_doit(project):
    shutil.copy(REPO / "dodo.py", project / "dodo.py")
    holder = start_holder(project / ".kiln", 60)
    try:
        start = time.monotonic()
        kiln = run_kiln(project, "compile", "--no-wait", timeout=60)
        doit = subprocess.run(
            [sys.executable, "-m", "doit", "compile"],
            cwd=project,
            env=dict(os.environ, KILN_NO_WAIT="1", KILN_CACHE_DIR=str(project / ".cache")),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert time.monotonic() - start < 30
    finally:
        holder.kill()
        holder.wait()
    for proc in (kiln, doit):
        assert proc.returncode == 2, proc.stderr
        assert f"locked by pid {holder.pid} (holder for a test)" in proc.stderr
        assert "Traceback" not in proc.stderr
    assert not (project / "build").exists()


def test_concurrent_kiln_python_m_kiln_and_doit_builds_agree(project):
    reference = clean_build(project)
    shutil.copy(REPO / "dodo.py", project / "dodo.py")
    env = dict(os.environ, KILN_CACHE_DIR=str(project / ".cache"))
    commands = [
        [sys.executable, "-m", "kiln", "compile"],
        [sys.executable, "-m", "kiln", "compile", "-n", "2"],
        [sys.executable, "-m", "doit", "compile"],
        [sys.executable, "-m", "doit", "-n", "2", "compile"],
    ]
    procs = [
        subprocess.Popen(c, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for c in commands
    ]
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], results
    waited = sum(b"waiting for pid" in err for _, err in results)
    assert waited >= 1, results  # they did contend, and the losers said whom they waited for
    holders = re.findall(
        rb"waiting for pid \d+ \((\w+) [^)]*compile[^)]*\)", b"".join(e for _, e in results)
    )
    assert holders and set(holders) <= {b"kiln", b"doit"}, results
    assert snapshot(project) == reference


def test_killed_parallel_build_leaves_no_worker_and_no_lock(project):
    reference = clean_build(project)
    children = Path("/proc/self/task")
    if not children.exists():
        pytest.skip("needs Linux /proc to find the workers")
    # the cache off: clean_build filled it, and a build of hits alone may end before
    # it forks its workers
    env = dict(os.environ, KILN_CACHE_DIR=str(project / ".cache"), KILN_CACHE="0")
    build = subprocess.Popen(  # -n 3: the build process and two workers
        [sys.executable, "-m", "kiln", "compile", "-n", "3"],
        cwd=project,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    workers: list[int] = []
    deadline = time.monotonic() + 60
    while len(workers) < 2 and build.poll() is None and time.monotonic() < deadline:
        workers = child_pids(build.pid)
        time.sleep(0.02)
    assert len(workers) >= 2, "the build never started its workers"
    build.kill()
    build.wait()
    deadline = time.monotonic() + 10
    while any(is_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(is_alive(w) for w in workers), "workers outlived their build"
    after = run_kiln(project, "compile", "--no-wait", timeout=120)
    assert after.returncode == 0, after.stderr
    assert snapshot(project) == reference


SLOW_KERNEL = """\
import time

from kiln import Tensor, device


@device
def slow_add(a: Tensor["N"]):
    time.sleep(0.4)  # at trace time: the build is surely mid-task when it is stopped
    return a + 1.0
"""


def test_sigterm_stops_a_build_as_ctrl_c_does(project):
    # CI cancels and `timeout` send SIGTERM: by default it killed the build where it
    # stood, doit never saved what was built (the next build redid it all) and
    # temp files stayed behind
    (project / "kernels" / "slow.py").write_text(SLOW_KERNEL)
    pipeline = project / "pipeline.yaml"
    sets = "".join(f"      s{n}: {{N: {64 * (n + 1)}}}\n" for n in range(6))
    pipeline.write_text(
        pipeline.read_text().replace("kernels:\n", f"kernels:\n  slow_add:\n    shapes:\n{sets}", 1)
    )
    env = dict(os.environ, KILN_CACHE="0")
    build = subprocess.Popen(
        [sys.executable, "-m", "kiln", "compile"],
        cwd=project,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    out = project / "build" / "kiln" / "kernel" / "slow_add"
    deadline = time.monotonic() + 60
    # two instances written: the first one's task has finished and doit recorded it (the
    # signal may land between an instance's last file and doit's record of its task)
    while len(list(out.glob("*/kernel.edf"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    build.terminate()
    _, err = build.communicate(timeout=60)
    assert build.returncode == 130, err
    assert "kiln: interrupted" in err and "Traceback" not in err
    assert not [p for p in (project / "build").rglob("*") if p.name.endswith(".tmp")]
    again = run_kiln(project, "compile", "--no-wait", env=env, timeout=120)
    assert again.returncode == 0, again.stderr
    assert re.search(r"tasks: \d+ ran, [1-9]\d* up to date", again.stdout), again.stdout


SIGTERM_SCRIPT = """
import os, signal, sys
from pathlib import Path
from kiln.interrupts import interrupted
from kiln.tasks.dag.lock import acquire, release

acquire(Path(sys.argv[1]))
pid = os.fork()
if pid == 0:  # a forked worker: SIGTERM must end it, not raise in it
    os.kill(os.getpid(), signal.SIGTERM)
    os._exit(0)  # not reached
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
try:
    os.kill(os.getpid(), signal.SIGTERM)
    signal.pthread_sigmask(signal.SIG_BLOCK, [])  # a point where the handler runs
    print("not interrupted")
except KeyboardInterrupt:
    print("interrupted", interrupted())
release(Path(sys.argv[1]))
print("after release", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
"""


def test_sigterm_is_the_builds_only_while_it_holds_the_lock_and_never_a_forked_childs(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", SIGTERM_SCRIPT, str(tmp_path)], capture_output=True, text=True
    )
    assert proc.stdout.splitlines() == [
        f"child {-signal.SIGTERM}",  # ended by it, as a worker must be
        "interrupted True",  # the build stops as on Ctrl-C, and says so
        "after release True",
    ], proc.stdout + proc.stderr


def test_a_child_forked_before_it_reset_sigterm_dies_of_it_without_a_word(monkeypatch):
    """A build stopping its workers can SIGTERM one in the moment after its fork, while
    it still has the build's handler: it must die as SIGTERM's default has it, not raise
    KeyboardInterrupt from inside the fork's own hooks (which prints a traceback)."""
    from kiln.tasks.dag import lock

    monkeypatch.setattr(lock, "_sigterm_owner", [os.getpid()])
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            lock._sigterm(signal.SIGTERM, None)
        except BaseException:
            os._exit(3)
        os._exit(0)
    _, status = os.waitpid(child, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status
