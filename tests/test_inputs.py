"""Inputs per argument, vacuous checks, dtype lists and saved outputs, without a build.

kiln.inputs (the one input generator), kiln.compare.vacuity, kiln.outputs,
the pipeline model's ``inputs:`` and ``dtype: [...]``, the JUnit writer and
the test report key's view of a kernel function (tasks/checks/report_cache.py).
The commands end to end: tests/test_inputs_e2e.py.
"""

from __future__ import annotations

import importlib.util
import textwrap
import warnings
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

import numpy as np
import pytest

from kiln.compare import vacuity
from kiln.errors import KilnError, PipelineError
from kiln.inputs import (
    DISTRIBUTIONS,
    FLOAT_MAX,
    argument_problem,
    input_key,
    random_inputs,
    spec_problem,
)
from kiln.ir.interp import NUMPY_DTYPES
from kiln.outputs import load_outputs, save_outputs
from kiln.pipeline import load_pipeline

# -- kiln.inputs --------------------------------------------------------------------


def test_arguments_without_a_spec_draw_what_they_always_drew():
    specs = [((4, 5), "f32"), ((3,), "i32"), ((2,), "bf16"), ((7,), "bool"), ((3,), "f16")]
    rng = np.random.default_rng([zlib.crc32(b"k.small"), 3])
    expected = [
        rng.uniform(-1.0, 1.0, size=(4, 5)).astype(np.float32),
        rng.integers(-8, 9, size=(3,), dtype=np.int32),
        rng.uniform(-1.0, 1.0, size=(2,)).astype(np.float32).astype(NUMPY_DTYPES["bf16"]),
        rng.integers(0, 2, size=(7,)).astype(np.bool_),
        rng.uniform(-1.0, 1.0, size=(3,)).astype(np.float32).astype(np.float16),
    ]
    for want, got in zip(expected, random_inputs("k.small", specs, seed=3), strict=True):
        assert got.dtype == want.dtype and np.array_equal(got, want)


def test_each_distribution_draws_in_its_range_and_dtype(tmp_path):
    table = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.save(tmp_path / "table.npy", table)
    specs = [
        ((4000,), "f32", {"uniform": {"low": 2, "high": 3}}),
        ((4000,), "f32", {"normal": {"mean": 10, "std": 0.5}}),
        ((4000,), "i32", {"integers": {"low": 0, "high": 1000}}),
        ((4000,), "f32", {"integers": {"low": 0, "high": 3}}),  # whole numbers as floats
        ((4000,), "f16", {"positive": {}}),
        ((2, 2), "i32", {"constant": 7}),
        ((2, 3), "bf16", {"npy": "table.npy"}),  # a half-float argument reads an f32 file
    ]
    u, n, labels, small, pos, const, npy = random_inputs("x", specs, root=tmp_path)
    assert u.dtype == np.float32 and 2 <= u.min() and u.max() < 3
    assert abs(n.mean() - 10) < 0.05 and abs(n.std() - 0.5) < 0.05
    assert labels.dtype == np.int32 and labels.min() == 0 and labels.max() == 999
    assert set(np.unique(small)) == {0.0, 1.0, 2.0}  # high is excluded, as numpy's
    assert pos.dtype == np.float16 and 0.5 <= pos.min() and pos.max() <= 2
    assert const.dtype == np.int32 and (const == 7).all()
    assert npy.dtype == NUMPY_DTYPES["bf16"] and np.array_equal(npy.astype(np.float32), table)
    # the same name and seed: the same arrays; another seed, others
    again = random_inputs("x", specs, root=tmp_path)
    assert all(
        np.array_equal(a, b) for a, b in zip(again, [u, n, labels, small, pos], strict=False)
    )
    assert not np.array_equal(random_inputs("x", specs, seed=1, root=tmp_path)[0], u)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"uniform": {"low": 1, "high": 1}}, "low 1 >= high 1"),
        ({"integers": {"low": 5, "high": 2}}, "low 5 >= high 2"),
        ({"positive": {"low": 0}}, "low <= 0"),
        ({"normal": {"std": 0}}, "std > 0"),
        ({"constant": float("inf")}, "finite"),
        ({"npy": "../elsewhere.npy"}, "outside the project"),
        ({"npy": "/abs/path.npy"}, "outside the project"),
    ],
)
def test_a_spec_that_holds_no_value_is_a_problem(spec, words):
    problem = spec_problem(spec)
    assert problem is not None and words in problem.message


