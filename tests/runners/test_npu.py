"""The npu target: real hardware through a `kiln.runners` plugin, or a clear refusal."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from pathlib import Path

import numpy as np
import pytest

import kernels.linalg as linalg
import kiln.runners.npu as npu
from kiln.errors import TargetError
from kiln.lang import trace
from kiln.runners.base import KernelArtifacts
from kiln.runners.cpu import CpuRunner
from kiln.runners.npu import NpuRunner
from tests.conftest import REPO, run_kiln

# pyproject.toml registers Kiln's own runners in the group; the npu runner skips itself
SELF = EntryPoint("npu", "kiln.runners.npu:NpuRunner", "kiln.runners")


class RecordingRunner(CpuRunner):
    """A stand-in for a vendor's runner: the oracle, remembering how it was made."""

    made: list = []

    def __init__(self, options=None, machine=None):
        super().__init__(options, machine)
        RecordingRunner.made.append((self.options, self.machine))


def use_entry_points(monkeypatch, *points: EntryPoint) -> None:
    monkeypatch.setattr(
        npu, "entry_points", lambda **kw: [p for p in points if p.group == kw.get("group")]
    )


def gemm_artifacts():
    graph = trace(linalg.gemm, {"M": 8, "K": 8, "N": 8}, "f32")
    return KernelArtifacts("gemm.small", graph, Path("."), None, linalg.gemm)


def test_without_a_plugin_it_says_what_is_missing_and_suggests_sim(monkeypatch):
    use_entry_points(monkeypatch, SELF)
    runner = NpuRunner()
    reason = runner.unavailable()
    assert "no hardware runner plugin" in reason and "'kiln.runners'" in reason
    with pytest.raises(TargetError) as info:
        runner.prepare(gemm_artifacts())
    err = info.value
    assert "needs a hardware runner plugin" in err.message
    assert "'kiln.runners' entry-point group" in err.expected
    assert err.hint == "run on the instruction-level simulator instead: --target sim"


def test_a_plugin_registered_as_npu_runs_the_kernel(monkeypatch):
    plugin = EntryPoint("npu", f"{__name__}:RecordingRunner", "kiln.runners")
    monkeypatch.setattr(RecordingRunner, "made", [])
    use_entry_points(monkeypatch, SELF, plugin)
    runner = NpuRunner(options={"board": 3}, machine={"name": "npu-v1"})
    assert runner.unavailable() is None
    art = gemm_artifacts()
    a = np.eye(8, dtype=np.float32)
    b = np.arange(64, dtype=np.float32).reshape(8, 8)
    result = runner.run(runner.prepare(art), [a, b])
    np.testing.assert_array_equal(result.outputs[0], b)
    assert RecordingRunner.made == [({"board": 3}, {"name": "npu-v1"})]


NPU_TARGET = "  board: {runner: npu}\n"


def with_board_target(project: Path) -> None:
    text = (project / "pipeline.yaml").read_text()
    text = text.replace(
        "  sim: {runner: sim, machine: npu-v1}\n",
        "  sim: {runner: sim, machine: npu-v1}\n" + NPU_TARGET,
    )
    assert NPU_TARGET in text
    (project / "pipeline.yaml").write_text(text)


def test_cli_without_a_plugin_reports_the_missing_plugin_without_a_traceback(project):
    with_board_target(project)
    run = run_kiln(project, "run", "vector_add", "--target", "board")
    assert run.returncode == 2
    assert "--target board was asked for, but it cannot run here: no hardware runner plugin" in (
        run.stderr
    )
    assert "--target sim" in run.stderr
    assert "tasks:" not in run.stdout  # found before anything was built
    test = run_kiln(project, "test", "vector_add", "--target", "board")
    # asked for by name, it tests nothing: a CI job asking for the board must not pass
    assert test.returncode == 2
    assert "error: --target board was asked for, but it cannot run here" in test.stderr
    assert "--target sim" in test.stderr and "tasks:" not in test.stdout
    both = run_kiln(project, "test", "vector_add", "--target", "sim", "--target", "board")
    assert both.returncode == 2 and "PASS" not in both.stdout  # refused before any work
    from_file = run_kiln(project, "test", "vector_add")  # pipeline.yaml's targets: skipped
    assert from_file.returncode == 0, from_file.stdout + from_file.stderr
    assert "SKIPPED board (1 check not run): no hardware runner plugin" in from_file.stdout
    for proc in (run, test):
        assert "Traceback" not in proc.stdout + proc.stderr


def test_the_skip_reason_kiln_test_prints_suggests_sim(monkeypatch):
    use_entry_points(monkeypatch, SELF)
    assert "--target sim" in NpuRunner().unavailable()


def test_cli_finds_an_installed_plugin(project, tmp_path_factory):
    """A distribution on sys.path registering `npu` in `kiln.runners` is picked up."""
    site = tmp_path_factory.mktemp("site")
    info = site / "fakeboard-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeboard\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[kiln.runners]\nnpu = runners.cpu:CpuRunner\n")
    with_board_target(project)
    proc = run_kiln(
        project,
        "test",
        "vector_add",
        "--target",
        "board",
        env={"PYTHONPATH": f"{REPO}:{site}"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS    vector_add.small @ board" in proc.stdout


def test_a_plugin_that_fails_to_import_is_a_target_error_not_a_traceback(monkeypatch):
    import kiln.runners.base as base
    from kiln.runners.base import load_runner_class

    broken = EntryPoint("acme", "acme_npu_not_installed_anywhere:Runner", "kiln.runners")
    monkeypatch.setattr(base, "entry_points", lambda **kw: [broken])
    with pytest.raises(TargetError) as info:
        load_runner_class("acme")
    assert "the runner plugin 'acme'" in info.value.message
    assert "ModuleNotFoundError" in info.value.message and "--target sim" in info.value.hint


def test_an_unknown_runner_points_at_its_target_in_pipeline_yaml(project):
    text = (project / "pipeline.yaml").read_text()
    (project / "pipeline.yaml").write_text(
        text.replace("targets:\n", 'targets:\n  board: {runner: "acme_npu:Runner"}\n', 1)
    )
    proc = run_kiln(project, "test", "vector_add", "--target", "board")
    assert proc.returncode == 2
    assert "error: unknown runner 'acme_npu:Runner'" in proc.stderr
    assert "at key: targets.board.runner" in proc.stderr and "Traceback" not in proc.stderr
