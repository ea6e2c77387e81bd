"""`-n` workers (kiln/tasks/workers.py): any start method, same bytes, no heavy imports to spare."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import run_kiln
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