def test_a_spec_is_checked_against_its_argument(tmp_path):
    np.save(tmp_path / "ok.npy", np.zeros((2, 3), np.float32))
    np.save(tmp_path / "i64.npy", np.zeros((2, 3), np.int64))
    (tmp_path / "junk.npy").write_text("not numpy")

    def problem(spec, dtype="f32", shape=(2, 3)):
        found = argument_problem(spec, dtype, shape, tmp_path)
        return found.message if found else None

    assert problem({"npy": "ok.npy"}) is None
    assert problem({"npy": "ok.npy"}, "bf16") is None
    assert "shape [2, 3], the argument [3, 2]" in problem({"npy": "ok.npy"}, shape=(3, 2))
    assert "no such .npy file" in problem({"npy": "missing.npy"})
    assert "not a .npy file" in problem({"npy": "junk.npy"})
    assert "int64 values, the argument is i32" in problem({"npy": "i64.npy"}, "i32")
    assert "draws floats, but the argument is i32" in problem({"normal": {}}, "i32")
    assert "is not an i32 value" in problem({"integers": {"low": 0, "high": 2**40}}, "i32")
    assert "is not an i32 value" in problem({"constant": 0.5}, "i32")
    assert problem({"integers": {"low": 0, "high": 2**40}}, "f32") is None


def test_a_bad_spec_given_by_hand_is_an_error_not_a_traceback(tmp_path):
    with pytest.raises(KilnError, match="argument 1: no such .npy file"):
        random_inputs("x", [((2,), "f32"), ((2,), "f32", {"npy": "gone.npy"})], root=tmp_path)


def test_an_empty_or_cut_npy_file_is_a_problem_not_a_crash(tmp_path):
    (tmp_path / "empty.npy").write_bytes(b"")  # np.load raises EOFError
    np.save(tmp_path / "ok.npy", np.zeros(3, np.float32))
    header = (tmp_path / "ok.npy").read_bytes()
    (tmp_path / "cut.npy").write_bytes(header[: header.index(b"'shape'") + 9])  # TokenError
    for name, found in [("empty.npy", "No data left in file"), ("cut.npy", None)]:
        problem = argument_problem({"npy": name}, "f32", (3,), tmp_path)
        assert problem.message == f"{name} is not a .npy file numpy can read", name
        assert problem.key == "npy" and problem.expected == "a file written by numpy.save"
        assert found is None or problem.found == found
    with pytest.raises(KilnError, match="argument 0: empty.npy is not a .npy file"):
        random_inputs("x", [((3,), "f32", {"npy": "empty.npy"})], root=tmp_path)


@pytest.mark.parametrize(
    ("spec", "dtype", "key", "expected"),
    [
        ({"low": 0, "high": 10**20}, "f32", "high", "high <= 9223372036854775808"),
        ({"low": 10**20 - 9, "high": 10**20}, "bf16", "high", "and bf16's range"),
        ({"low": -(2**63) - 1, "high": 0}, "f32", "low", "low >= -9223372036854775808"),
        ({"low": 0, "high": 65506}, "f16", "high", "low >= -65504 and high <= 65505"),
    ],
)
def test_an_integers_range_a_float_argument_cannot_hold_is_a_problem(spec, dtype, key, expected):
    problem = argument_problem({"integers": spec}, dtype, (4,), Path("."))
    assert (
        problem.message == f"integers.{key} {spec[key]!r} is out of range: the argument is {dtype}"
    )
    assert problem.key == f"integers.{key}" and problem.found == repr(spec[key])
    assert expected in problem.expected
    with pytest.raises(KilnError, match=f"argument 0: integers.{key} "):
        random_inputs("x", [((4,), dtype, {"integers": spec})])  # no numpy ValueError


