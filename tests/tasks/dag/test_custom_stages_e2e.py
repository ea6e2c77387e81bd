"""Custom stages through the real CLI: a broken one is a clear failure, never a silent exit.

A temporary project with one kernel instance and a stage package of its
own, ``mystages``: a stage that calls ``sys.exit()`` or raises fails its
instance (exit 1) naming the stage and its module; a stage module that does
not import or is not a stage, an artifact name that is not a file of its
own, and a dump no stage writes are load errors at their row (exit 2); a
stage after ``edf`` leaves the targets running the edf binary.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO, machines_yaml, run_kiln
from tests.support.pipelines import STAGES

PIPELINE = (
    """\
project: custom
packages: [kernels]
machine: npu-v1
kernels:
  vector_add:
    shapes:
      small: {N: 256}
"""
    + STAGES.replace("module: kiln.stages.schedule}", "module: SCHEDULE}")
    + """\
EXTRA
targets:
  sim: {runner: sim, machine: npu-v1}
machines:
"""
)

# the built-in schedule stage, with ``mode`` saying what its run() does
SCHEDULE = """\
import sys
from dataclasses import dataclass

from kiln.stages import schedule as base

INPUT = "kernel.lir"
ARTIFACT = "kernel.sched"


@dataclass(frozen=True)
class Options:
    mode: str = "ok"


def run(program, options, machine):
    if options.mode == "exit0":
        sys.exit(0)
    if options.mode == "exit3":
        sys.exit(3)
    if options.mode == "bug":
        raise RuntimeError("boom")
    return base.run(program, base.Options(), machine)


serialize, read, verify, DUMPS = base.serialize, base.read, base.verify, base.DUMPS
"""

SIGN = """\
import hashlib
from dataclasses import dataclass
from pathlib import Path

from kiln.stages import edf

INPUT = "kernel.edf"
ARTIFACT = "kernel.sig"
DUMPS = {}


@dataclass(frozen=True)
class Options:
    pass


def run(binary, options, machine):
    return hashlib.sha256(edf.serialize(binary)).hexdigest()


def serialize(text):
    return text.encode()


def read(path):
    return Path(path).read_text()


def verify(text, machine):
    pass
"""

SIGN_ROW = "  - {name: sign, module: mystages.sign}"
NO_CACHE = {"KILN_CACHE": "0"}


def make_project(
    root: Path, schedule: str = "mystages.sched", options: str = "", extra: str = ""
) -> Path:
    shutil.copytree(
        REPO / "kernels", root / "kernels", ignore=shutil.ignore_patterns("__pycache__")
    )
    stages = root / "mystages"
    stages.mkdir()
    (stages / "__init__.py").write_text("")
    (stages / "sched.py").write_text(SCHEDULE)
    (stages / "sign.py").write_text(SIGN)
    module = schedule + (f", options: {options}" if options else "")
    text = PIPELINE.replace("SCHEDULE", module).replace("EXTRA\n", extra)
    (root / "pipeline.yaml").write_text(text + machines_yaml())
    return root


def write_stage(root: Path, name: str, source: str) -> None:
    (root / "mystages" / f"{name}.py").write_text(textwrap.dedent(source))


def doit(root: Path, *args: str) -> subprocess.CompletedProcess:
    shutil.copy(REPO / "dodo.py", root / "dodo.py")
    env = dict(os.environ, KILN_CACHE_DIR=str(root / ".cache"), **NO_CACHE)
    return subprocess.run(
        [sys.executable, "-m", "doit", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def line_of(root: Path, marker: str) -> int:
    lines = (root / "pipeline.yaml").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line)


def load_error(proc: subprocess.CompletedProcess, root: Path, key: str, marker: str) -> str:
    """The one error of a pipeline that does not load, at ``key`` on the line of ``marker``."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    head = re.search(r"^pipeline\.yaml:(\d+):\d+: error: (.*)$", proc.stderr, re.M)
    assert head is not None, proc.stderr
    assert int(head.group(1)) == line_of(root, marker), proc.stderr
    assert f"  at key: {key}\n" in proc.stderr
    return head.group(2)


def schedule_line(text: str) -> int:
    return next(i for i, line in enumerate(SCHEDULE.splitlines(), 1) if text in line)


def built(root: Path) -> bool:
    return (root / "build/kiln/kernel/vector_add/small/kernel.edf").is_file()


# -- a stage that exits or breaks fails its instance ---------------------------------------


@pytest.mark.parametrize("mode, code", [("exit0", 0), ("exit3", 3)])
def test_a_stage_calling_sys_exit_fails_the_build_naming_the_stage(tmp_path, mode, code):
    root = make_project(tmp_path, options=f"{{mode: {mode}}}")
    proc = run_kiln(root, "compile", env=NO_CACHE)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 tasks: 0 ran, 0 up to date, 1 failed" in proc.stdout
    assert "FAILED compile:vector_add.small\n" in proc.stderr
    where = f"mystages/sched.py:{schedule_line(f'sys.exit({code})')}:9"
    assert (
        f"{where}: error: stage 'schedule' (mystages.sched) called sys.exit({code}) in run()\n"
        in proc.stderr
    )
    assert "note: while running stage 'schedule' of vector_add.small (N=256)" in proc.stderr
    assert not built(root)


