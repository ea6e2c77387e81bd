"""Runners of targets (tasks/checks/targets.py): a runner's own crash is one message."""

from __future__ import annotations

import pytest

from kiln.errors import KilnError, TargetError
from kiln.tasks.checks.targets import runner_errors
from tests.conftest import run_kiln
from tests.support.board_plugin import install_board

CRASH = "error: target 'crash' raised RuntimeError: device fell over\n"


class Board:
    """Stands for a runner: its class is named in the hint."""


def test_a_runner_exception_becomes_a_target_error_naming_it(monkeypatch):
    monkeypatch.delenv("KILN_DEBUG", raising=False)
    with pytest.raises(TargetError) as info:
        with runner_errors("board", Board()):
            raise IndexError("list index out of range")
    err = info.value
    assert err.message == "target 'board' raised IndexError: list index out of range"
    assert f"its runner ({__name__}.Board) failed" in err.hint
    assert err.hint.endswith("set KILN_DEBUG=1 for the full traceback") and err.notes == []


def test_kiln_debug_keeps_the_runner_traceback_as_a_note(monkeypatch):
    monkeypatch.setenv("KILN_DEBUG", "1")
    with pytest.raises(TargetError) as info:
        with runner_errors("board", Board()):
            raise ValueError()
    assert info.value.message == "target 'board' raised ValueError"
    (note,) = info.value.notes
    assert note.startswith("Traceback") and "ValueError" in note


def test_kiln_errors_and_interrupts_go_through_unchanged():
    mine = KilnError("corrupt EDF file")
    with pytest.raises(KilnError) as info:
        with runner_errors("sim", Board()):
            raise mine
    assert info.value is mine
    with pytest.raises(KeyboardInterrupt):
        with runner_errors("sim", Board()):
            raise KeyboardInterrupt


@pytest.mark.parametrize("command", ["run", "bench"])
def test_run_and_bench_say_a_runner_crash_in_one_message(project, tmp_path, command):
    env = install_board(project, tmp_path / "site")
    proc = run_kiln(project, command, "vector_add", "--target", "crash", env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.stderr.count(CRASH) == 1, proc.stderr
    assert "  hint: its runner (bad_board.Board) failed while preparing or running" in proc.stderr
