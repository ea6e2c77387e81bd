"""JUnit XML of `kiln test` (tasks/checks/junit.py): what a CI page shows of each verdict."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from kiln.tasks.checks.junit import write_junit
from tests.conftest import run_kiln
from tests.support.board_plugin import add_top1, install_board

COUNT = {"ok": False, "output": -1, "problem": "1 outputs, expected 2"}
MATCHED = {"ok": True, "output": 0, "text": "output 0 bf16[8]: max abs err 0"}


def failure_of(path) -> ET.Element:
    (case,) = ET.parse(path).getroot().iter("testcase")
    return case.find("failure")


def fail_report(outputs: list[dict]) -> dict:
    return {"kernel": "top1.small", "target": "board", "status": "fail", "outputs": outputs}


def test_a_wrong_output_count_is_the_failure_message_and_text(tmp_path):
    # as a report cached before the count entry carried a text
    write_junit(tmp_path / "j.xml", [fail_report([COUNT, MATCHED])])
    failure = failure_of(tmp_path / "j.xml")
    assert failure.get("message") == "the target returned 1 outputs, expected 2"
    assert failure.text == "1 outputs, expected 2"


def test_a_mismatch_keeps_its_message_and_text(tmp_path):
    wrong = {"ok": False, "output": 0, "text": "output 0 f32[4]: max abs err 2 ..."}
    write_junit(tmp_path / "j.xml", [fail_report([wrong])])
    failure = failure_of(tmp_path / "j.xml")
    assert failure.get("message") == "output differs from the cpu oracle"
    assert failure.text == "output 0 f32[4]: max abs err 2 ..."


def test_a_target_that_drops_an_output_says_so_in_junit(project, tmp_path):
    env = install_board(project, tmp_path / "site")
    add_top1(project, "    shapes: {small: {B: 8, C: 100}}\n")
    proc = run_kiln(project, "test", "top1", "--target", "drop", "--junit", "j.xml", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL    top1.small @ drop\n    1 outputs, expected 2\n" in proc.stdout
    failure = failure_of(project / "j.xml")
    assert failure.get("message") == "the target returned 1 outputs, expected 2"
    assert failure.text == "1 outputs, expected 2"
