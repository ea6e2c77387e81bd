"""One instance checked against the oracle (tasks/checks/verdicts.py): tolerances, a runner
that raises, and the oracle asked to check itself."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from kiln.tasks.checks.verdicts import ORACLE_ITSELF, output_tolerance
from tests.conftest import run_kiln
from tests.support.board_plugin import add_top1, install_board

REPORT = Path("build/kiln/kernel/test-report.json")


def outputs_of(project: Path, target: str) -> list[dict]:
    reports = json.loads((project / REPORT).read_text())["reports"]
    (found,) = [r for r in reports if r["target"] == target]
    return found["outputs"]


def test_a_float_tolerance_applies_to_float_outputs_only():
    loose = {"rtol": 0.02, "atol": 1.0}
    assert output_tolerance("bf16", loose) == output_tolerance("f32", loose) == loose
    assert output_tolerance("i32", loose) is None and output_tolerance("bool", loose) is None


def test_a_kernel_tolerance_leaves_an_argmax_off_by_one_failing(project, tmp_path):
    env = install_board(project, tmp_path / "site")
    add_top1(
        project,
        "    dtype: bf16\n    tolerance: {rtol: 0.02}\n    shapes: {small: {B: 8, C: 1000}}\n",
    )
    proc = run_kiln(project, "test", "top1", "--target", "off", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL    top1.small @ off\n" in proc.stdout
    assert "kiln test: 0 pass, 1 fail, 0 error, 0 skipped" in proc.stdout
    values, indices = outputs_of(project, "off")
    assert (values["ok"], values["rtol"], values["atol"]) == (True, 0.02, 0.05)
    assert (indices["ok"], indices["rtol"], indices["atol"]) == (False, 0.0, 0.0)
    assert indices["mismatched"] == 8 and indices["max_abs"] == 1.0
    assert "output 1 i32[8]: max abs err 1, " in proc.stdout
    assert "(rtol 0, atol 0); 8 element(s) out of tolerance" in proc.stdout


def test_a_target_tolerance_leaves_an_argmax_off_by_one_failing(project, tmp_path):
    env = install_board(project, tmp_path / "site")
    add_top1(project, "    shapes: {small: {B: 8, C: 100}}\n")
    pipeline = project / "pipeline.yaml"
    text = pipeline.read_text().replace(
        "mode: off_by_one}", "mode: off_by_one}, tolerance: {atol: 1}"
    )
    pipeline.write_text(text)
    proc = run_kiln(project, "test", "top1", "--target", "off", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL    top1.small @ off\n" in proc.stdout
    values, indices = outputs_of(project, "off")
    assert (values["ok"], values["rtol"], values["atol"]) == (True, 1e-4, 1.0)
    assert (indices["ok"], indices["rtol"], indices["atol"]) == (False, 0.0, 0.0)


def test_a_runner_that_raises_is_an_error_of_its_check_and_the_others_run(project, tmp_path):
    env = install_board(project, tmp_path / "site")
    proc = run_kiln(
        project,
        *("test", "vector_add", "softmax", "--target", "board", "--target", "crash"),
        *("--junit", "j.xml"),
        env=env,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "PASS    vector_add.small @ board" in proc.stdout
    assert "PASS    softmax.small @ board" in proc.stdout
    assert (
        "ERROR   vector_add.small @ crash\n"
        "    error: target 'crash' raised RuntimeError: device fell over\n"
        "      hint: its runner (bad_board.Board) failed while preparing or running the kernel"
    ) in proc.stdout
    assert "kiln test: 2 pass, 0 fail, 2 error, 0 skipped" in proc.stdout

    suite = ET.parse(project / "j.xml").getroot()
    assert (suite.get("tests"), suite.get("errors"), suite.get("failures")) == ("4", "2", "0")
    errors = [c.find("error") for c in suite.iter("testcase") if c.get("classname") == "kiln.crash"]
    assert [e.get("message") for e in errors] == ["target failed to run"] * 2
    assert all("raised RuntimeError: device fell over" in e.text for e in errors)
    reports = json.loads((project / REPORT).read_text())["reports"]
    assert {(r["kernel"], r["target"]): r["status"] for r in reports} == {
        ("vector_add.small", "board"): "pass",
        ("vector_add.small", "crash"): "error",
        ("softmax.small", "board"): "pass",
        ("softmax.small", "crash"): "error",
    }


def test_a_runner_that_raises_is_a_failing_binding_under_fuzz(project, tmp_path):
    env = install_board(project, tmp_path / "site")
    proc = run_kiln(project, "test", "vector_add", "--fuzz", "2", "--target", "crash", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.stdout.count("error: target 'crash' raised RuntimeError: device fell over") == 2
    assert "fuzz: 2 bindings, 0 passed, 2 failed, 0 skipped (seed 0)" in proc.stdout


def test_the_oracle_asked_for_is_skipped_saying_it_is_the_oracle(project):
    proc = run_kiln(project, "test", "vector_add", "--target", "cpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1:] == ["kiln test: 0 pass, 0 fail, 0 error, 1 skipped"]
    assert f"SKIPPED vector_add.small @ cpu: {ORACLE_ITSELF}\n" in proc.stdout
    assert ORACLE_ITSELF.startswith("cpu is the oracle the other targets are checked against")
    (skipped,) = json.loads((project / REPORT).read_text())["reports"]
    assert (skipped["status"], skipped["reason"]) == ("skipped", ORACLE_ITSELF)
