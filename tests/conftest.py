"""Shared fixtures: temporary Kiln projects and a way to run the CLI in them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.pipelines import STAGES

REPO = Path(__file__).resolve().parent.parent

SMALL_PIPELINE = (
    """\
project: e2e
packages: [kernels]
machine: npu-v1
kernels:
  vector_add:
    shapes:
      small: {N: 256}
  softmax:
    shapes:
      small: {R: 8, C: 64}
  gemm:
    shapes:
      small: {M: 32, K: 32, N: 32}
      wide: {M: 32, K: 64, N: 64}
"""
    + STAGES
    + """\
targets:
  cpu: {runner: cpu}
  sim: {runner: sim, machine: npu-v1}
machines:
"""
)


def machines_yaml() -> str:
    text = (REPO / "pipeline.yaml").read_text()
    return text.split("machines:\n", 1)[1].split("\ntargets:")[0] + "\n"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A small project: a copy of the example kernels and a three-kernel pipeline."""
    shutil.copytree(
        REPO / "kernels", tmp_path / "kernels", ignore=shutil.ignore_patterns("__pycache__")
    )
    (tmp_path / "pipeline.yaml").write_text(SMALL_PIPELINE + machines_yaml())
    return tmp_path


def run_kiln(
    cwd: Path, *args: str, env: dict | None = None, check: bool = False, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Run the `kiln` CLI as a user would, in ``cwd``."""
    full_env = dict(os.environ, KILN_CACHE_DIR=str(cwd / ".cache"))
    full_env.pop("KILN_OUT_DIR", None)
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "kiln", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"kiln {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def ran_tasks(proc: subprocess.CompletedProcess) -> list[str]:
    """Task names a plain-output build executed (lines '. compile:...')."""
    return [line[2:] for line in proc.stdout.splitlines() if line.startswith(". ")]