def test_an_integers_range_at_the_edge_of_a_float_argument_draws_finite_values():
    specs = [
        ((1000,), "f32", {"integers": {"low": -(2**63), "high": 2**63}}),
        ((1000,), "f16", {"integers": {"low": -65504, "high": 65505}}),
    ]
    assert all(argument_problem(s, d, n, Path(".")) is None for n, d, s in specs)
    wide, half = random_inputs("x", specs)
    assert np.abs(wide).max() > 2**62 and np.isfinite(half).all() and np.abs(half).max() > 6e4


@pytest.mark.parametrize(
    ("spec", "dtype", "key", "found", "top"),
    [
        ({"uniform": {"low": -1e39, "high": 1e39}}, "f32", "uniform.low", "-1e+39", "3.4028"),
        ({"constant": 1e39}, "f32", "constant", "1e+39", "3.4028234663852886e+38"),
        ({"normal": {"std": 1e300}}, "f32", "normal.std", "1e+300", "3.4028"),
        ({"normal": {"mean": -4e38}}, "bf16", "normal.mean", "-4e+38", "3.3895313892515355e+38"),
        ({"uniform": {"low": 0, "high": 70000}}, "f16", "uniform.high", "70000", "±65504 "),
        ({"positive": {"high": 65505.0}}, "f16", "positive.high", "65505.0", "±65504 "),
        ({"constant": -65536}, "f16", "constant", "-65536", "±65504 "),
    ],
)
def test_a_float_parameter_beyond_the_arguments_dtype_is_a_problem(spec, dtype, key, found, top):
    problem = argument_problem(spec, dtype, (4,), Path("."))
    assert problem.message == f"{key} {found} is beyond {dtype}'s range"
    assert problem.key == key and problem.found == found
    assert problem.expected.startswith("a number within ±") and top in problem.expected


