"""`-n` workers (tasks/execution/pool.py, tasks/execution/workers.py): any start method, same
bytes, no heavy imports to spare. The builds that must reach the pool run with KILN_CACHE=0: a
chain the artifact cache holds is written by its own task and never sent to a worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tests.conftest import run_kiln
from tests.support.ctrl_c import answer_ctrl_c
from tests.support.processes import child_pids, is_alive
from tests.tasks.artifacts import clean_build, snapshot

NO_CACHE = {"KILN_CACHE": "0"}  # every chain is compiled: the pool's workers run them


def profile(project) -> list[dict]:
    """The records of the compile tasks the last build ran (.kiln/profile.json)."""
    records = json.loads((project / ".kiln" / "profile.json").read_text())["tasks"]
    return [r for r in records if r["outcome"] == "ran"]


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_parallel_build_under_start_method_matches_a_plain_build(project, method):
    reference = clean_build(project)
    env = dict(NO_CACHE, KILN_MP_START=method)
    proc = run_kiln(project, "compile", "-n", "2", env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "4 ran, 0 up to date, 0 failed (0 fetched, 4 compiled)" in proc.stdout
    assert snapshot(project) == reference
    # every chain ran in a pool worker (lanes 1 and 2), none in the build process (lane 0)
    ran = profile(project)
    assert len(ran) == 4 and {r["worker"] for r in ran} <= {1, 2}


def test_unknown_start_method_is_a_clear_error(project):
    proc = run_kiln(project, "compile", "-n", "2", env={"KILN_MP_START": "vfork"})
    assert proc.returncode == 2
    assert "unknown multiprocessing start method 'vfork' in KILN_MP_START" in proc.stderr
    assert "expected: one of: " in proc.stderr and "spawn" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_parent_imports_the_stages_once_before_forking_workers():
    code = """
import multiprocessing, sys
from kiln.tasks.execution.workers import prepare_workers
prepare_workers(["kiln.stages.visa"])
assert "kiln.stages.visa" not in sys.modules
ctx = multiprocessing.get_context("fork")
p = ctx.Process(target=print)
p.start(); p.join()
print("kiln.stages.visa" in sys.modules, "numpy" in sys.modules, p.exitcode)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[-3:] == ["True", "True", "0"]


def test_a_parallel_build_from_a_warm_cache_writes_whole_chains_and_the_same_bytes(project):
    # one cache entry per chain: each task writes its whole chain from the cache
    reference = clean_build(project)  # fills the local cache
    proc = run_kiln(project, "compile", "-n", "2")
    assert proc.returncode == 0, proc.stderr
    assert "4 ran, 0 up to date, 0 failed (4 fetched, 0 compiled)" in proc.stdout
    assert snapshot(project) == reference
    # nothing was compiled: no chain's stage ran, here or in a worker
    ran = profile(project)
    assert len(ran) == 4 and all("stages" not in r for r in ran)
    again = run_kiln(project, "compile", "-n", "2")
    assert "0 ran, 4 up to date" in again.stdout, again.stdout
    # every file the walk wrote is in its instance's manifest: `kiln clean` removes it
    run_kiln(project, "clean", check=True)
    assert [name for name in snapshot(project) if not name.endswith(".json")] == []


def test_the_profile_of_a_parallel_build_names_the_worker_of_each_task(project):
    proc = run_kiln(project, "compile", "-n", "2", env=NO_CACHE)
    assert proc.returncode == 0, proc.stderr
    ran = profile(project)
    # one task per instance, each run by one of the two pool workers (lanes 1 and 2)
    assert sorted(r["task"] for r in ran) == [
        "compile:gemm.small",
        "compile:gemm.wide",
        "compile:softmax.small",
        "compile:vector_add.small",
    ]
    assert {r["worker"] for r in ran} <= {1, 2}
    # each record holds its chain's stage spans, in order, within the task's own times
    stages = ["trace", "visa", "lir", "schedule", "edf"]
    for r in ran:
        assert [name for name, _, _ in r["stages"]] == stages
        assert r["start"] == r["stages"][0][1] <= r["stages"][-1][2] == r["end"]
    # the times are the worker's own: one worker's tasks never overlap
    for worker in (1, 2):
        spans = sorted((r["start"], r["end"]) for r in ran if r["worker"] == worker)
        assert all(a[0] <= a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))


def test_ctrl_c_stops_a_parallel_build_cleanly_and_the_next_build_finishes_it(project):
    # enough instances that the build is still running when Ctrl-C comes
    pipeline = yaml.safe_load((project / "pipeline.yaml").read_text())
    for spec in pipeline["kernels"].values():
        spec["shapes"] = {
            f"{name}_{copy}": dims for copy in range(40) for name, dims in spec["shapes"].items()
        }
    (project / "pipeline.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
    reference = clean_build(project)
    env = dict(os.environ, KILN_CACHE_DIR=str(project / ".cache"), **NO_CACHE)
    build = subprocess.Popen(
        [sys.executable, "-m", "kiln", "compile", "-n", "2"],
        cwd=project,
        env=env,
        preexec_fn=answer_ctrl_c,
        start_new_session=True,  # its own process group, as a terminal's job is
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (workers := child_pids(build.pid)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert workers and build.poll() is None, "the build never started its worker"
    os.killpg(build.pid, signal.SIGINT)  # Ctrl-C reaches the whole group
    out, err = build.communicate(timeout=60)
    assert build.returncode == 130, out + err
    assert "kiln: interrupted" in err and "Traceback" not in out + err
    deadline = time.monotonic() + 10
    while any(is_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(is_alive(w) for w in workers), "a worker outlived the build"
    assert not [p for p in (project / "build").rglob("*.tmp")], "a half-written file was left"
    done = run_kiln(project, "compile", "-n", "2", "--no-wait")
    assert done.returncode == 0, done.stderr
    assert snapshot(project) == reference
