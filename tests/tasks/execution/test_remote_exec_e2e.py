"""Builds on a Dask cluster: `dask scheduler` and two `dask worker` processes on 127.0.0.1.

The artifacts equal a local build byte for byte, every stage ran on the
workers (none locally), a kernel edit is seen by the long-lived workers,
and a kernel that fails to compile reports exactly as it does locally.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, SMALL_PIPELINE, machines_yaml, run_kiln
from tests.support.outdir import build_bytes

pytest.importorskip("distributed", reason="the dask executor needs kiln[distributed]")

TASKS = 4  # one compile task per instance: its whole chain runs on one worker
STAGES = ["trace", "visa", "lir", "schedule", "edf"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def scheduler():
    """tcp address of a scheduler with two single-threaded worker processes."""
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    dask = shutil.which("dask", path=os.path.dirname(sys.executable)) or "dask"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = [
        subprocess.Popen(
            [dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
            **quiet,
        )
    ]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    for _ in range(2):
        procs.append(
            subprocess.Popen(
                [dask, "worker", address, "--nthreads", "1", "--no-dashboard"],
                **quiet,
            )
        )
    from distributed import Client

    with Client(address, timeout=30) as client:
        client.wait_for_workers(2, timeout=60)
    yield address
    for proc in reversed(procs):
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=30)


def make_project(base: Path, name: str) -> Path:
    project = base / name
    shutil.copytree(REPO / "kernels", project / "kernels", ignore=shutil.ignore_patterns("__py*"))
    (project / "pipeline.yaml").write_text(SMALL_PIPELINE + machines_yaml())
    return project


def artifacts(project: Path) -> dict[str, bytes]:
    return build_bytes(project)


LOG = {"KILN_LOG_INFO": "1", "KILN_LOG_FILE": "stderr"}


def test_dask_build_equals_local_build_and_sees_kernel_edits(scheduler, tmp_path):
    local = make_project(tmp_path, "local")
    remote = make_project(tmp_path, "remote")
    run_kiln(local, "compile", check=True)
    proc = run_kiln(remote, "compile", "--scheduler", scheduler, "-n", "2", env=LOG, check=True)
    assert f"(0 fetched, {TASKS} compiled)" in proc.stdout
    # no stage ran in this process: every chain ran, whole, on a worker (a profile lane
    # from 1 up names a process other than the build's)
    records = json.loads((remote / ".kiln" / "profile.json").read_text())["tasks"]
    ran = [r for r in records if r["outcome"] == "ran"]
    assert len(ran) == TASKS and all(r["worker"] >= 1 for r in ran), ran
    assert all([name for name, _, _ in r["stages"]] == STAGES for r in ran)
    assert artifacts(remote) == artifacts(local)

    # an edit to a kernel: the workers, which imported the old one, must trace the new one
    for project in (local, remote):
        path = project / "kernels" / "elementwise.py"
        path.write_text(path.read_text().replace("return a + b", "return a - b"))
    run_kiln(local, "compile", "vector_add", check=True)
    run_kiln(remote, "compile", "vector_add", "--scheduler", scheduler, check=True)
    assert artifacts(remote) == artifacts(local)


def test_kernel_failing_on_a_worker_reports_like_a_local_build(scheduler, tmp_path):
    outputs = []
    for name, flags in (("local", []), ("remote", ["--scheduler", scheduler])):
        project = make_project(tmp_path, name)
        path = project / "kernels" / "elementwise.py"
        path.write_text(path.read_text().replace("return a + b", "return a + b.reshape(3, 5)"))
        proc = run_kiln(project, "compile", "vector_add", *flags)
        assert proc.returncode == 1
        assert "Traceback" not in proc.stderr
        outputs.append(proc.stderr.replace(str(project), "<project>"))
    assert outputs[0] == outputs[1]
    assert "elementwise.py" in outputs[0]