def test_sys_exit_in_a_stage_fails_kiln_test_n_2_and_plain_doit(tmp_path):
    root = make_project(tmp_path, options="{mode: exit0}")
    message = "stage 'schedule' (mystages.sched) called sys.exit(0) in run()"
    tested = run_kiln(root, "test", env=NO_CACHE)
    assert tested.returncode == 1, tested.stdout + tested.stderr
    assert message in tested.stdout + tested.stderr
    assert "kiln test: 0 pass, 0 fail, 1 error" in tested.stdout
    pooled = run_kiln(root, "compile", "-n", "2", env=NO_CACHE)
    assert pooled.returncode == 1, pooled.stdout + pooled.stderr
    assert message in pooled.stderr and "1 failed" in pooled.stdout
    plain = doit(root, "compile")
    assert plain.returncode != 0 and "1 failed" in plain.stdout, plain.stdout + plain.stderr
    assert message in plain.stderr
    assert not built(root)


def test_an_exception_in_a_stage_names_the_stage_its_module_and_its_line(tmp_path):
    root = make_project(tmp_path, options="{mode: bug}")
    proc = run_kiln(root, "compile", env=NO_CACHE)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    where = f"mystages/sched.py:{schedule_line('RuntimeError')}:9"
    assert (
        f"{where}: error: stage 'schedule' (mystages.sched) failed in run(): "
        "RuntimeError: boom\n" in proc.stderr
    )
    assert '  |         raise RuntimeError("boom")' in proc.stderr
    assert "hint: set KILN_DEBUG=1 for the full traceback" in proc.stderr
    assert "internal error" not in proc.stderr
    debug = run_kiln(root, "compile", env={**NO_CACHE, "KILN_DEBUG": "1"})
    assert 'in run\n    raise RuntimeError("boom")' in debug.stderr


def test_a_crash_outside_the_stages_own_lines_points_at_its_row(tmp_path):
    root = make_project(tmp_path, schedule="mystages.borrowed")
    write_stage(
        root,
        "borrowed",
        """\
        import json

        from kiln.stages.schedule import Options, read, serialize, verify  # noqa: F401

        INPUT = "kernel.lir"
        ARTIFACT = "kernel.sched"
        run = json.loads  # not a stage's run: called with three arguments
        """,
    )
    proc = run_kiln(root, "compile", env=NO_CACHE)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = line_of(root, "mystages.borrowed")
    assert re.search(
        rf"^pipeline\.yaml:{line}:\d+: error: stage 'schedule' \(mystages\.borrowed\) failed "
        r"in run\(\): TypeError: loads\(\) takes 1 positional argument but 3 were given$",
        proc.stderr,
        re.M,
    ), proc.stderr
    assert "  at key: stages[3].module\n" in proc.stderr


# -- a stage module that cannot run is a load error at its row -----------------------------

BROKEN_MODULES = {
    "noopts": (
        """\
        from kiln.stages import schedule as base
        INPUT = "kernel.lir"
        ARTIFACT = "kernel.sched"
        run, serialize, read = base.run, base.serialize, base.read
        """,
        "stage 'schedule' names a module that is not a Kiln stage",
        "found: mystages.noopts, which has no Options dataclass, verify",
    ),
    "syntax": (
        'INPUT = "kernel.lir"\nARTIFACT = "kernel.sched"\ndef run(program:\n',
        "stage 'schedule': its module mystages.syntax fails to import",
        "found: SyntaxError: '(' was never closed (syntax.py, line 3)",
    ),
    "needs": (
        "import does_not_exist_zz\n",
        "stage 'schedule': its module mystages.needs fails to import",
        "found: ModuleNotFoundError: No module named 'does_not_exist_zz'",
    ),
    "exits": (
        "import sys\nsys.exit(0)\n",
        "stage 'schedule': its module mystages.exits fails to import",
        "found: it calls sys.exit(0) when imported",
    ),
}


@pytest.mark.parametrize("name", sorted(BROKEN_MODULES))
def test_a_stage_module_that_does_not_import_or_is_no_stage_is_a_load_error(tmp_path, name):
    source, message, found = BROKEN_MODULES[name]
    root = make_project(tmp_path, schedule=f"mystages.{name}", options="{mode: ok}")
    write_stage(root, name, source)
    proc = run_kiln(root, "compile", env=NO_CACHE)
    assert load_error(proc, root, "stages[3].module", f"mystages.{name}") == message
    assert f"  {found}\n" in proc.stderr


