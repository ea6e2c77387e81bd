"""An app's `shapes:` narrows its build to the shape set it runs at."""

from __future__ import annotations

import shutil

from kiln.tasks.apps.plan import plan_app
from kiln.tasks.model.project import Project
from tests.conftest import REPO


def example_project(tmp_path):
    for folder in ("kernels", "apps"):
        shutil.copytree(
            REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(REPO / "pipeline.yaml", tmp_path / "pipeline.yaml")
    return tmp_path / "pipeline.yaml"


def test_app_shapes_builds_only_that_set(tmp_path):
    plan = plan_app(Project(example_project(tmp_path)), "mlp")
    assert sorted(i.name for i in plan.instances) == [
        "gemm.mlp",
        "gemm_bias_relu.mlp",
        "softmax.mlp",
    ]


def test_without_shapes_every_set_of_a_reached_kernel_is_built(tmp_path):
    pipeline = example_project(tmp_path)
    pipeline.write_text(pipeline.read_text().replace("    shapes: mlp\n", ""))
    names = {i.name for i in plan_app(Project(pipeline), "mlp").instances}
    assert {"gemm.small", "gemm.large", "gemm.mlp", "softmax.attention"} <= names
