"""Test reports in the artifact cache: checked once per content, never served stale."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.conftest import run_kiln

OUT = Path("build/kiln/kernel")
CACHED = "PASS    vector_add.small @ sim  (max abs err 0, cached)"
CHECKED = "PASS    vector_add.small @ sim  (max abs err 0)"


def sim_test(project: Path, *args: str, env: dict | None = None) -> str:
    proc = run_kiln(project, "test", "vector_add", "--target", "sim", *args, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def saved_report(project: Path) -> dict:
    (found,) = json.loads((project / OUT / "test-report.json").read_text())["reports"]
    return found


def test_a_second_run_takes_the_report_from_the_cache(project):
    assert CHECKED in sim_test(project)
    first = saved_report(project)
    assert "cache" not in first
    assert CACHED in sim_test(project)
    second = saved_report(project)
    assert second["cache"] == "hit"
    assert second["path"] == first["path"] == "kernels.elementwise.vector_add"
    assert second["outputs"] == first["outputs"] and second["status"] == "pass"


def test_what_decides_a_report_is_in_its_key(project):
    sim_test(project)
    # another seed gives other inputs: checked again, then cached under its own key
    assert CHECKED in sim_test(project, "--seed", "3")
    assert CACHED in sim_test(project, "--seed", "3")
    # a comment or a blank line is not the oracle's code: nothing is checked again
    source = project / "kernels" / "elementwise.py"
    text = source.read_text()
    source.write_text("# a comment edit\n\n" + text + "\n# an edit the trace does not see\n")
    out = sim_test(project)
    assert CACHED in out and "all 1 of 1 result(s) taken from the cache" in out
    # the oracle runs the Python function: an edit of its code is a new report, even
    # one the traced graph does not show
    body = "    return a + b\n"
    assert body in text
    source.write_text(text.replace(body, "    total = a + b\n    return total\n", 1))
    assert CHECKED in sim_test(project)
    # a tolerance is part of the verdict
    text = (project / "pipeline.yaml").read_text()
    (project / "pipeline.yaml").write_text(
        text.replace("  vector_add:\n", "  vector_add:\n    tolerance: {atol: 0.5}\n", 1)
    )
    assert CHECKED in sim_test(project)
    assert CACHED in sim_test(project)


def test_no_report_is_cached_when_the_cache_is_off(project):
    off = {"KILN_CACHE": "0"}
    sim_test(project, env=off)
    assert CHECKED in sim_test(project, env=off)


def test_a_target_that_is_not_reproducible_always_runs(project):
    pytest.importorskip("iree.runtime", reason="the iree-cpu target needs kiln[iree]")
    iree = "targets:\n  iree-cpu: {runner: iree, options: {device: llvm-cpu}}\n"
    text = (project / "pipeline.yaml").read_text()
    (project / "pipeline.yaml").write_text(text.replace("targets:\n", iree))
    for _ in range(2):  # IREE's output is another compiler's: never taken from the cache
        proc = run_kiln(project, "test", "vector_add", "--target", "iree-cpu")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "PASS    vector_add.small @ iree-cpu" in proc.stdout
        assert "cached" not in proc.stdout
        # the build's exit skips the last garbage collection, but not when IREE's
        # bindings would then report their objects as leaked (tasks/execution/workers.py)
        assert "leaked" not in proc.stderr, proc.stderr[-500:]


def test_an_unwritable_cache_is_one_warning_and_the_tests_still_run(project):
    (project / "not-a-dir").write_text("a file where the cache goes\n")
    proc = run_kiln(project, "test", "vector_add", "--target", "sim",
                    env={"KILN_CACHE_DIR": str(project / "not-a-dir")})  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert CHECKED in proc.stdout
    assert proc.stderr.count("cannot be written") == 1, proc.stderr
    assert "KILN_CACHE_DIR" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "garbage",
    [
        {"status": "pass"},
        {"status": "pass", "outputs": 5},
        {"status": "pass", "outputs": [{"ok": True}]},  # no worst error to print
        {"status": "fail", "outputs": [{"ok": True, "max_abs": 0.0, "text": "fine"}]},
        {"status": "pass", "outputs": [{"ok": False, "max_abs": 1.0, "text": "wrong"}]},
        ["not", "a", "report"],
    ],
)
def test_a_damaged_cached_report_is_a_miss_and_is_replaced(project, garbage):
    sim_test(project)
    store = project / ".cache" / "store"
    data = json.dumps(garbage).encode()
    digest = hashlib.sha256(data).hexdigest()
    (store / "cas" / digest[:2]).mkdir(parents=True, exist_ok=True)
    (store / "cas" / digest[:2] / digest).write_bytes(data)
    damaged = 0
    for entry in (store / "ac").glob("*/*.json"):
        outputs = json.loads(entry.read_text())["outputs"]
        if "report" in outputs:
            entry.write_text(json.dumps({"outputs": {"report": digest}}))
            damaged += 1
    assert damaged == 1
    assert CHECKED in sim_test(project)  # run again, not printed from the damaged report
    assert CACHED in sim_test(project)  # and the report it wrote replaced the damaged one


def test_a_report_filed_under_another_checks_key_is_not_used(project):
    """Another instance's PASS put under this check's key (the entries swapped): both
    checks run again, and their own reports replace what was there."""
    run_kiln(project, "compile", check=True)
    for _ in range(2):
        proc = run_kiln(project, "test", "--target", "sim")
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("cached)") >= 2
    store = project / ".cache" / "store" / "ac"
    entries = store.glob("*/*.json")
    reports = [e for e in entries if "report" in json.loads(e.read_text())["outputs"]]
    first, second = reports[:2]
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(b)
    second.write_bytes(a)
    proc = run_kiln(project, "test", "--target", "sim")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checked = [line for line in proc.stdout.splitlines() if line.startswith("PASS")]
    assert sum("cached)" not in line for line in checked) == 2, proc.stdout


def test_a_cached_vacuous_warning_names_the_pipeline_file_of_the_run_reading_it(project):
    source = project / "kernels" / "elementwise.py"
    body = "    return a + b\n"
    assert body in source.read_text()
    source.write_text(source.read_text().replace(body, "    return 0.0 * a + 1.0 + 0.0 * b\n"))
    (project / "ci.yaml").write_text((project / "pipeline.yaml").read_text())
    first = sim_test(project)
    assert CHECKED in first and "under `kernels.vector_add.inputs` in pipeline.yaml" in first
    again = run_kiln(project, "-f", "ci.yaml", "test", "vector_add", "--target", "sim")
    assert CACHED in again.stdout, again.stdout + again.stderr
    assert "under `kernels.vector_add.inputs` in ci.yaml (docs/pipeline.md#inputs)" in again.stdout
    assert "pipeline.yaml" not in again.stdout
