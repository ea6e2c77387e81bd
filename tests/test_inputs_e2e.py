"""Issue 28 end to end, in a fresh project (`kiln init`): a PASS that means the kernel is right.

- A top-1 accuracy kernel gets float labels in [-1, 1) by default: never a
  class, so every target returns 0.0 and the check is vacuous (a warning;
  a failure under --strict). With `labels` as integers in range, the
  accuracy is non-zero on every target.
- A bad `inputs:` entry is one error at its line from kiln test, kiln run
  and plain doit.
- `dtype: [f32, bf16]` makes one kernel per dtype; a bf16 output saved by
  `kiln run --save-outputs` reads with plain np.load and kiln.load_outputs.

Kept cheap: tiny shapes, sim and cpu, one iree-cpu run when kiln[iree] is here.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

import kiln
from tests.conftest import run_kiln

METRICS = '''\
"""Metrics over a batch of logits."""

# ruff: noqa: F821
import kiln
from kiln import Tensor, device


@device
def top1_accuracy(logits: Tensor["B", "C"], labels: Tensor["B"]):
    """The fraction of rows whose largest logit is at the row's label."""
    predicted = kiln.cast(kiln.argmax(logits, axis=-1), "f32")
    return kiln.cast(kiln.equal(predicted, labels), "f32").mean()