def test_drawing_inputs_never_warns_and_never_draws_inf(tmp_path):
    np.save(tmp_path / "big.npy", np.array([1e5, -1e5, 1.0], np.float32))
    specs = [
        ((4000,), "f32", {"normal": {"std": 3e38}}),  # a tail past f32: clipped
        ((4000,), "bf16", {"normal": {"mean": 3e38, "std": 1e38}}),
        ((4000,), "f16", {"normal": {"std": 6e4}}),
        ((4000,), "f32", {"uniform": {"low": -3.4e38, "high": 3.4e38}}),
        ((4000,), "f16", {"constant": 65504}),
        ((3,), "f16", {"npy": "big.npy"}),  # a file is read as it is: rounds to inf
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy RuntimeWarning fails the test
        wide, bf, half, uniform, const, npy = random_inputs("x", specs, root=tmp_path)
    for array, dtype in [(wide, "f32"), (bf, "bf16"), (half, "f16")]:
        top = FLOAT_MAX[dtype]
        assert np.isfinite(array).all() and array.astype(np.float32).max() == np.float32(top)
    assert np.isfinite(uniform).all() and np.abs(uniform).max() > 3e38
    assert (const == 65504).all()
    assert npy.dtype == np.float16 and npy.tolist() == [np.inf, -np.inf, 1.0]


def test_a_bf16_npy_file_reads_as_bf16_bits_for_a_bf16_argument(tmp_path):
    import ml_dtypes

    values = np.array([1.5, -2.0, 3e38, 1e-3, 0.0, -np.inf], ml_dtypes.bfloat16)
    np.save(tmp_path / "bf.npy", values)  # what numpy writes: descr '<V2'
    assert str(np.load(tmp_path / "bf.npy").dtype) == "|V2"
    assert argument_problem({"npy": "bf.npy"}, "bf16", (6,), tmp_path) is None
    (got,) = random_inputs("x", [((6,), "bf16", {"npy": "bf.npy"})], root=tmp_path)
    assert got.dtype == NUMPY_DTYPES["bf16"]
    assert np.array_equal(got.view(np.uint16), values.view(np.uint16))  # bit for bit
    np.save(tmp_path / "f64.npy", np.zeros(6))
    refused = [
        ("bf.npy", "f16", "|V2", "dtype float16 or float32"),  # 2 bytes, but whose?
        ("bf.npy", "f32", "|V2", "dtype float32"),
        ("f64.npy", "bf16", "float64", "dtype bfloat16 (numpy.save of an ml_dtypes.bfloat16"),
    ]
    for name, dtype, found, expected in refused:
        problem = argument_problem({"npy": name}, dtype, (6,), tmp_path)
        assert problem.message == f"{name} holds {found} values, the argument is {dtype}"
        assert problem.expected.startswith(expected) and problem.found == found
        assert problem.hint == "save it as float32 with .astype(numpy.float32)"
    np.save(tmp_path / "i64.npy", np.zeros(6, np.int64))
    problem = argument_problem({"npy": "i64.npy"}, "i32", (6,), tmp_path)
    assert problem.hint == "save it as int32 with .astype(numpy.int32)"


def test_the_input_key_holds_each_spec_and_an_npy_files_bytes(tmp_path):
    np.save(tmp_path / "t.npy", np.zeros(3, np.float32))
    specs = {"x": {"npy": "t.npy"}, "y": {"normal": {"std": 2}}, "z": None}
    first = input_key(specs, tmp_path)
    assert first["y"] == {"normal": {"mean": 0.0, "std": 2}} and "z" not in first
    np.save(tmp_path / "t.npy", np.ones(3, np.float32))
    assert input_key(specs, tmp_path)["x"] != first["x"]


def test_every_distribution_is_in_the_schema():
    from kiln.pipeline import load_schema

    kinds = load_schema()["$defs"]["input"]["properties"]
    assert set(kinds) == set(DISTRIBUTIONS)


# -- kiln.compare.vacuity -------------------------------------------------------------


@pytest.mark.parametrize(
    ("array", "words"),
    [
        (np.zeros((4, 4), np.float32), "all zeros"),
        (np.float32(0.0), "is zero"),
        (np.full(8, 0.25, np.float32), "0.25 everywhere"),
        (np.array([1.0, np.nan, np.inf], np.float32), "has 2 of 3 element(s) that are not finite"),
        (np.arange(4, dtype=np.int32), None),
        (np.float32(0.1), None),  # a one-element output is always "constant": not said
        (np.zeros((0,), np.float32), None),
    ],
)
def test_vacuity_names_what_makes_a_check_weak(array, words):
    found = vacuity(array)
    assert (found is None) if words is None else (words in found)


# -- kiln.outputs ------------------------------------------------------------------


def test_saved_outputs_load_with_plain_numpy_and_in_their_own_dtypes(tmp_path):
    bf16 = NUMPY_DTYPES["bf16"]
    outputs = [
        ("out0", np.array([1.5, -0.007812, 3e38], dtype=bf16)),
        ("out1", np.array([1.0, 2.5], dtype=np.float16)),
        ("out2", np.arange(3, dtype=np.int32)),
        ("out3", np.array([True, False])),
    ]
    written = save_outputs(outputs, tmp_path / "out")
    assert [p.name for p in written] == ["out0.npy", "out1.npy", "out2.npy", "out3.npy"]
    plain = np.load(tmp_path / "out" / "out0.npy")
    assert plain.dtype == np.float32  # not |V2 bytes: the exact widening of each value
    assert np.array_equal(plain, outputs[0][1].astype(np.float32))
    loaded = load_outputs(tmp_path / "out")
    assert list(loaded) == ["out0", "out1", "out2", "out3"]
    for name, array in outputs:
        assert loaded[name].dtype == array.dtype and np.array_equal(loaded[name], array)
    import kiln

    assert kiln.load_outputs(tmp_path / "out")["out0"].dtype == bf16


def test_outputs_without_a_manifest_and_missing_ones(tmp_path):
    for i in (10, 2):
        np.save(tmp_path / f"out{i}.npy", np.full(2, i, np.float32))
    assert list(load_outputs(tmp_path)) == ["out2", "out10"]
    with pytest.raises(KilnError, match="no saved outputs"):
        load_outputs(tmp_path / "nothing")
    save_outputs([("out0", np.zeros(2, np.float32))], tmp_path / "gone")
    (tmp_path / "gone" / "out0.npy").unlink()
    with pytest.raises(KilnError, match="cannot be read"):
        load_outputs(tmp_path / "gone")


# -- the test report's key: a kernel's code, not its module's bytes -----------------------


def _function(tmp_path: Path, name: str, text: str):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(text))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.k


