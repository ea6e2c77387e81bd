"""Plain `doit` on a Kiln project: its own runners, no chains sent ahead, the same bytes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO, run_kiln
from tests.tasks.artifacts import clean_build, snapshot, wipe


def doit(project, *args, env=None):
    full = dict(os.environ, KILN_CACHE_DIR=str(project / ".cache"), KILN_CACHE="0", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "doit", *args],
        cwd=project,
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def dodo_project(project):
    shutil.copy(REPO / "dodo.py", project / "dodo.py")
    return project


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_plain_doit_n_2_builds_the_bytes_of_kiln_compile(dodo_project, method):
    expected = clean_build(dodo_project)
    proc = doit(dodo_project, "-n", "2", "compile", env={"KILN_MP_START": method})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert snapshot(dodo_project) == expected
    again = doit(dodo_project, "-n", "2", "compile")
    assert "0 ran, 4 up to date" in again.stdout


def test_old_stage_task_names_map_to_the_instance_task(project):
    proc = run_kiln(project, "compile:gemm.small.lir", env={"KILN_CACHE": "0"})
    assert proc.returncode == 0, proc.stderr
    assert "compile:gemm.small.lir is compile:gemm.small now" in proc.stderr
    assert (project / "build/kiln/kernel/gemm/small/kernel.edf").is_file()


def test_records_of_old_stage_tasks_are_forgotten_once(project):
    import sqlite3

    run_kiln(project, "compile", check=True)
    db = project / ".kiln" / "doit.sqlite3"
    if not db.exists():
        db = next(p for p in (project / ".kiln").iterdir() if "sqlite" in p.name or "db" in p.name)
    conn = sqlite3.connect(db)
    conn.execute("insert into doit values (?, ?)", ("compile:gemm.small.visa", "{}"))
    conn.commit()
    conn.close()
    (project / ".kiln" / "layout-instance-tasks").unlink()
    run_kiln(project, "compile", check=True)
    conn = sqlite3.connect(db)
    ids = [row[0] for row in conn.execute("select task_id from doit")]
    conn.close()
    assert "compile:gemm.small.visa" not in ids and "compile:gemm.small" in ids
    wipe(project)


def test_plain_doit_warns_of_an_unused_dim_and_points_at_a_missing_device(dodo_project):
    pipe = dodo_project / "pipeline.yaml"
    text = pipe.read_text()
    pipe.write_text(text.replace("small: {N: 256}", "small: {N: 256, Z: 3}", 1))
    listed = doit(dodo_project, "list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stderr.count("warning: shape set 'small' of kernel 'vector_add' binds Z") == 1
    assert "which no argument of vector_add uses: the value is ignored" in listed.stderr

    with open(dodo_project / "kernels" / "vector_add.py", "a") as f:
        f.write("\n\ndef plain(x):\n    return x\n")
    pipe.write_text(text.replace("kernels:\n", "kernels:\n  plain: {shapes: {s: {N: 4}}}\n", 1))
    refused = doit(dodo_project, "list")
    assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
    assert "kernel 'plain' is not a @device function in any package" in refused.stderr
    assert "has no @device" in refused.stderr
    assert "hint: add `@device` (from kiln import device) above def plain" in refused.stderr