'''
ENTRY = "  top1_accuracy:\n    shapes: {B: 256, C: 10}\n"
INPUTS = (
    "    inputs:\n"
    "      logits: {normal: {mean: 0, std: 1}}\n"
    "      labels: {integers: {low: 0, high: 10}}\n"
)
HAS_IREE = importlib.util.find_spec("iree.runtime") is not None


@pytest.fixture
def fresh(tmp_path: Path) -> Path:
    """`kiln init`, plus the top-1 accuracy kernel declared without inputs."""
    project = tmp_path / "fresh"
    run_kiln(tmp_path, "init", str(project), check=True)
    (project / "kernels" / "metrics.py").write_text(METRICS)
    pipeline = project / "pipeline.yaml"
    pipeline.write_text(pipeline.read_text().replace("kernels:\n", "kernels:\n" + ENTRY, 1))
    return project


def edit(project: Path, old: str, new: str) -> str:
    path = project / "pipeline.yaml"
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))
    return path.read_text()


def test_top1_accuracy_is_vacuous_without_inputs_and_right_with_them(fresh: Path):
    proc = run_kiln(fresh, "test", "top1_accuracy", "--target", "sim")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS    top1_accuracy.default @ sim" in proc.stdout
    assert "warning: vacuous check: the oracle's output 0 is zero" in proc.stdout
    assert "kernels.top1_accuracy.inputs" in proc.stdout  # where to choose them
    strict = run_kiln(fresh, "test", "top1_accuracy", "--target", "sim", "--strict",
                      "--junit", "junit.xml")  # fmt: skip
    assert strict.returncode == 1, strict.stdout + strict.stderr
    assert "FAIL    top1_accuracy.default @ sim" in strict.stdout
    assert "error (--strict): vacuous check" in strict.stdout
    case = ET.parse(fresh / "junit.xml").getroot().find("testcase")
    assert "--strict" in case.find("failure").get("message")

    edit(fresh, ENTRY, ENTRY + INPUTS)
    proc = run_kiln(fresh, "test", "top1_accuracy", "--target", "sim", "--strict")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS    top1_accuracy.default @ sim" in proc.stdout and "warning" not in proc.stdout
    accuracy = {}
    for target in ["cpu", "sim"] + ["iree-cpu"] * HAS_IREE:
        out = fresh / f"out-{target}"
        run_kiln(fresh, "run", "top1_accuracy", "--target", target, "--save-outputs",
                 str(out), check=True)  # fmt: skip
        accuracy[target] = float(kiln.load_outputs(out)["out0"])
    assert len(set(accuracy.values())) == 1, accuracy
    assert 0.05 < accuracy["cpu"] < 0.2, accuracy  # about 1 in 10 with random logits


BAD = [
    ("unknown argument", "      lables: {integers: {low: 0, high: 10}}\n", "lables",
     "has no argument 'lables'"),
    ("unknown distribution", "      labels: {categorical: {n: 10}}\n", "categorical",
     "unknown input distribution 'categorical'"),
    ("low above high", "      labels: {integers: {low: 10, high: 0}}\n", "labels",
     "low 10 >= high 0"),
    ("missing npy", "      labels: {npy: data/labels.npy}\n", "labels", "no such .npy file"),
    ("mis-shaped npy", "      labels: {npy: data/short.npy}\n", "labels",
     "has shape [3], the argument [256]"),
    ("empty npy", "      labels: {npy: data/empty.npy}\n", "labels",
     "data/empty.npy is not a .npy file numpy can read"),
    ("integers past int64", "      labels: {integers: {low: 0, high: 99999999999999999999}}\n",
     "labels", "integers.high 99999999999999999999 is out of range: the argument is f32"),
    ("constant past f32", "      logits: {constant: 1e39}\n", "logits",
     "constant 1e+39 is beyond f32's range"),
    ("uniform past f32", "      logits: {uniform: {low: -1e39, high: 1e39}}\n", "logits",
     "uniform.low -1e+39 is beyond f32's range"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "entry", "marker", "words"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_inputs_entry_is_one_error_at_its_line_everywhere(fresh, case, entry, marker, words):
    (fresh / "data").mkdir()
    np.save(fresh / "data" / "short.npy", np.zeros(3, np.float32))
    (fresh / "data" / "empty.npy").write_bytes(b"")
    text = edit(fresh, ENTRY, ENTRY + "    inputs:\n" + entry)
    line = next(i for i, x in enumerate(text.splitlines(), 1) if marker in x)
    doit = subprocess.run([sys.executable, "-m", "doit", "compile"], cwd=fresh,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    for proc in (
        run_kiln(fresh, "compile"),
        run_kiln(fresh, "test", "--target", "sim"),
        run_kiln(fresh, "run", "top1_accuracy", "--target", "sim"),
        doit,
    ):
        output = proc.stdout + proc.stderr
        assert proc.returncode == 2, output
        assert "Traceback" not in output and "Warning" not in output
        assert len(re.findall(r"\berror:", output)) == 1, output
        assert f"pipeline.yaml:{line}:" in output and words in output, output


def test_a_dtype_list_makes_one_instance_per_dtype_and_bf16_outputs_load(fresh: Path):
    edit(fresh, "  scale_add:\n    dtype: f32\n", "  scale_add:\n    dtype: [f32, bf16]\n")
    proc = run_kiln(fresh, "test", "scale_add_*.small", "--target", "sim")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS    scale_add_f32.small @ sim" in proc.stdout
    assert "PASS    scale_add_bf16.small @ sim" in proc.stdout
    out = fresh / "out"
    run_kiln(fresh, "run", "scale_add_bf16.small", "--target", "sim", "--save-outputs", str(out),
             check=True)  # fmt: skip
    plain = np.load(out / "out0.npy")  # no ml_dtypes needed to read the values
    assert plain.dtype == np.float32 and plain.shape == (1024,)
    loaded = kiln.load_outputs(out)["out0"]
    assert str(loaded.dtype) == "bfloat16"
    assert np.array_equal(loaded.astype(np.float32), plain)  # the widening is exact


def test_huge_normal_inputs_are_clipped_without_a_numpy_warning(fresh: Path):
    edit(fresh, ENTRY, ENTRY + "    inputs:\n      logits: {normal: {std: 3e38}}\n")
    for proc in (
        run_kiln(fresh, "run", "top1_accuracy", "--target", "cpu"),
        run_kiln(fresh, "test", "top1_accuracy", "--target", "sim"),
    ):
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, output
        assert "Warning" not in output and "overflow" not in output, output  # no numpy cast warning
    assert "PASS    top1_accuracy.default @ sim" in proc.stdout


def test_a_bf16_npy_file_feeds_a_bf16_argument_and_others_get_a_hint(fresh: Path):
    import ml_dtypes

    (fresh / "data").mkdir()
    x = np.linspace(-4, 4, 1024).astype(ml_dtypes.bfloat16)
    np.save(fresh / "data" / "bf.npy", x)  # numpy writes it as 2-byte voids: |V2
    np.save(fresh / "data" / "f64.npy", np.zeros(1024))
    edit(fresh, "    dtype: f32\n", "    dtype: bf16\n")
    small = "      small: {N: 1024}\n"
    edit(
        fresh, small, "      small: {N: 1024, inputs: {x: {npy: data/bf.npy}, y: {constant: 0}}}\n"
    )
    proc = run_kiln(fresh, "test", "scale_add.small", "--target", "sim")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS    scale_add.small @ sim" in proc.stdout
    out = fresh / "out"
    run_kiln(fresh, "run", "scale_add.small", "--target", "sim", "--save-outputs", str(out),
             check=True)  # fmt: skip
    assert np.array_equal(np.load(out / "out0.npy"), 2 * x.astype(np.float32))  # 2x + 0: exact

    text = edit(fresh, "data/bf.npy", "data/f64.npy")
    line = next(i for i, x in enumerate(text.splitlines(), 1) if "f64.npy" in x)
    for proc in (run_kiln(fresh, "compile"), run_kiln(fresh, "test", "--target", "sim")):
        output = proc.stdout + proc.stderr
        assert proc.returncode == 2 and "Traceback" not in output, output
        assert f"pipeline.yaml:{line}:" in output, output
        assert "data/f64.npy holds float64 values, the argument is bf16" in output
        assert "expected: dtype bfloat16 (numpy.save of an ml_dtypes.bfloat16 array" in output
        assert "found: float64" in output
        assert "save it as float32 with .astype(numpy.float32)" in output