def test_the_oracles_digest_ignores_comments_docstrings_and_lines(tmp_path):
    from kiln.tasks.checks.report_cache import function_digest

    base = _function(tmp_path, "m1", '''\
        def k(x, scale=2.0):
            """Doubles."""
            return [x * scale for _ in range(1)] if "a" in {"a", "b"} else x
    ''')  # fmt: skip
    moved = _function(tmp_path, "m2", '''\
        # a comment, and a helper the kernel does not call
        def helper():
            return 1


        def k(x, scale=2.0):
            """Doubles, said otherwise."""
            # a comment inside
            return [x * scale for _ in range(1)] if "a" in {"a", "b"} else x  # and here
    ''')  # fmt: skip
    changed = _function(tmp_path, "m3", '''\
        def k(x, scale=2.0):
            """Doubles."""
            return [x * scale for _ in range(2)] if "a" in {"a", "b"} else x
    ''')  # fmt: skip
    default = _function(tmp_path, "m4", '''\
        def k(x, scale=3.0):
            """Doubles."""
            return [x * scale for _ in range(1)] if "a" in {"a", "b"} else x
    ''')  # fmt: skip
    digests = [function_digest(f) for f in (base, moved, changed, default)]
    assert digests[0] == digests[1]
    assert len(set(digests)) == 3


# -- pipeline.yaml: inputs and dtype lists ------------------------------------------------

PIPELINE = """\
project: p
packages: [kernels]
kernels:
  top1_accuracy:
    dtype: [f32, bf16]
    inputs:
      logits: {normal: {mean: 0, std: 1}}
      labels: {integers: {low: 0, high: 10}}
    shapes:
      small: {B: 8, C: 10}
      wide:
        B: 8
        C: 100
        inputs:
          labels: {integers: {low: 0, high: 100}}
  other:
    shapes: {N: 4}
dumps:
  - kernels: [top1_accuracy, other]
    kinds: [summary]
"""


def load(tmp_path: Path, text: str):
    (tmp_path / "pipeline.yaml").write_text(text)
    return load_pipeline(tmp_path / "pipeline.yaml")


