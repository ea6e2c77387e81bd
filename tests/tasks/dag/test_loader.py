"""The doit side (kiln/tasks/loader.py): which doit command lines take the project lock."""

from __future__ import annotations

import pytest

from kiln.tasks.dag.loader import LOCKING_COMMANDS, doit_command


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        ([], "run"),
        (["compile"], "run"),
        (["-n", "2", "compile"], "run"),
        (["run", "-n", "2", "compile:gemm.small.edf"], "run"),
        (["--no-continue", "compile", "test"], "run"),
        (["list", "--all"], "list"),
        (["-f", "dodo.py", "info", "compile"], "info"),
        (["clean"], "clean"),
        (["forget"], "forget"),
        (["--help"], None),
        (["help", "run"], None),
    ],
)
def test_doit_command_of_a_command_line(argv, command):
    assert doit_command(argv) == command


def test_commands_that_run_or_change_tasks_lock_and_listing_does_not():
    assert {"run", "clean", "forget"} <= LOCKING_COMMANDS
    assert not {"list", "info", "help"} & LOCKING_COMMANDS
