"""`-n` workers (kiln/tasks/workers.py): any start method, same bytes, no heavy imports to spare."""

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


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_parallel_build_under_start_method_matches_a_plain_build(project, method):
    reference = clean_build(project)
    proc = run_kiln(project, "compile", "-n", "2", env={"KILN_MP_START": method}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "20 ran, 0 up to date, 0 failed" in proc.stdout
    assert snapshot(project) == reference


def test_unknown_start_method_is_a_clear_error(project):
    proc = run_kiln(project, "compile", "-n", "2", env={"KILN_MP_START": "vfork"})
    assert proc.returncode == 2
    assert "unknown multiprocessing start method 'vfork' in KILN_MP_START" in proc.stderr
    assert "expected: one of: " in proc.stderr and "spawn" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_parent_imports_the_stages_once_before_forking_workers():
    code = """
import multiprocessing, sys
from kiln.tasks.workers import prepare_workers
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
    # each chain's tasks all run in one worker (tasks/affinity.py), so its first task
    # writes the chain from the cache and the later ones find their artifact settled
    reference = clean_build(project)  # fills the local cache
    log = project / "cache.log"
    env = {"KILN_LOG_INFO": "1", "KILN_LOG_FILE": str(log)}
    proc = run_kiln(project, "compile", "-n", "2", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "20 ran, 0 up to date, 0 failed (20 fetched, 0 compiled)" in proc.stdout
    assert snapshot(project) == reference
    # 4 instances: each first stage found in the cache, its 4 later stages written ahead
    lines = log.read_text().splitlines()
    ahead = [line for line in lines if line.endswith("(written ahead)")]
    assert len(ahead) == 16 and all(" hit from cache " in line for line in ahead), lines
    again = run_kiln(project, "compile", "-n", "2")
    assert "0 ran, 20 up to date" in again.stdout, again.stdout
    # every file the walk wrote is in its instance's manifest: `kiln clean` removes it
    run_kiln(project, "clean", check=True)
    assert [name for name in snapshot(project) if not name.endswith(".json")] == []


def test_the_profile_of_a_parallel_build_names_the_worker_of_each_task(project):
    proc = run_kiln(project, "compile", "-n", "2")
    assert proc.returncode == 0, proc.stderr
    records = json.loads((project / ".kiln" / "profile.json").read_text())["tasks"]
    ran = [r for r in records if r["outcome"] == "ran"]
    assert len(ran) == 20 and {r["worker"] for r in ran} <= {0, 1}
    # a chain's stages all ran on the worker that ran its first one (tasks/affinity.py)
    by_instance: dict[str, set[int]] = {}
    for r in ran:
        by_instance.setdefault(r["task"].rsplit(".", 1)[0], set()).add(r["worker"])
    assert len(by_instance) == 4 and all(len(w) == 1 for w in by_instance.values())
    # the times are the worker's own: one worker's tasks never overlap
    for worker in (0, 1):
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
    env = dict(os.environ, KILN_CACHE_DIR=str(project / ".cache"))
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