def test_a_dtype_list_makes_one_kernel_per_dtype_and_inputs_merge_per_shape_set(tmp_path):
    pipeline = load(tmp_path, PIPELINE)
    names = [k.name for k in pipeline.kernels]
    assert names == ["top1_accuracy_f32", "top1_accuracy_bf16", "other"]
    spec = pipeline.kernel("top1_accuracy_bf16")
    assert (spec.dtype, spec.entry, spec.function) == ("bf16", "top1_accuracy", "top1_accuracy")
    assert spec.key_path == "kernels.top1_accuracy"
    assert spec.shapes[1] == ("wide", (("B", 8), ("C", 100)))  # `inputs` is no dim
    assert spec.input_specs("small")["labels"] == {"integers": {"low": 0, "high": 10}}
    assert spec.input_specs("wide")["labels"] == {"integers": {"low": 0, "high": 100}}
    assert spec.input_specs("wide")["logits"] == {"normal": {"mean": 0, "std": 1}}
    assert (
        spec.input_key_path("wide", "labels") == "kernels.top1_accuracy.shapes.wide.inputs.labels"
    )
    assert spec.input_key_path("small", "labels") == "kernels.top1_accuracy.inputs.labels"
    assert pipeline.dumps[0].kernels == ("top1_accuracy_f32", "top1_accuracy_bf16", "other")
    assert pipeline.kernel("other").input_specs("default") == {}


@pytest.mark.parametrize(
    ("old", "new", "marker", "words"),
    [
        ("{normal: {mean: 0, std: 1}}", "{gaussian: {}}", "gaussian",
         "unknown input distribution 'gaussian' for argument 'logits'"),
        ("{normal: {mean: 0, std: 1}}", "normal", "logits:",
         "the input of argument 'logits' names no distribution"),
        ("{normal: {mean: 0, std: 1}}", "{normal: {}, uniform: {}}", "logits:",
         "names 2 distributions"),
        ("low: 0, high: 10", "low: 10, high: 0", "labels: {integers",
         "integers input has low 10 >= high 0"),
        ("std: 1", "std: -1", "logits:", "value out of range"),
        ("low: 0, high: 100", "low: 0, high: 1.5", "labels: {integers: {low: 0, high: 1.5",
         "wrong type"),
        ("dtype: [f32, bf16]", "dtype: [f32, f32]", "dtype:", "lists an item twice"),
        ("dtype: [f32, bf16]", "dtype: [f32, f64]", "dtype:", "invalid value"),
        ("  other:\n", "  top1_accuracy_bf16:\n", "dtype:", "named 'top1_accuracy_bf16'"),
    ],
)  # fmt: skip
def test_a_bad_entry_is_one_error_at_its_line(tmp_path, old, new, marker, words):
    text = PIPELINE.replace(old, new, 1)
    with pytest.raises(PipelineError) as caught:
        load(tmp_path, text)
    err = caught.value
    assert words in err.message, err.render()
    line = next(i for i, x in enumerate(text.splitlines(), 1) if marker in x)
    assert err.location.line == line, err.render()


# -- JUnit ---------------------------------------------------------------------------


def test_junit_carries_the_warning_and_strict_makes_it_a_failure(tmp_path):
    from kiln.tasks.checks.junit import write_junit

    passed = {
        "kernel": "k.small",
        "target": "sim",
        "status": "pass",
        "seconds": 0.1,
        "outputs": [{"ok": True, "max_abs": 0.0, "text": "fine"}],
        "warnings": ["vacuous check: the oracle's output 0 is all zeros"],
    }
    write_junit(tmp_path / "j.xml", [passed, {**passed, "status": "fail", "strict": True}])
    suite = ET.parse(tmp_path / "j.xml").getroot()
    assert suite.get("failures") == "1"
    ok, strict = suite.findall("testcase")
    assert ok.find("failure") is None
    assert "all zeros" in ok.find("properties/property").get("value")
    assert "all zeros" in ok.find("system-err").text
    assert "--strict" in strict.find("failure").get("message")
    assert "all zeros" in strict.find("failure").text


def test_an_apps_output_names_become_file_names_and_come_back_as_given(tmp_path):
    written = save_outputs([("stats.mean[0]", np.ones(2)), ("a/b", 3)], tmp_path)
    assert [p.name for p in written] == ["stats.mean_0_.npy", "a_b.npy"]
    loaded = load_outputs(tmp_path)
    assert list(loaded) == ["stats.mean[0]", "a/b"] and loaded["a/b"] == 3
