"""A broken kernel does not stop the build: every other kernel builds, tests and benches.

`kiln compile`, `doit compile`, `kiln test` and `kiln bench` in a temporary
project with one kernel that cannot be traced.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.conftest import REPO, run_kiln

GOOD = ["vector_add.small", "softmax.small", "gemm.small", "gemm.wide"]

BROKEN_KERNEL = '''\
"""A kernel that cannot be traced: its matmul's inner dimensions differ."""

from kiln import Tensor, device


@device
def broken_matmul(a: Tensor["M", "K"], b: Tensor["N", "K"]):  # noqa: F821
    return a @ b
'''


def add_broken_kernel(project: Path) -> None:
    """Put broken_matmul first in pipeline.yaml, so a fail-fast build meets it first."""
    (project / "kernels" / "broken.py").write_text(BROKEN_KERNEL)
    pipe = project / "pipeline.yaml"
    text = pipe.read_text()
    pipe.write_text(
        text.replace(
            "kernels:\n",
            "kernels:\n  broken_matmul:\n    shapes:\n      small: {M: 8, K: 16, N: 32}\n",
            1,
        )
    )


def edf(project: Path, inst: str) -> Path:
    kernel, shapes = inst.split(".")
    return project / "build" / "kiln" / "kernel" / kernel / shapes / "kernel.edf"


def test_broken_kernel_is_reported_and_every_other_kernel_builds(project):
    add_broken_kernel(project)
    fast = run_kiln(project, "compile", "-x")
    assert fast.returncode == 1, fast.stderr
    assert not any(edf(project, i).exists() for i in GOOD)  # stopped at the first failure

    full = run_kiln(project, "compile")
    assert full.returncode == 1, full.stderr
    assert all(edf(project, i).is_file() for i in GOOD)
    assert full.stderr.count("FAILED ") == 1  # one diagnostic, not one per later stage
    assert "FAILED compile:broken_matmul.small\n" in full.stderr
    assert "kernels/broken.py:8:12: error: matmul inner dimensions differ" in full.stderr
    # the shape set's sizes, which made the dims differ, beside the error
    assert "while running stage 'trace' of broken_matmul.small (M=8, K=16, N=32)" in full.stderr
    assert "Traceback" not in full.stderr + full.stdout
    assert "kiln: 1 failed:\n  compile:broken_matmul.small (" in full.stderr
    assert "kiln: 5 tasks: 4 ran, 0 up to date, 1 failed (" in full.stdout

    status = run_kiln(project, "status", "broken_matmul")
    assert (
        "compile:broken_matmul.small: would run\n    failed at the last build: "
        "kernels/broken.py:8: matmul inner dimensions differ: (8, 16) @ (32, 16) (16 != 32)\n"
        "    starts at stage trace (may stop early)\n" in status.stdout
    ), status.stdout
    assert "kiln: 1 of 1 tasks would run" in status.stdout
    assert "never built" not in status.stdout

    shutil.copy(REPO / "dodo.py", project / "dodo.py")
    doit = subprocess.run(
        [sys.executable, "-m", "doit", "compile"],
        cwd=project,
        env=dict(os.environ, KILN_CACHE_DIR=str(project / ".cache")),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert doit.returncode != 0
    assert "kernels/broken.py:8:12: error: matmul inner dimensions differ" in doit.stderr
    assert "Traceback" not in doit.stderr + doit.stdout
    assert "0 ran, 4 up to date, 1 failed" in doit.stdout


def test_test_and_bench_cover_every_kernel_that_built(project):
    add_broken_kernel(project)
    junit = project / "report.xml"
    tested = run_kiln(project, "test", "--target", "sim", "--junit", str(junit))
    assert tested.returncode == 1, tested.stderr
    assert "kiln test: 4 pass, 0 fail, 1 error, 0 skipped" in tested.stdout
    assert "ERROR   broken_matmul.small @ sim" in tested.stdout
    assert "kernels/broken.py:8:12" in tested.stdout
    for inst in GOOD:
        assert f"PASS    {inst} @ sim" in tested.stdout
    suite = ET.parse(junit).getroot()
    assert (suite.get("tests"), suite.get("errors"), suite.get("failures")) == ("5", "1", "0")
    (error,) = suite.iter("error")
    assert error.get("message") == "kernel failed to build"
    assert "matmul inner dimensions differ" in error.text

    bench = run_kiln(project, "bench", "--target", "sim", "--output-format", "csv")
    assert bench.returncode == 1
    rows = bench.stdout.splitlines()[1:]
    assert sorted(r.split(",")[0] for r in rows) == sorted(GOOD)
    assert "broken_matmul.small not timed: it did not build" in bench.stderr
