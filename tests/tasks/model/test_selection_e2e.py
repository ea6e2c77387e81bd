"""The selection rule through the CLI, in a project whose names overlap."""

from __future__ import annotations

import json

from tests.conftest import run_kiln

GEMM_TWIN = """\
from kiln import Tensor, device


@device
def gemm(a: Tensor["M", "K"], b: Tensor["K", "N"]):
    return a @ b * 2.0


@device
def gemm_bias_relu(a: Tensor["M", "K"], b: Tensor["K", "N"], bias: Tensor["N"]):
    return (a @ b + bias).relu()
"""


def with_gemm_bias_relu(project):
    text = (project / "pipeline.yaml").read_text()
    text = text.replace(
        "stages:\n",
        "  gemm_bias_relu:\n    shapes:\n      small: {M: 32, K: 32, N: 32}\nstages:\n",
        1,
    )
    (project / "pipeline.yaml").write_text(text)


def test_readme_headline_dumps_exactly_the_named_kernel(project):
    with_gemm_bias_relu(project)
    proc = run_kiln(project, "compile", "gemm", "--shapes", "small", "--dump-schedule", "s.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    dump = json.loads((project / "s.json").read_text())
    assert dump  # a Chrome trace of gemm.small
    assert "gemm_bias_relu" not in (project / "s.json").read_text()


def test_a_dump_of_a_kernel_with_two_shape_sets_takes_the_first_and_says_so(project):
    proc = run_kiln(project, "compile", "gemm", "--dump-schedule", "s.json")
    assert proc.returncode == 0, proc.stderr
    assert "gemm has 2 shape sets; a dump flag (--dump-schedule) uses small" in proc.stderr
    assert "pick another with --shapes: wide" in proc.stderr
    assert "wrote schedule dump of gemm.small to s.json" in proc.stdout


def test_a_dump_of_several_kernels_is_refused(project):
    proc = run_kiln(project, "compile", "gemm*", "vector_add", "--dump-schedule", "s.json")
    assert proc.returncode == 2
    assert "needs exactly one kernel, but the filters select 2" in proc.stderr
    assert not (project / "s.json").exists()


def test_an_ambiguous_run_lists_the_kernels_instead_of_running_one(project):
    with_gemm_bias_relu(project)
    proc = run_kiln(project, "run", "gem", "--target", "cpu")
    assert proc.returncode == 2
    assert "'gem' matches 2 kernels: gemm, gemm_bias_relu" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_second_module_with_the_same_function_name_keeps_the_entry_building(project):
    (project / "kernels" / "zz_variants.py").write_text(GEMM_TWIN)
    proc = run_kiln(project, "compile", "gemm")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "kernel 'gemm' is defined in several modules" in proc.stderr
    assert "building kernels.linalg.gemm" in proc.stderr
    assert "function: kernels.linalg.gemm" in proc.stderr
