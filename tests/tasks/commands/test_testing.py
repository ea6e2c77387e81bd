"""`kiln test` and the doit `test:<instance>@<target>` tasks, end to end in a tmp project.

The checks must be able to fail: a flipped byte in a built EDF, a built
schedule edited to start a dependent instruction early, and a kernel
compiled through a deliberately wrong visa stage
(``tests/support/bad_stage.py``, named in the tmp pipeline's stage table)
all fail with exit 1 and a report that says what and where.
"""

from __future__ import annotations

import dataclasses
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from kiln.compare import compare
from kiln.inputs import random_inputs
from kiln.ir.edf import EdfFile, decode, encode
from kiln.ir.lir import Slot
from kiln.tasks.checks.verdicts import ORACLE_ITSELF
from tests.conftest import ran_tasks, run_kiln

OUT = Path("build/kiln/kernel")
INSTANCES = ["vector_add.small", "softmax.small", "gemm.small", "gemm.wide"]


def edit(project: Path, old: str, new: str) -> None:
    path = project / "pipeline.yaml"
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def use_bad_visa(project: Path) -> None:
    """Compile through the test-only stage that turns the first add into a sub."""
    package = project / "my_stages"  # a project-local stage package, as a user writes one
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text("")
    bad = Path(__file__).resolve().parents[3] / "tests" / "support" / "bad_stage.py"
    (package / "bad_stage.py").write_bytes(bad.read_bytes())
    edit(project, "module: kiln.stages.visa}", "module: my_stages.bad_stage}")


def set_kernel_tolerance(project: Path, kernel: str, tolerance: str) -> None:
    edit(project, f"  {kernel}:\n", f"  {kernel}:\n    tolerance: {tolerance}\n")


def junit(path: Path) -> ET.Element:
    suite = ET.parse(path).getroot()
    assert suite.tag == "testsuite" and suite.get("name") == "kiln"
    return suite


def report(project: Path) -> list[dict]:
    return json.loads((project / OUT / "test-report.json").read_text())["reports"]


def vector_add_with_sub() -> tuple[np.ndarray, np.ndarray]:
    """What vector_add.small should give, and what the add-to-sub lowering gives."""
    a, b = random_inputs("vector_add.small", [((256,), "f32"), ((256,), "f32")], seed=0)
    return a + b, a - b


