"""`kiln tune` end to end: records written, applied, current on a rerun, stale on edit."""

import json
import os
import signal
import subprocess
import sys
import time

from tests.conftest import ran_tasks, run_kiln
from tests.support.ctrl_c import answer_ctrl_c


def makespan(project, instance: str) -> int:
    kernel, shapes = instance.split(".")
    proc = run_kiln(project, "inspect", f"build/kiln/kernel/{kernel}/{shapes}/kernel.edf")
    line = next(x for x in proc.stdout.splitlines() if '"makespan_cycles"' in x)
    return int(line.split(":")[1].strip().rstrip(","))


def records(project) -> dict:
    lines = (project / "tuning.jsonl").read_text().splitlines()
    return {r["instance"]: r for r in map(json.loads, lines)}


def test_tune_compile_rerun_and_stale(project):
    run_kiln(project, "compile", "vector_add", check=True)
    before = makespan(project, "vector_add.small")
    tuned = run_kiln(project, "tune", "vector_add", "--budget", "24", "--seed", "1", check=True)
    assert "kiln tune: 1 tuned, 0 current, 24 trials" in tuned.stdout
    record = records(project)["vector_add.small"]
    assert record["default_cycles"] == before
    assert record["tuned_cycles"] <= before and record["trials"] == 24
    first_bytes = (project / "tuning.jsonl").read_bytes()

    # compile applies the record: the binary's makespan is the tuned one
    build = run_kiln(project, "compile", "vector_add", check=True)
    assert "compile:vector_add.small.trace" not in ran_tasks(build)
    assert makespan(project, "vector_add.small") == record["tuned_cycles"]

    # a second tune with the record present performs no trial
    again = run_kiln(project, "tune", "vector_add", "--budget", "24", "--seed", "1", check=True)
    assert "0 tuned, 1 current, 0 trials" in again.stdout
    assert (project / "tuning.jsonl").read_bytes() == first_bytes

    # the same budget and seed give the same record from scratch
    (project / "tuning.jsonl").unlink()
    run_kiln(project, "tune", "vector_add", "--budget", "24", "--seed", "1", check=True)
    assert (project / "tuning.jsonl").read_bytes() == first_bytes

    # an edit that changes the graph makes the record stale: ignored, and status says so
    src = project / "kernels" / "elementwise.py"
    src.write_text(src.read_text().replace("return a + b", "return a + b * 1.0", 1))
    run_kiln(project, "compile", "vector_add", check=True)
    with_stale_record = (project / "build/kiln/kernel/vector_add/small/kernel.edf").read_bytes()
    (project / "tuning.jsonl").rename(project / "away.jsonl")
    run_kiln(project, "compile", "vector_add", check=True)
    untuned = (project / "build/kiln/kernel/vector_add/small/kernel.edf").read_bytes()
    assert with_stale_record == untuned
    (project / "away.jsonl").rename(project / "tuning.jsonl")
    status = run_kiln(project, "status", "vector_add")
    assert "vector_add.small: tuning record ignored (stale: graph changed)" in status.stdout
    show = run_kiln(project, "tune", "--show", "vector_add", check=True)
    assert "stale" in show.stdout


def test_bad_tune_input_is_one_message(project):
    proc = run_kiln(project, "tune", "vector_add", "--budget", "0")
    assert proc.returncode == 2 and "--budget must be at least 1" in proc.stderr
    (project / "tuning.jsonl").write_text('{"instance": 3\n')
    proc = run_kiln(project, "tune", "vector_add")
    assert proc.returncode == 2
    assert "tuning.jsonl:1" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_kiln(project, "compile", "vector_add")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr + proc.stdout


def test_ctrl_c_keeps_the_records_found_so_far(project):
    env = dict(os.environ, KILN_CACHE_DIR=str(project / ".cache"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln.cli", "tune", "vector_add", "gemm", "--budget", "5000"],
        cwd=project,
        preexec_fn=answer_ctrl_c,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (project / "tuning.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    # at once: on a quiet machine the rest of the search (about 1,500 trials) takes
    # barely a second, and a run that ended already could not show Ctrl-C
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err
    kept = records(project)
    assert "vector_add.small" in kept
    assert all(r["tuned_cycles"] <= r["default_cycles"] for r in kept.values())


def test_trials_priced_on_a_dask_cluster_give_the_same_record(project, tmp_path_factory):
    import shutil

    import pytest

    pytest.importorskip("distributed", reason="the dask executor needs kiln[distributed]")
    other = tmp_path_factory.mktemp("tune") / "on-dask"
    shutil.copytree(project, other)
    args = ("tune", "gemm", "--shapes", "small", "--budget", "40", "--seed", "3", "-n", "2")
    run_kiln(project, *args, check=True)
    priced = run_kiln(other, *args, "--executor", "dask", check=True)
    assert "40 trials" in priced.stdout
    assert (other / "tuning.jsonl").read_text() == (project / "tuning.jsonl").read_text()
