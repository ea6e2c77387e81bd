"""`kiln compile -n 2` with a stage that kills the process building one kernel's chain:
that instance fails, named with the signal; the others build; the build process lives."""

from __future__ import annotations

import pytest

from tests.conftest import run_kiln

# the built-in schedule stage, which crashes the process for a kernel whose options say so
CRASHING_STAGE = """
import ctypes
import faulthandler
import os
from dataclasses import dataclass

from kiln.stages import schedule as base
from kiln.stages.schedule import DUMPS, read, serialize, verify  # noqa: F401

INPUT = "kernel.lir"
ARTIFACT = "kernel.sched"


@dataclass(frozen=True)
class Options:
    crash: str = ""


def run(program, options, machine):
    if options.crash == "segv":
        faulthandler.disable()  # a test run's, inherited: its page of stack is not the point
        ctypes.string_at(0)
    if options.crash == "exit":
        os._exit(7)
    return base.run(program, base.Options(), machine)
"""

BUILT = ["vector_add/small", "gemm/small", "gemm/wide"]


@pytest.mark.parametrize(
    ("crash", "said"),
    [("segv", "died of SIGSEGV (signal 11)"), ("exit", "exited with code 7")],
)
def test_a_chain_that_kills_its_worker_fails_its_instance_and_the_rest_builds(project, crash, said):
    (project / "crashing_schedule.py").write_text(CRASHING_STAGE)
    pipeline = project / "pipeline.yaml"
    text = pipeline.read_text().replace("module: kiln.stages.schedule", "module: crashing_schedule")
    text = text.replace(
        "  softmax:\n", f"  softmax:\n    options:\n      schedule: {{crash: {crash}}}\n"
    )
    pipeline.write_text(text)
    proc = run_kiln(project, "compile", "-n", "2", env={"KILN_CACHE": "0"}, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out  # not 139: the build process never ran that chain
    assert "kiln: 4 tasks: 3 ran, 0 up to date, 1 failed (0 fetched, 3 compiled)" in out, out
    assert "FAILED compile:softmax.small" in out
    assert f"error: the worker building softmax.small {said}" in out, out
    assert out.count("warning") == 1, out
    assert "Traceback" not in out
    for instance in BUILT:
        assert (project / "build/kiln/kernel" / instance / "kernel.edf").is_file(), instance
    assert not (project / "build/kiln/kernel/softmax/small/kernel.edf").exists()
