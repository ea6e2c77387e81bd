"""`doit compile test`, the one-command CI form, on a clean copy with an empty cache."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO, SMALL_PIPELINE, machines_yaml

HAS_IREE = importlib.util.find_spec("iree") is not None and (
    importlib.util.find_spec("iree.compiler") is not None
)
SIM = "  sim: {runner: sim, machine: npu-v1}\n"
UNAVAILABLE = "  iree-cuda: {runner: iree, options: {device: cuda}}\n  board: {runner: npu}\n"


def doit(root, *args):
    env = dict(os.environ, KILN_CACHE_DIR=str(root / ".cache"))
    env.pop("KILN_OUT_DIR", None)
    return subprocess.run(
        [sys.executable, "-m", "doit", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_doit_compile_test_on_a_clean_copy(tmp_path):
    if not HAS_IREE:
        pytest.skip("the iree-cpu target needs the [iree] extra")
    shutil.copytree(
        REPO / "kernels", tmp_path / "kernels", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(REPO / "dodo.py", tmp_path / "dodo.py")
    targets = SIM + "  iree-cpu: {runner: iree}\n" + UNAVAILABLE
    (tmp_path / "pipeline.yaml").write_text(SMALL_PIPELINE.replace(SIM, targets) + machines_yaml())

    first = doit(tmp_path, "compile", "test")
    text = first.stdout + first.stderr
    assert first.returncode == 0, text
    assert "Traceback" not in text and "string argument expected" not in text
    # 4 compile tasks (one per instance), 4 instances x (sim, iree-cpu) tests; iree-cuda and
    # board cannot run here
    assert "20 tasks: 12 ran, 0 up to date, 0 failed, 8 skipped (target unavailable)" in text
    assert "skipped test:gemm.small@board: no hardware runner plugin" in text
    assert "skipped test:gemm.small@iree-cuda: " in text
    reports = sorted(p.name for p in (tmp_path / "build").rglob("test-*.json"))
    assert reports == sorted(["test-sim.json", "test-iree-cpu.json"] * 4)

    again = doit(tmp_path, "compile", "test")
    assert again.returncode == 0
    assert "0 ran, 12 up to date, 0 failed, 8 skipped (target unavailable)" in again.stdout
