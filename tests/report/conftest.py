"""One built example project shared by the report tests (building costs seconds)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, SMALL_PIPELINE, machines_yaml, run_kiln


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> Path:
    """A small project, compiled, tested and benched on sim, with a broken kernel added.

    ``broken`` fails in the trace stage, so the report has a failed instance
    with its recorded diagnostic next to the built ones.
    """
    root = tmp_path_factory.mktemp("report-project")
    shutil.copytree(
        REPO / "kernels", root / "kernels", ignore=shutil.ignore_patterns("__pycache__")
    )
    (root / "kernels" / "broken.py").write_text(
        "from kiln import Tensor, device\n\n\n"
        "@device\n"
        "def broken(x: Tensor['N']):\n"
        "    return x @ x.T @ x\n"
    )
    pipeline = SMALL_PIPELINE.replace(
        "kernels:\n", "kernels:\n  broken:\n    shapes:\n      small: {N: 8}\n", 1
    )
    (root / "pipeline.yaml").write_text(pipeline + machines_yaml())
    run_kiln(
        root, "compile", "softmax", "gemm", "vector_add", "--profile", "profile.json", check=True
    )
    failed = run_kiln(root, "compile", "broken")
    assert failed.returncode == 1, failed.stderr
    run_kiln(root, "test", "softmax", "--target", "sim", check=True)
    run_kiln(root, "bench", "softmax", "--target", "sim", "--iter", "1", check=True)
    return root


@pytest.fixture(scope="session")
def report(built: Path) -> Path:
    out = built / "report.html"
    run_kiln(built, "view", "-o", str(out), check=True)
    return out
