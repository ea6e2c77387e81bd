"""`kiln watch`: a round per save, failures that do not end the watch, a clean Ctrl-C."""

from __future__ import annotations

import io
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from kiln.cli.watch import Round, Watcher
from tests.support.ctrl_c import answer_ctrl_c

KERNEL = "kernels/elementwise.py"


@pytest.fixture
def quiet_env(monkeypatch, project):
    monkeypatch.setenv("KILN_CACHE_DIR", str(project / ".cache"))
    monkeypatch.delenv("KILN_OUT_DIR", raising=False)
    monkeypatch.delenv("KILN_PIPELINE_FILE", raising=False)
    monkeypatch.delenv("KILN_VERBOSITY", raising=False)


def test_what_starts_a_round(project):
    w = Watcher(project / "pipeline.yaml")
    assert w.relevant(project / "pipeline.yaml")
    assert w.relevant(project / KERNEL)
    assert w.relevant(project / "stages" / "mine.py")  # a project's own stage module
    for path in (
        "README.md",
        "build/kiln/kernel/gemm/small/x.py",
        ".kiln/discovery.py",
        ".venv/lib/site.py",
        "kernels/__pycache__/x.py",
    ):
        assert not w.relevant(project / path), path
    assert w.watched_paths()[0] == project


def test_round_line_says_what_changed_what_ran_and_how_it_ended():
    assert (
        Round(3, ("kernels/a.py",), "compile", 0, 1.25).line()
        == "kiln watch: round 3: kernels/a.py changed: compile ok in 1.2 s"
    )
    assert "start: test on sim FAILED (exit 1)" in Round(0, (), "test on sim", 1, 0.5).line()
    many = Round(1, ("a.py", "b.py", "c.py", "d.py"), "compile", 0, 1).line()
    assert "a.py and 3 more changed" in many


def test_a_broken_kernel_fails_its_round_and_the_watch_goes_on(project, quiet_env):
    kernel = project / KERNEL
    good = kernel.read_text()

    def saves():
        kernel.write_text(good + "\n@device\ndef broken(x: Tensor['N']):\n    return x +* x\n")
        yield [kernel]
        kernel.write_text(good + "\n# fixed\n")
        yield [kernel, project / "README.md"]
        yield [project / "notes.txt"]  # not a round

    out = io.StringIO()
    watcher = Watcher(project / "pipeline.yaml", ["vector_add"], out=out)
    assert watcher.run(saves()) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("kiln watch: round 0: start: compile ok")
    assert lines[1] == "kiln watch: watching . (Ctrl-C to stop)"
    assert lines[2].startswith(f"kiln watch: round 1: {KERNEL} changed: compile FAILED (exit ")
    assert lines[3].startswith(f"kiln watch: round 2: {KERNEL} changed: compile ok")
    assert len(lines) == 4


def test_watch_with_a_target_tests_there(project, quiet_env):
    out = io.StringIO()
    watcher = Watcher(project / "pipeline.yaml", ["vector_add"], target="sim", out=out)
    assert watcher.command()[-4:] == ["test", "vector_add", "--target", "sim"]
    watcher.run([[project / "pipeline.yaml"]], max_rounds=1)
    assert "round 1: pipeline.yaml changed: test on sim ok" in out.getvalue()


def _lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line)
    into.put(None)


def _wait_for(lines: queue.Queue, seen: list[str], text: str, timeout: float, poke=None) -> bool:
    """Read lines until one contains ``text``; call ``poke`` every 2 s while waiting."""
    deadline = time.monotonic() + timeout
    next_poke = time.monotonic()
    while time.monotonic() < deadline:
        if poke is not None and time.monotonic() >= next_poke:
            poke()
            next_poke = time.monotonic() + 2
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            continue
        if line is None:
            return False
        seen.append(line)
        if text in line:
            return True
    return False


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_kiln_watch_rebuilds_on_save_and_ctrl_c_exits_0(project, stop):
    env = dict(os.environ, KILN_CACHE_DIR=str(project / ".cache"))
    for name in ("KILN_OUT_DIR", "KILN_PIPELINE_FILE", "KILN_VERBOSITY"):
        env.pop(name, None)
    with (project / "stderr.txt").open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kiln", "watch", "vector_add", "--debounce", "100"],
            cwd=project,
            preexec_fn=answer_ctrl_c,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(proc.stdout, lines), daemon=True).start()
    seen: list[str] = []
    kernel = project / KERNEL
    edits = iter(range(1000))
    try:
        assert _wait_for(lines, seen, "watching", 120), seen
        # a save may land before the watcher is set up: save again until a round starts
        poke = lambda: kernel.write_text(kernel.read_text() + f"\n# edit {next(edits)}\n")  # noqa: E731
        assert _wait_for(lines, seen, f"round 1: {KERNEL} changed: compile ok", 120, poke), seen
    finally:
        proc.send_signal(stop)  # SIGTERM: a closed terminal, `kill`
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    err = (project / "stderr.txt").read_text()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    while (line := lines.get(timeout=5)) is not None:
        seen.append(line)
    assert any("kiln watch: stopped after" in line for line in seen), seen


def test_watch_without_a_project_is_exit_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "kiln", "watch"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "KILN_PIPELINE_FILE"},
    )
    assert proc.returncode == 2 and "no pipeline file" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_filter_that_matches_nothing_is_exit_2_before_any_round(project):
    """Saving a file never makes a misspelt FILTER right: it stops the watch at once."""
    proc = subprocess.run(
        [sys.executable, "-m", "kiln", "watch", "nosuch"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no kernel matches 'nosuch'" in proc.stderr and "round" not in proc.stdout
    assert "Traceback" not in proc.stderr


SLOW_ROUND = """
import io, sys
from pathlib import Path
from kiln.cli.watch import Watcher


class SlowRound(Watcher):  # a round whose build takes a minute unless interrupted
    def command(self):
        return [sys.executable, "-c", "import time; time.sleep(60)"]


print("round", flush=True)
try:
    SlowRound(Path(sys.argv[1]), out=io.StringIO()).run_round()
except KeyboardInterrupt:
    sys.exit(130)
"""


def test_sigint_to_the_watch_alone_stops_the_round_under_way(project):
    """kill -INT of the watch's pid (an IDE's stop): the build never got that Ctrl-C itself."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_ROUND, str(project / "pipeline.yaml")],
        preexec_fn=answer_ctrl_c,
        start_new_session=True,  # the signal reaches the watch alone, not its build
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "round\n"
    time.sleep(1.0)  # the build is sleeping
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    assert time.monotonic() - started < 15  # not the minute the build would take
