"""The `kiln` command end to end: own commands and doit pass-through."""

from __future__ import annotations

import json

import numpy as np

from tests.conftest import run_kiln


def test_doit_commands_pass_through(project):
    listed = run_kiln(project, "list", "--all", check=True).stdout
    assert "compile:gemm.small.trace" in listed and "compile:softmax.small.edf" in listed
    run_kiln(project, "compile", "vector_add", check=True)
    info = run_kiln(project, "info", "compile:vector_add.small.visa", check=True).stdout
    assert "vector_add" in info and "file_dep" in info
    run_kiln(project, "clean", "compile:vector_add.small.edf", check=True)
    assert not (project / "build/kiln/kernel/vector_add/small/kernel.edf").exists()
    run_kiln(project, "forget", check=True)


def test_parallel_compile(project):
    proc = run_kiln(project, "-n", "2", "compile", check=True)
    assert "failed" not in proc.stderr.lower()
    assert (project / "build/kiln/kernel/gemm/wide/kernel.edf").is_file()


def test_run_kernel_on_cpu_prints_shapes_and_statistics(project):
    out_dir = project / "outs"
    proc = run_kiln(
        project,
        "run",
        "gemm",
        "--target",
        "cpu",
        "--shapes",
        "wide",
        "--save-outputs",
        str(out_dir),
        check=True,
    )
    assert "gemm.wide on cpu" in proc.stdout
    assert "in  a: f32[32, 64]" in proc.stdout and "out 0: f32[32, 64]" in proc.stdout
    assert "mean" in proc.stdout and "std" in proc.stdout
    saved = np.load(out_dir / "out0.npy")
    assert saved.shape == (32, 64) and saved.dtype == np.float32


def test_run_is_deterministic_across_runs(project):
    a = run_kiln(project, "run", "softmax", "--target", "cpu", check=True).stdout
    b = run_kiln(project, "run", "softmax", "--target", "cpu", check=True).stdout

    def values(text):
        return [line for line in text.splitlines() if line.startswith(("  in ", "  out "))]

    assert values(a) and values(a) == values(b)


def test_run_unknown_kernel_and_target(project):
    proc = run_kiln(project, "run", "nosuch", "--target", "cpu")
    assert proc.returncode == 2 and "no kernel matches 'nosuch'" in proc.stderr
    proc = run_kiln(project, "run", "gemm", "--target", "tpu")
    assert proc.returncode == 2 and "unknown target 'tpu'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_message_format_json_for_pipeline_errors(project):
    pipe = project / "pipeline.yaml"
    pipe.write_text(pipe.read_text().replace("packages: [kernels]", "pakages: [kernels]"))
    proc = run_kiln(project, "compile", "--message-format", "json")
    assert proc.returncode == 2
    diag = json.loads(proc.stdout.strip().splitlines()[0])
    assert diag["key_path"] == "pakages" and diag["line"] == 2
    assert "packages" in (diag["hint"] or "")


def test_out_dir_from_environment(project):
    run_kiln(
        project,
        "compile",
        "vector_add",
        env={"KILN_OUT_DIR": str(project / "elsewhere")},
        check=True,
    )
    assert (project / "elsewhere/vector_add/small/kernel.edf").is_file()


def test_log_info_to_a_file(project):
    log = project / "kiln.log"
    run_kiln(
        project,
        "compile",
        "vector_add",
        env={"KILN_LOG_INFO": "1", "KILN_LOG_FILE": str(log)},
        check=True,
    )
    text = log.read_text()
    assert "kiln.tasks INFO: loaded" in text
    assert "vector_add.small trace: wrote" in text


def test_dump_mlir_writes_the_iree_input(project):
    target = project / "k.mlir"
    proc = run_kiln(project, "compile", "softmax", "--dump-mlir", str(target), check=True)
    text = target.read_text()
    assert "func.func @softmax" in text and "tensor<8x64xf32>" in text
    assert "wrote mlir dump of softmax.small" in proc.stdout