def test_all_pass_writes_junit_and_the_json_report(project):
    proc = run_kiln(project, "test", "--target", "sim", "--target", "cpu", "--junit", "ci/j.xml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for inst in INSTANCES:
        assert f"PASS    {inst} @ sim  (max abs err" in proc.stdout
        # the oracle is not compared with itself, even when asked for
        assert f"SKIPPED {inst} @ cpu: {ORACLE_ITSELF}\n" in proc.stdout
    assert "kiln test: 4 pass, 0 fail, 0 error, 4 skipped" in proc.stdout

    suite = junit(project / "ci" / "j.xml")
    assert {k: suite.get(k) for k in ("tests", "failures", "errors", "skipped")} == {
        "tests": "8",
        "failures": "0",
        "errors": "0",
        "skipped": "4",
    }
    cases = suite.findall("testcase")
    assert sorted((c.get("classname"), c.get("name")) for c in cases) == sorted(
        (f"kiln.{t}", i) for t in ("sim", "cpu") for i in INSTANCES
    )
    assert all(float(c.get("time")) >= 0 for c in cases)
    assert all(len(c) == 0 for c in cases if c.get("classname") == "kiln.sim")
    oracle = [c.find("skipped") for c in cases if c.get("classname") == "kiln.cpu"]
    assert [s.get("message") for s in oracle] == [ORACLE_ITSELF] * 4

    reports = report(project)
    assert len(reports) == 8
    assert {r["target"]: r["status"] for r in reports} == {"sim": "pass", "cpu": "skipped"}
    sim = next(r for r in reports if r["target"] == "sim" and r["kernel"] == "gemm.small")
    assert sim["path"] == "kernels.linalg.gemm" and sim["seed"] == 0
    assert sim["metrics"]["cycles"] > 0 and "utilization.tensor0" in sim["metrics"]
    (out,) = sim["outputs"]
    assert out["ok"] and out["shape"] == [32, 32] and out["dtype"] == "f32"

    default = run_kiln(project, "test", "vector_add")  # no --target: every non-cpu target
    assert default.returncode == 0 and "PASS    vector_add.small @ sim" in default.stdout
    assert "@ cpu" not in default.stdout


def start_a_dependent_early(path: Path) -> tuple[int, int]:
    """Move the first read-after-write consumer's slot onto its producer's; re-encode the EDF."""
    sp = decode(path.read_bytes()).scheduled
    consumer, producer = next(
        (i.id, d.src) for i in sp.program.instrs for d in i.deps if d.kind == "raw"
    )
    slots = list(sp.slots)
    s, p = slots[consumer], slots[producer]
    slots[consumer] = Slot(s.instr, s.unit, p.start, p.start + s.end - s.start)
    old = decode(path.read_bytes())
    early = EdfFile(dataclasses.replace(sp, slots=tuple(slots)), old.metadata)
    path.write_bytes(encode(early))
    return consumer, producer


def flip_a_bit(edf: Path) -> None:
    raw = bytearray(edf.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    edf.write_bytes(bytes(raw))


def test_a_damaged_binary_is_rebuilt_before_it_is_tested(project):
    """The build's manifest check sees the changed bytes: rebuilt, warned once, then tested."""
    run_kiln(project, "compile", "gemm", check=True)
    edf = project / OUT / "gemm" / "small" / "kernel.edf"
    good = edf.read_bytes()
    flip_a_bit(edf)
    proc = run_kiln(project, "test", "gemm", "--target", "sim")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.count("changed since Kiln wrote it") == 1
    assert "PASS    gemm.small @ sim" in proc.stdout
    assert edf.read_bytes() == good


def test_damaged_binaries_fail_kiln_test_saying_why(project):
    """A flipped bit fails its checksum; a dependent started early is a race. Exit 1, no trace.

    The manifest is rewritten after the damage, as if Kiln itself had written
    these bytes (a bug, a bad disk under a trusted checksum): the build keeps
    them, so the simulator's own checks are what must refuse them.
    """
    from kiln.tasks.chain import manifest

    run_kiln(project, "compile", "gemm", check=True)
    edf = project / OUT / "gemm" / "small" / "kernel.edf"
    flip_a_bit(edf)
    wide = project / OUT / "gemm" / "wide" / "kernel.edf"
    consumer, producer = start_a_dependent_early(wide)
    for path in (edf, wide):
        manifest.record(str(path.parent), [str(path)])
    manifest.forget_index(str(project / ".kiln"))

    proc = run_kiln(project, "test", "gemm", "--target", "sim", "--junit", "j.xml")
    assert proc.returncode == 1
    assert "0 ran" in proc.stdout + proc.stderr  # the build does not notice: the sim must
    assert "ERROR   gemm.small @ sim" in proc.stdout
    rel_edf, rel_wide = edf.relative_to(project), wide.relative_to(project)
    assert f"{rel_edf}: error: corrupt EDF file:" in proc.stdout
    assert "checksum check failed" in proc.stdout
    assert "ERROR   gemm.wide @ sim" in proc.stdout
    refusal = f"{rel_wide}: the simulator refuses this binary: instruction {consumer} (`"
    assert refusal in proc.stdout
    assert f"before its raw dependency {producer} ends" in proc.stdout
    race = next(line for line in proc.stdout.splitlines() if "note: race on sram[" in line)
    assert f"instruction {producer} `" in race and f"instruction {consumer} `" in race
    assert "kiln test: 0 pass, 0 fail, 2 error, 0 skipped" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr

    suite = junit(project / "j.xml")
    assert (suite.get("tests"), suite.get("errors"), suite.get("failures")) == ("2", "2", "0")
    error = suite.find("testcase[@name='gemm.small']/error")
    assert error is not None and "checksum" in error.text and str(rel_edf) in error.text
    assert "race on sram[" in suite.find("testcase[@name='gemm.wide']/error").text
    errors = {r["kernel"]: r["message"] for r in report(project) if r["status"] == "error"}
    assert "checksum" in errors["gemm.small"] and "race on" in errors["gemm.wide"]


def test_a_wrong_lowering_fails_with_the_worst_element(project):
    use_bad_visa(project)
    proc = run_kiln(project, "test", "--target", "sim", "--junit", "j.xml")
    assert proc.returncode == 1

    expected, actual = vector_add_with_sub()
    c = compare(0, expected, actual, "f32")
    (i,) = c.worst_index
    assert c.expected == float(expected[i]) and c.actual == float(actual[i])
    line = (
        f"output 0 f32[256]: max abs err {c.max_abs:.3g}, max rel err {c.max_rel:.3g} "
        f"(rtol 0.0001, atol 0.0001); {c.mismatched} element(s) out of tolerance; worst at "
        f"index [{i}]: expected {float(expected[i])!r}, got {float(actual[i])!r}"
    )
    assert f"FAIL    vector_add.small @ sim\n    {line}\n" in proc.stdout
    for inst in INSTANCES[1:]:  # no add to corrupt in softmax and gemm
        assert f"PASS    {inst} @ sim" in proc.stdout
    assert "kiln test: 3 pass, 1 fail, 0 error, 0 skipped" in proc.stdout

    suite = junit(project / "j.xml")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("4", "1", "0")
    failure = suite.find("testcase[@name='vector_add.small']/failure")
    assert failure.get("message") == "output differs from the cpu oracle"
    assert failure.text == line

    (fail,) = [r for r in report(project) if r["status"] == "fail"]
    (out,) = fail["outputs"]
    assert out["worst_index"] == [i] and out["expected"] == float(expected[i])
    assert out["actual"] == float(actual[i]) and out["max_abs"] == c.max_abs


def test_a_kernel_tolerance_in_the_pipeline_is_honoured(project):
    """|(a - b) - (a + b)| = 2|b| < 2: atol 2 lets the wrong lowering through, per kernel."""
    use_bad_visa(project)
    failing = run_kiln(project, "test:vector_add.small@sim")  # the doit task fails too
    assert failing.returncode == 1
    assert "FAILED test:vector_add.small@sim" in failing.stdout + failing.stderr
    assert "worst at index" in failing.stdout + failing.stderr
    assert not (project / OUT / "vector_add" / "small" / "test-sim.json").exists()

    set_kernel_tolerance(project, "vector_add", "{rtol: 0, atol: 2.0}")
    proc = run_kiln(project, "test", "vector_add", "--target", "sim")
    assert proc.returncode == 0, proc.stdout
    assert "PASS    vector_add.small @ sim  (max abs err 2)" in proc.stdout
    (r,) = report(project)
    assert (r["outputs"][0]["rtol"], r["outputs"][0]["atol"]) == (0.0, 2.0)

    task = run_kiln(project, "test:vector_add.small@sim")
    assert task.returncode == 0 and ran_tasks(task) == ["test:vector_add.small@sim"]


def test_doit_test_tasks_run_through_the_kiln_command(project):
    listing = run_kiln(project, "list", "--all", check=True)
    for inst in INSTANCES:
        assert f"test:{inst}@sim" in listing.stdout
    assert "@cpu" not in listing.stdout  # the oracle is not checked against itself

    first = run_kiln(project, "test:vector_add.small@sim")  # doit's default command: run
    assert first.returncode == 0, first.stdout + first.stderr
    assert ran_tasks(first)[-1] == "test:vector_add.small@sim"
    # its compile ran first, however the build splits an instance into tasks
    assert any(t.startswith("compile:vector_add.small") for t in ran_tasks(first)[:-1])
    saved = json.loads((project / OUT / "vector_add" / "small" / "test-sim.json").read_text())
    assert saved["status"] == "pass" and saved["kernel"] == "vector_add.small"

    again = run_kiln(project, "test:vector_add.small@sim")
    assert again.returncode == 0 and ran_tasks(again) == []

    # `kiln run` is Kiln's own command; doit's `run` is reached after `--`
    explicit = run_kiln(project, "--", "run", "--always-execute", "test:vector_add.small@sim")
    assert explicit.returncode == 0, explicit.stdout + explicit.stderr
    assert "test:vector_add.small@sim" in ran_tasks(explicit)
    shadowed = run_kiln(project, "run", "test:vector_add.small@sim")
    assert shadowed.returncode == 2 and "no kernel matches" in shadowed.stderr


def test_a_skip_kiln_test_saved_never_makes_the_doit_test_task_up_to_date(project):
    edit(project, "  sim: {runner: sim, machine: npu-v1}\n", "  board: {runner: npu}\n")
    task = "test:vector_add.small@board"
    assert "1 skipped (target unavailable)" in run_kiln(project, task, check=True).stdout
    # kiln test keeps its skip in test-board.json, the file the doit task writes on a pass
    # (a target of pipeline.yaml: asked for with --target, it would stop before any check)
    assert run_kiln(project, "test", "vector_add.small").returncode == 0
    assert (project / OUT / "vector_add/small/test-board.json").is_file()
    again = run_kiln(project, task, check=True).stdout
    assert re.search(r"0 ran, \d+ up to date, 0 failed, 1 skipped \(target unavailable\)", again)


def test_a_target_tolerance_in_the_pipeline_is_honoured(project):
    """`targets.<name>.tolerance` loosens every kernel on that target (a kernel's own wins)."""
    use_bad_visa(project)
    edit(
        project,
        "sim: {runner: sim, machine: npu-v1}",
        "sim: {runner: sim, machine: npu-v1, tolerance: {rtol: 0, atol: 2.0}}",
    )
    proc = run_kiln(project, "test", "vector_add", "--target", "sim")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS    vector_add.small @ sim" in proc.stdout
    set_kernel_tolerance(project, "vector_add", "{atol: 0.001}")
    tighter = run_kiln(project, "test", "vector_add", "--target", "sim")
    assert tighter.returncode == 1 and "(rtol 0, atol 0.001)" in tighter.stdout


def test_a_misspelt_target_option_is_an_error_at_its_pipeline_line(project):
    edit(
        project,
        "sim: {runner: sim, machine: npu-v1}",
        "sim: {runner: sim, machine: npu-v1}\n  iree-cpu: {runner: iree, options: {devic: cuda}}",
    )
    proc = run_kiln(project, "test", "vector_add", "--target", "iree-cpu")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "error: unknown option 'devic' for the iree runner" in proc.stderr
    assert "pipeline.yaml:" in proc.stderr and "at key: targets.iree-cpu.options" in proc.stderr
    assert not (project / "build").exists()  # said before anything is built


def test_a_kernel_that_fails_only_on_the_host_is_an_error_at_its_line(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("")
    (tmp_path / "kernels" / "k.py").write_text(
        "from kiln import Tensor, device\n\n\n"
        "@device\n"
        'def picky(x: Tensor["N"]):  # noqa: F821\n'
        "    if not x.is_traced:\n"
        '        raise ValueError("only traced")\n'
        "    return x + 1.0\n\n\n"
        "@device\n"
        'def fine(x: Tensor["N"]):  # noqa: F821\n'
        "    return x * 2.0\n"
    )
    (tmp_path / "pipeline.yaml").write_text(
        "project: t\npackages: [kernels]\n"
        "kernels:\n  picky: {shapes: {N: 8}}\n  fine: {shapes: {N: 8}}\n"
        "targets:\n  sim: {runner: sim}\n"
    )
    proc = run_kiln(tmp_path, "test")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "ERROR   picky.default @ sim" in proc.stdout
    assert "kernels/k.py:7: error: kernel 'picky' raised ValueError when run on the host" in (
        proc.stdout
    )
    assert "PASS    fine.default @ sim" in proc.stdout
    assert "kiln test: 1 pass, 0 fail, 1 error, 0 skipped" in proc.stdout


def test_a_doit_test_task_runs_again_when_its_inputs_change(project):
    edit(project, "  vector_add:\n", "  vector_add:\n    inputs:\n      a: {positive: {}}\n")
    task = "test:vector_add.small@sim"
    assert task in ran_tasks(run_kiln(project, task, check=True))
    assert ran_tasks(run_kiln(project, task, check=True)) == []
    edit(project, "a: {positive: {}}", "a: {positive: {high: 8}}")
    assert ran_tasks(run_kiln(project, task, check=True)) == [task]  # a new verdict, no build
    (project / "data").mkdir()
    np.save(project / "data" / "b.npy", np.ones(256, np.float32))
    edit(project, "      a: {", "      b: {npy: data/b.npy}\n      a: {")
    assert task in ran_tasks(run_kiln(project, task, check=True))
    np.save(project / "data" / "b.npy", np.full(256, 2.0, np.float32))  # the file is a dep
    assert ran_tasks(run_kiln(project, task, check=True)) == [task]


def test_fail_fast_stops_the_checks_at_the_first_failure(project, tmp_path):
    """-x: vector_add.small fails on sim (the add-to-sub lowering); nothing runs after it."""
    from tests.support.board_plugin import install_board

    env = install_board(project, tmp_path / "site")  # `board` is right
    use_bad_visa(project)
    first = ("vector_add", "gemm", "--junit", "j.xml")
    proc = run_kiln(project, "test", *first, "-x", "--target", "board", "--target", "sim", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "PASS    vector_add.small @ board" in proc.stdout
    assert "FAIL    vector_add.small @ sim" in proc.stdout
    assert "gemm" not in proc.stdout.split("FAIL    vector_add.small @ sim")[1]
    assert "kiln test: 1 pass, 1 fail, 0 error, 0 skipped\n" in proc.stdout
    assert "kiln test: stopped at the first failure (--fail-fast)" in proc.stdout
    assert junit(project / "j.xml").get("tests") == "2"
    assert [(r["kernel"], r["target"]) for r in report(project)] == [
        ("vector_add.small", "board"),
        ("vector_add.small", "sim"),
    ]
    # the failing target first: the next target of the same instance does not run either
    env["KILN_FAIL_FAST"] = "1"
    proc = run_kiln(project, "test", "vector_add", "--target", "sim", "--target", "board", env=env)
    assert proc.returncode == 1 and "@ board" not in proc.stdout, proc.stdout
    assert "kiln test: 0 pass, 1 fail, 0 error, 0 skipped\n" in proc.stdout
    # without -x every check runs
    env.pop("KILN_FAIL_FAST")
    proc = run_kiln(project, "test", *first, "--target", "board", "--target", "sim", env=env)
    assert "kiln test: 5 pass, 1 fail, 0 error, 0 skipped\n" in proc.stdout
    assert "stopped" not in proc.stdout
    assert "stop at the first failure" in run_kiln(project, "help", "test").stdout


def test_a_target_named_twice_is_checked_once(project):
    proc = run_kiln(
        project, "test", "vector_add", "--target", "sim", "--target", "sim", "--junit", "j.xml"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASS    vector_add.small @ sim") == 1
    assert "kiln test: 1 pass, 0 fail, 0 error, 0 skipped" in proc.stdout
    assert junit(project / "j.xml").get("tests") == "1" and len(report(project)) == 1
