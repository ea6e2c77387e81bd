"""Ctrl-C prints one line through plain `doit` too, and no traceback; other errors are untouched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import yaml

from tests.support.ctrl_c import answer_ctrl_c

SCRIPT = """
from kiln.interrupts import quiet_interrupt_traceback
quiet_interrupt_traceback()
quiet_interrupt_traceback()  # twice: still one line
raise {error}
"""


def _run(error: str) -> subprocess.CompletedProcess:
    code = SCRIPT.format(error=error)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=answer_ctrl_c
    )


def test_an_escaping_ctrl_c_is_one_line_and_still_ends_by_sigint():
    proc = _run("KeyboardInterrupt")
    assert proc.stderr == "kiln: interrupted\n"
    assert proc.returncode == -signal.SIGINT  # a shell sees 130


def test_other_uncaught_errors_still_print_their_traceback():
    proc = _run("ValueError('boom')")
    assert "Traceback" in proc.stderr and "ValueError: boom" in proc.stderr
    assert proc.returncode == 1


def test_ctrl_c_during_plain_doit_compile_prints_no_traceback(project):
    pipeline = yaml.safe_load((project / "pipeline.yaml").read_text())
    for spec in pipeline["kernels"].values():  # long enough to be interrupted mid-build
        spec["shapes"] = {
            f"{name}_{copy}": dims for copy in range(40) for name, dims in spec["shapes"].items()
        }
    (project / "pipeline.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
    (project / "dodo.py").write_text(
        "from kiln.tasks.dag.loader import dodo_namespace\n\nglobals().update(dodo_namespace())\n"
    )
    build = subprocess.Popen(
        [sys.executable, "-m", "doit", "compile"],
        cwd=project,
        env=dict(os.environ, KILN_CACHE="0"),
        preexec_fn=answer_ctrl_c,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (project / "build").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert build.poll() is None, "the build ended before it could be interrupted"
    build.send_signal(signal.SIGINT)
    out, err = build.communicate(timeout=60)
    assert "Traceback" not in out + err, err[-2000:]
    assert "kiln: interrupted" in err
    assert build.returncode in (-signal.SIGINT, 130)
    # the summary counts what was done so far, and says so
    assert out.splitlines()[-1].startswith("kiln: interrupted after "), out[-500:]


NOTED = """
import os, signal
from kiln.interrupts import interrupted, note_interrupts
from kiln.logconfig import warn
note_interrupts()
warn("before Ctrl-C")
try:
    os.kill(os.getpid(), signal.SIGINT)
    signal.pthread_sigmask(signal.SIG_BLOCK, [])  # a point where the handler runs
    raised = False
except KeyboardInterrupt:
    raised = True
print(raised, interrupted())
warn("after Ctrl-C: a worker it killed")
"""


def test_a_noted_ctrl_c_still_raises_and_silences_later_warnings():
    proc = subprocess.run(
        [sys.executable, "-c", NOTED], capture_output=True, text=True, preexec_fn=answer_ctrl_c
    )
    assert proc.stdout == "True True\n"
    assert proc.stderr == "kiln: warning: before Ctrl-C\n"


def test_an_ignored_ctrl_c_stays_ignored():
    code = (
        "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "from kiln.interrupts import note_interrupts\nnote_interrupts()\n"
        "print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout == "True\n"
