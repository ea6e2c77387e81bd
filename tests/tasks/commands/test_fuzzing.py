"""`kiln test KERNEL --fuzz N` through the CLI, in a temporary project of its own."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import machines_yaml, run_kiln
from tests.support.pipelines import STAGES

KERNELS = """\
from kiln import Tensor, device
from kiln.lang.tensor import _TRACING


@device
def scale(x: Tensor["N"]):
    return x * 2.0


@device
def odd_bug(x: Tensor["N"]):
    # compiled, the kernel is off by one at odd sizes; the oracle (run eagerly) never is
    if x.shape[0] % 2 == 1 and _TRACING.get() is not None:
        return x * 2.0 + 1.0
    return x * 2.0


@device
def quads(x: Tensor["N"]):
    return x.reshape(x.shape[0] // 4, 4).sum(axis=-1)


@device
def fixed(x: Tensor[8]):
    return x + 1.0
"""

PIPELINE = (
    """\
project: fuzzing
packages: [kernels]
machine: npu-v1
kernels:
  scale:
    shapes: {N: 64}
    fuzz: {N: [1, 200]}
  odd_bug:
    shapes: {N: 64}
  quads:
    shapes: {N: 16}
    fuzz: {N: [1, 12]}
  fixed:
    shapes: {N: 8}
"""
    + STAGES
    + """\
targets:
  cpu: {runner: cpu}
  sim: {runner: sim}
machines:
"""
)

SUMMARY = re.compile(
    r"^fuzz: (\d+) bindings, (\d+) passed, (\d+) failed, (\d+) skipped \(seed (\d+)\)$", re.M
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("")
    (tmp_path / "kernels" / "fuzzme.py").write_text(KERNELS)
    (tmp_path / "pipeline.yaml").write_text(PIPELINE + machines_yaml())
    return tmp_path


def summary(stdout: str) -> tuple[int, ...]:
    found = SUMMARY.search(stdout)
    assert found, stdout
    return tuple(int(g) for g in found.groups())


def test_fuzzing_finds_an_odd_size_bug_that_the_declared_shape_misses(project):
    declared = run_kiln(project, "test", "odd_bug")
    assert declared.returncode == 0, declared.stdout + declared.stderr
    proc = run_kiln(project, "test", "odd_bug", "--fuzz", "8", "--junit", "r.xml")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    report = json.loads((project / "build/kiln/kernel/test-report.json").read_text())
    fuzz = report["fuzz"]
    assert (fuzz["kernel"], fuzz["seed"], fuzz["asked"]) == ("odd_bug", 0, 8)
    failed = sorted(b["binding"]["N"] for b in fuzz["bindings"] if b["status"] == "fail")
    passed = sorted(b["binding"]["N"] for b in fuzz["bindings"] if b["status"] == "pass")
    assert failed and all(n % 2 == 1 for n in failed)
    assert passed and all(n % 2 == 0 for n in passed)
    assert summary(proc.stdout) == (8, len(passed), len(failed), 0, 0)
    n = failed[0]
    line = f"shapes: {{default: {{N: 64}}, fuzz_N{n}: {{N: {n}}}}}"
    assert f"binding: N={n} (--seed 0)" in proc.stdout
    assert f"declare it under kernels.odd_bug in pipeline.yaml (beside its shape sets): {line}" in (
        proc.stdout
    )
    assert f"then: kiln test odd_bug.fuzz_N{n} --seed 0" in proc.stdout
    assert {r["status"] for r in report["reports"]} == {"pass", "fail"}
    assert all(r["fuzz"]["seed"] == 0 for r in report["reports"])
    cases = ET.parse(project / "r.xml").getroot().findall("testcase")
    assert len(cases) == 8  # one target (sim) per binding
    case = next(c for c in cases if c.get("name") == f"odd_bug.fuzz_N{n}")
    assert case.find("failure") is not None
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props == {
        "kiln.fuzz.binding": f"N={n}",
        "kiln.fuzz.seed": "0",
        "kiln.fuzz.snippet": line,
    }
    # the temporary instances lived under the state dir, and are gone
    assert sorted(p.name for p in (project / "build/kiln/kernel/odd_bug").iterdir()) == ["default"]
    assert not (project / ".kiln" / "fuzz").exists()
    # the line declares the binding: `kiln test` then sees the same failure, same arrays
    text = (project / "pipeline.yaml").read_text()
    pipeline = text.replace("  odd_bug:\n    shapes: {N: 64}", f"  odd_bug:\n    {line}")
    (project / "pipeline.yaml").write_text(pipeline)
    again = run_kiln(project, "test", f"odd_bug.fuzz_N{n}")
    assert again.returncode == 1, again.stdout + again.stderr
    fuzzed = next(r for r in report["reports"] if r["kernel"] == f"odd_bug.fuzz_N{n}")
    declared_report = json.loads((project / "build/kiln/kernel/test-report.json").read_text())
    assert declared_report["reports"][0]["outputs"] == fuzzed["outputs"]


def test_a_correct_kernel_passes_and_the_same_seed_draws_the_same_bindings(project):
    first = run_kiln(project, "test", "scale", "--fuzz", "6", "--seed", "4")
    assert first.returncode == 0, first.stdout + first.stderr
    assert summary(first.stdout) == (6, 6, 0, 0, 4)
    drawn = json.loads((project / "build/kiln/kernel/test-report.json").read_text())["fuzz"]
    assert all(1 <= b["binding"]["N"] <= 200 for b in drawn["bindings"])  # its fuzz: range
    second = run_kiln(project, "test", "scale", "--fuzz", "6", "--seed", "4", "-q")
    assert second.returncode == 0, second.stdout + second.stderr
    again = json.loads((project / "build/kiln/kernel/test-report.json").read_text())["fuzz"]
    assert [b["binding"] for b in again["bindings"]] == [b["binding"] for b in drawn["bindings"]]
    assert second.stdout.splitlines() == [
        "fuzz: 6 bindings, 6 passed, 0 failed, 0 skipped (seed 4)"
    ]


def test_bindings_the_kernels_shape_rules_refuse_are_skipped_and_counted(project):
    proc = run_kiln(project, "test", "quads", "--fuzz", "12")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary(proc.stdout) == (12, 3, 0, 9, 0)  # N in 1..12: 4, 8 and 12 divide by 4
    assert "SKIPPED quads.fuzz_N5 (N=5): stage 'trace' refuses it: reshape: cannot reshape" in (
        proc.stdout
    )


BROKEN_VISA = """\
\"\"\"The visa stage, deliberately broken: a partial tile after a whole one is dropped.\"\"\"

from kiln.stages import visa_emit
from kiln.stages.visa import (  # noqa: F401  the stage's interface, unchanged
    ARTIFACT,
    CAPABILITIES,
    DUMPS,
    EXACT_ROUND_TRIP,
    INPUT,
    NAME,
    Options,
    decode,
    read,
    run,
    run_with_side_artifacts,
    serialize,
    verify,
)

_boxes = visa_emit.iter_boxes


def _without_remainders(shape, box, inner=(), order="mn"):
    for origin, extent, first, last in _boxes(shape, box, inner, order):
        if not any(o and e < b for o, e, b in zip(origin, extent, box)):
            yield origin, extent, first, last


visa_emit.iter_boxes = _without_remainders
"""


def test_a_tiling_that_drops_the_remainder_tile_is_caught_by_fuzzing_not_by_the_declared_shape(
    project,
):
    # npu-tiny tiles gemm's output by 32: the declared 64s are whole tiles
    (project / "brokenvisa.py").write_text(BROKEN_VISA)
    text = (project / "pipeline.yaml").read_text()
    text = text.replace("machine: npu-v1", "machine: npu-tiny")
    text = text.replace("module: kiln.stages.visa}", "module: brokenvisa}")
    text = text.replace("kernels:\n", "kernels:\n  mm:\n    shapes: {M: 64, K: 64, N: 64}\n", 1)
    text = text.replace("    fuzz: {N: [1, 200]}\n", "")
    (project / "pipeline.yaml").write_text(text)
    (project / "kernels" / "mm.py").write_text(
        "from kiln import Tensor, device\n\n\n@device\n"
        'def mm(a: Tensor["M", "K"], b: Tensor["K", "N"]):\n    return a @ b\n'
    )
    declared = run_kiln(project, "test", "mm")
    assert declared.returncode == 0, declared.stdout + declared.stderr
    proc = run_kiln(project, "test", "mm", "--fuzz", "10", "-q")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    fuzz = json.loads((project / "build/kiln/kernel/test-report.json").read_text())["fuzz"]
    failed = [b["binding"] for b in fuzz["bindings"] if b["status"] == "fail"]
    passed = [b["binding"] for b in fuzz["bindings"] if b["status"] == "pass"]
    assert failed and passed
    partial = [any(b[d] > 32 and b[d] % 32 for d in ("M", "N")) for b in failed + passed]
    assert partial == [True] * len(failed) + [False] * len(passed)
    assert summary(proc.stdout) == (10, len(passed), len(failed), 0, 0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fuzz", "3"], "--fuzz draws shapes for one kernel, but the selection holds 4"),
        (["fixed", "--fuzz", "3"], "kernel 'fixed' has no symbolic dims to fuzz"),
        (["scale", "--fuzz", "0"], "expected a whole number of shape bindings, 1 or more"),
        (["scale", "--fuzz", "-1"], "expected a whole number of shape bindings, 1 or more"),
    ],
)
def test_a_fuzz_request_that_cannot_be_met_is_one_error(project, args, message):
    proc = run_kiln(project, "test", *args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (project / "build").exists()  # refused before any build


def test_a_fuzz_range_for_a_dim_the_kernel_lacks_is_an_error_at_its_line(project):
    text = (project / "pipeline.yaml").read_text().replace("fuzz: {N: [1, 200]}", "fuzz: {Q: 4}")
    (project / "pipeline.yaml").write_text(text)
    proc = run_kiln(project, "test", "scale", "--fuzz", "2")
    assert proc.returncode == 2
    assert "pipeline.yaml:7:" in proc.stderr
    assert "kernel 'scale' has no dim 'Q' to fuzz" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_dim_read_from_an_npy_input_is_fixed_at_the_files_size(project):
    """Every binding matches the file: N comes from it, only M is drawn; none is skipped."""
    import numpy as np

    source = project / "kernels" / "fuzzme.py"
    source.write_text(
        source.read_text()
        + '\n\n@device\ndef rows_by(x: Tensor["M", "N"], w: Tensor["N"]):\n    return x * w\n'
    )
    (project / "data").mkdir()
    np.save(project / "data" / "w.npy", np.arange(1, 6, dtype=np.float32))
    text = (project / "pipeline.yaml").read_text()
    entry = "  rows_by:\n    shapes: {M: 4, N: 5}\n    inputs:\n      w: {npy: data/w.npy}\n"
    (project / "pipeline.yaml").write_text(text.replace("kernels:\n", "kernels:\n" + entry, 1))
    proc = run_kiln(project, "test", "rows_by", "--fuzz", "6", "--seed", "2", "-v")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "N = 5, as data/w.npy has it (an npy input)" in proc.stdout
    assert summary(proc.stdout) == (6, 6, 0, 0, 2)
    drawn = json.loads((project / "build/kiln/kernel/test-report.json").read_text())["fuzz"]
    assert {b["binding"]["N"] for b in drawn["bindings"]} == {5}
    assert len({b["binding"]["M"] for b in drawn["bindings"]}) == 6


def test_fail_fast_stops_fuzzing_at_the_first_failing_binding(project):
    proc = run_kiln(project, "test", "odd_bug", "--fuzz", "8", "-x")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((project / "build/kiln/kernel/test-report.json").read_text())
    statuses = [b["status"] for b in report["fuzz"]["bindings"]]
    assert statuses[-1] == "fail" and "fail" not in statuses[:-1] and len(statuses) < 8
    left = 8 - len(statuses)
    assert f"stopped at the first failing binding (--fail-fast); {left} binding(s)" in proc.stdout
