"""A Dask problem never hangs a build: real schedulers and LocalClusters that fail.

A scheduler without workers is one warning and a local build; Ctrl-C
during a LocalCluster build prints `kiln: interrupted` and nothing else
(no worker tracebacks, no Dask log lines), and leaves no process behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kiln.tasks.execution.chain_worker import WORKER_NICENESS
from tests.conftest import run_kiln
from tests.support.ctrl_c import answer_ctrl_c
from tests.support.polling import wait_until
from tests.tasks.execution.test_remote_exec_e2e import free_port

pytest.importorskip("distributed", reason="the dask executor needs kiln[distributed]")

# Tracing sleeps, so that 300 instances surely take longer than the time it takes
# the Ctrl-C test to see the first kernel.edf and send SIGINT (a loaded CI machine
# once let the whole build finish in that time).
KERNEL = """import time

from kiln import Tensor, device


@device
def scale_add(x: Tensor["N"], y: Tensor["N"]):
    time.sleep(0.03)
    return 2.0 * x + y
"""


def many_instances(base: Path, count: int) -> Path:
    """A project of one small kernel at ``count`` shape sets (five tasks each)."""
    project = base / "p"
    (project / "kernels").mkdir(parents=True)
    (project / "kernels" / "__init__.py").write_text("")
    (project / "kernels" / "example.py").write_text(KERNEL)
    shapes = "\n".join(f"      s{i}: {{N: {1024 + 64 * i}}}" for i in range(count))
    (project / "pipeline.yaml").write_text(
        f'project: "p"\npackages: [kernels]\n'
        f"kernels:\n  scale_add:\n    dtype: f32\n    shapes:\n{shapes}\n"
    )
    return project


def test_a_scheduler_nobody_listens_at_is_one_warning_and_a_local_build(tmp_path):
    project = many_instances(tmp_path, 3)
    address = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    proc = run_kiln(project, "compile", "--scheduler", address, timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("kiln: warning:") == 1, proc.stderr
    assert f"cannot reach the Dask scheduler {address} (from --scheduler)" in proc.stderr
    assert "building the rest locally" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert len(list((project / "build").rglob("kernel.edf"))) == 3


def test_a_scheduler_without_workers_is_one_warning_and_a_local_build(tmp_path):
    port = free_port()
    dask = shutil.which("dask", path=os.path.dirname(sys.executable)) or "dask"
    scheduler = subprocess.Popen(
        [dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        project = many_instances(tmp_path, 4)
        wait_until(lambda: _listening(port), 30)
        started = time.monotonic()
        proc = run_kiln(project, "compile", "--scheduler", f"tcp://127.0.0.1:{port}", timeout=90)
        took = time.monotonic() - started
    finally:
        scheduler.terminate()
        scheduler.wait(timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("kiln: warning:") == 1
    assert "has had no workers for 10 s; building the rest locally" in proc.stderr
    assert len(list((project / "build").rglob("kernel.edf"))) == 4
    assert took < 60


def test_ctrl_c_during_a_local_cluster_build_says_interrupted_only(tmp_path):
    project = many_instances(tmp_path, 300)
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("KILN_OUT_DIR", None)
    # its own session: Ctrl-C at a terminal reaches every process of the group
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln", "compile", "-q", "--executor", "dask", "-n", "1"],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=answer_ctrl_c,  # a run started in the background ignores SIGINT
    )
    try:
        wait_until(lambda: any((project / "build").rglob("kernel.edf")), 60)
        assert proc.poll() is None, "the build ended before Ctrl-C: give it more instances"
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert err.strip() == "kiln: interrupted", err
    assert "Traceback" not in out
    assert not [p for p in (project / "build").rglob("*") if ".tmp" in p.name]
    wait_until(lambda: not _group_alive(proc.pid), 30)  # the workers are gone too


def _listening(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads signal masks in /proc")
def test_local_cluster_workers_are_born_with_ctrl_c_blocked_below_the_build_with_the_stages():
    # Ctrl-C during the cluster's start used to kill a worker mid-import, which
    # printed a KeyboardInterrupt traceback; the workers must be born deaf to it
    from kiln.tasks.execution import remote_exec
    from kiln.tasks.execution.local_cluster import local_client

    client = local_client({"workers": 1})
    try:
        workers = list(client.run(os.getpid).values())
        blocked = [_blocked_signals(pid) for pid in workers]
        niceness = [os.getpriority(os.PRIO_PROCESS, pid) for pid in workers]
        preloaded = client.run(lambda: "kiln.stages.lir" in sys.modules)
    finally:
        remote_exec._close(client)
    assert len(blocked) == 1
    assert all(mask & (1 << (signal.SIGINT - 1)) for mask in blocked), blocked
    # ... while the build's own threads still take it
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    # they yield the CPU to the build process, and start with the stages imported
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert niceness == [min(mine + WORKER_NICENESS, 19)], niceness
    assert list(preloaded.values()) == [True]


def _blocked_signals(pid: int) -> int:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return int(next(line for line in lines if line.startswith("SigBlk:")).split()[1], 16)
