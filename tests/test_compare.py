"""kiln.compare: the oracle check, pinned with values worked out by hand."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from kiln.compare import DEFAULT_TOLERANCES, compare, tolerance_for

F32 = np.float32


def test_one_bad_element_is_the_worst_with_its_index_and_both_values():
    # err = [0, 0.5, 0]; allowed = 1e-4 + 1e-4 * |e| -> only index 1 is out
    c = compare(0, np.array([1.0, 2.0, 3.0], F32), np.array([1.0, 2.5, 3.0], F32), "f32")
    assert not c.ok and c.problem is None
    assert c.mismatched == 1
    assert c.worst_index == (1,)
    assert (c.expected, c.actual) == (2.0, 2.5)
    assert c.max_abs == pytest.approx(0.5)
    assert c.max_rel == pytest.approx(0.25)
    text = c.describe()
    assert "output 0 f32[3]" in text
    assert "max abs err 0.5, max rel err 0.25" in text
    assert "1 element(s) out of tolerance" in text
    assert "worst at index [1]: expected 2.0, got 2.5" in text


def test_worst_is_the_largest_excess_over_tolerance_not_the_largest_error():
    # rtol 1%: index 0 may be off by 1.0 and is off by 0.5 (fine); index 1 may be off
    # by 0 and is off by 0.125 (bad), although its absolute error is smaller
    expected = np.array([100.0, 0.0], F32)
    actual = np.array([100.5, 0.125], F32)
    c = compare(3, expected, actual, "f32", {"rtol": 0.01, "atol": 0.0})
    assert not c.ok and c.mismatched == 1
    assert c.worst_index == (1,)
    assert (c.expected, c.actual) == (0.0, 0.125)
    assert c.max_abs == 0.5  # the largest error is still reported
    assert c.output == 3 and (c.rtol, c.atol) == (0.01, 0.0)


def test_worst_index_of_a_matrix_is_a_full_index():
    expected = np.zeros((3, 4), F32)
    actual = expected.copy()
    actual[2, 1] = -1.0
    actual[0, 3] = 0.5
    c = compare(0, expected, actual, "f32")
    assert c.worst_index == (2, 1) and c.actual == -1.0 and c.mismatched == 2
    assert "worst at index [2, 1]" in c.describe()


def test_error_within_atol_plus_rtol_passes_and_just_outside_fails():
    e = np.array([1.0, -1.0])
    inside = compare(0, e, e + np.array([1.9e-4, -1.9e-4]), "f32")  # allowed 2e-4
    assert inside.ok and inside.mismatched == 0 and inside.max_abs == pytest.approx(1.9e-4)
    assert "worst at index" not in inside.describe()
    outside = compare(0, e, e + np.array([2.1e-4, 0.0]), "f32")
    assert not outside.ok and outside.worst_index == (0,)


def test_i32_is_exact():
    e = np.array([3, -7, 8], np.int32)
    assert compare(0, e, e.copy(), "i32").ok
    c = compare(0, e, np.array([3, -6, 8], np.int32), "i32")
    assert not c.ok and c.worst_index == (1,) and (c.expected, c.actual) == (-7.0, -6.0)


def test_half_precision_defaults_are_looser():
    e = np.array([1.0], ml_dtypes.bfloat16)
    a = np.array([1.0 + 2**-6], ml_dtypes.bfloat16)  # off by 0.0156: inside bf16's 5e-2 + 5e-2
    assert compare(0, e, a, "bf16").ok
    assert not compare(0, e.astype(F32), a.astype(F32), "f32").ok


def test_tolerance_override_replaces_only_the_keys_given():
    assert tolerance_for("f32") == DEFAULT_TOLERANCES["f32"] == (1e-4, 1e-4)
    assert tolerance_for("f16", {"atol": 0.5}) == (1e-2, 0.5)
    assert tolerance_for("i32", {"rtol": 1, "atol": 2}) == (1.0, 2.0)
    assert tolerance_for("unknown-dtype") == (1e-4, 1e-4)


def test_nan_matches_nan():
    e = np.array([1.0, np.nan], F32)
    c = compare(0, e, e.copy(), "f32")
    assert c.ok and c.max_abs == 0.0 and c.mismatched == 0


def test_nan_where_a_number_is_expected_is_the_worst_element():
    c = compare(0, np.array([1.0, 2.0], F32), np.array([1.5, np.nan], F32), "f32")
    assert not c.ok and c.mismatched == 2
    assert c.worst_index == (1,) and c.expected == 2.0 and np.isnan(c.actual)
    assert c.max_abs == float("inf")


def test_a_number_where_nan_is_expected_fails():
    c = compare(0, np.array([1.0, np.nan], F32), np.array([1.0, 2.0], F32), "f32")
    assert not c.ok and c.worst_index == (1,)


def test_an_infinity_of_the_wrong_sign_fails():
    c = compare(0, np.array([np.inf, 1.0], F32), np.array([-np.inf, 1.0], F32), "f32")
    assert not c.ok and c.worst_index == (0,)


def test_matching_infinities_pass():
    e = np.array([np.inf, -np.inf, 1.0], F32)
    c = compare(0, e, e.copy(), "f32")
    assert c.ok and c.max_abs == 0.0 and c.max_rel == 0.0


def test_shape_mismatch_is_a_problem_not_a_crash():
    c = compare(1, np.zeros((2, 2), F32), np.zeros(3, F32), "f32")
    assert not c.ok
    assert c.problem == "shape [3] differs from expected [2, 2]"
    assert c.describe() == "output 1: shape [3] differs from expected [2, 2]"
    assert c.worst_index is None


def test_empty_outputs_agree():
    c = compare(0, np.zeros((0, 4), F32), np.zeros((0, 4), F32), "f32")
    assert c.ok and c.worst_index is None and c.max_abs == 0.0


def test_to_dict_is_json_ready():
    c = compare(0, np.array([[1.0, 2.0]], F32), np.array([[1.0, 3.0]], F32), "f32")
    d = json.loads(json.dumps(c.to_dict()))
    assert d["shape"] == [1, 2] and d["worst_index"] == [0, 1]
    assert d["expected"] == 2.0 and d["actual"] == 3.0 and d["ok"] is False
    assert d["mismatched"] == 1 and d["problem"] is None