def test_a_checked_stage_module_is_not_imported_again_by_a_no_op_build(tmp_path):
    root = make_project(tmp_path)
    marker = root / "imported"
    source = (root / "mystages/sched.py").read_text()
    write_stage(root, "sched", f"open({str(marker)!r}, 'a').write('x')\n" + source)
    run_kiln(root, "compile", env=NO_CACHE, check=True)
    assert marker.read_text()  # checked (and built) once
    marker.unlink()
    again = run_kiln(root, "compile", env=NO_CACHE, check=True)
    assert "0 ran, 1 up to date" in again.stdout
    assert not marker.exists()


# -- a stage's artifact is a file of its own in the instance's out dir ---------------------


@pytest.mark.parametrize(
    "artifact, problem",
    [
        ("../../../../evil.bin", "it is a path: an artifact is a plain file name, without '/'"),
        ("/tmp/abs.bin", "it is a path: an artifact is a plain file name, without '/'"),
        ("sub/x.bin", "it is a path: an artifact is a plain file name, without '/'"),
        ("", "it is empty"),
        (".kiln-chain.json", "names starting with '.' are Kiln's own files"),
        ("test-sim.json", "Kiln keeps files of its own by that name there"),
        ("graph.json", "stages[0] (trace) writes it too"),
        ("kernel.edf", "stages[4] (edf) writes it too"),
    ],
)
def test_an_artifact_that_is_not_a_file_of_its_own_is_a_load_error(tmp_path, artifact, problem):
    root = make_project(tmp_path, extra=SIGN_ROW + "\n")
    sign = root / "mystages/sign.py"
    sign.write_text(sign.read_text().replace('"kernel.sig"', repr(artifact)))
    proc = run_kiln(root, "compile", env=NO_CACHE)
    message = load_error(proc, root, "stages[5].module", "mystages.sign")
    assert message.startswith(f"stage 'sign' cannot write the artifact {artifact!r}: {problem}")
    assert not (tmp_path.parent / "evil.bin").exists()


# -- dumps ------------------------------------------------------------------------------------

NO_DUMPS = """\
from kiln.stages.schedule import Options, decode, read, run, serialize, verify  # noqa: F401

INPUT = "kernel.lir"
ARTIFACT = "kernel.sched"
DUMPS = {}
"""


def test_a_dump_kind_the_stage_does_not_write_is_a_load_error_at_the_kind(tmp_path):
    dumps = "dumps:\n  - {kernels: [vector_add], kinds: [visa, schedule]}\n"
    root = make_project(tmp_path, schedule="mystages.nodumps", extra=dumps)
    write_stage(root, "nodumps", NO_DUMPS)
    proc = run_kiln(root, "compile", env=NO_CACHE)
    message = load_error(proc, root, "dumps[0].kinds[1]", "kinds: [visa, schedule]")
    assert message == "no stage of `stages:` writes a 'schedule' dump"
    assert "expected: a 'schedule' entry in the DUMPS of mystages.nodumps" in proc.stderr


def test_a_dump_whose_stage_row_is_missing_is_a_load_error_at_the_kind(tmp_path):
    dumps = "dumps:\n  - {kernels: [vector_add], kinds: [schedule]}\n"
    root = make_project(tmp_path, schedule="kiln.stages.schedule", extra=dumps)
    pipeline = root / "pipeline.yaml"
    pipeline.write_text(pipeline.read_text().replace("name: schedule,", "name: plan,"))
    proc = run_kiln(root, "compile", env=NO_CACHE)
    message = load_error(proc, root, "dumps[0].kinds[0]", "kinds: [schedule]")
    assert message == "no stage of `stages:` writes a 'schedule' dump"
    assert "expected: a row named 'schedule' in stages:" in proc.stderr


def test_a_dump_flag_the_stage_does_not_write_is_a_clear_error(tmp_path):
    root = make_project(tmp_path, schedule="mystages.nodumps")
    write_stage(root, "nodumps", NO_DUMPS)
    proc = run_kiln(root, "compile", "vector_add", "--dump-schedule", "s.json", env=NO_CACHE)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (
        "error: --dump-schedule: stage 'schedule' (mystages.nodumps) writes no 'schedule' dump"
        in proc.stderr
    )
    assert "Traceback" not in proc.stderr and "KeyError" not in proc.stderr


# -- a stage after edf --------------------------------------------------------------------------


def test_the_targets_run_the_edf_binary_when_a_stage_follows_it(tmp_path):
    root = make_project(tmp_path, extra=SIGN_ROW + "\n")
    tested = run_kiln(root, "test", env=NO_CACHE)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "PASS    vector_add.small @ sim" in tested.stdout
    assert (root / "build/kiln/kernel/vector_add/small/kernel.sig").is_file()
    ran = run_kiln(root, "run", "vector_add", "--target", "sim", env=NO_CACHE)
    assert ran.returncode == 0, ran.stdout + ran.stderr
