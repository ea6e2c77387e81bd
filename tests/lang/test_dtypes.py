"""Dtype promotion: the table, weak Python scalars, and eager == traced."""

import itertools

import ml_dtypes
import numpy as np
import pytest

import kiln
from kiln import Tensor, device, trace
from kiln.errors import TraceError
from kiln.ir.interp import NUMPY_DTYPES, run_graph
from kiln.lang import dtypes

# ruff: noqa: F821  (Tensor["N"] names a dim)

EXPECTED = {
    ("f32", "f32"): "f32",
    ("f32", "f16"): "f32",
    ("f32", "bf16"): "f32",
    ("f32", "i32"): "f32",
    ("f16", "f16"): "f16",
    ("f16", "bf16"): "f32",
    ("f16", "i32"): "f16",
    ("bf16", "bf16"): "bf16",
    ("bf16", "i32"): "bf16",
    ("i32", "i32"): "i32",
}


@pytest.mark.parametrize("a, b", list(itertools.product(dtypes.KERNEL_DTYPES, repeat=2)))
def test_promotion_table_is_symmetric_and_as_documented(a, b):
    want = EXPECTED.get((a, b)) or EXPECTED[(b, a)]
    assert dtypes.promote(a, b) == want == dtypes.promote(b, a)


def test_bool_promotes_to_the_other_operand():
    assert dtypes.promote("bool", "bool") == "bool"
    for other in dtypes.KERNEL_DTYPES:
        assert dtypes.promote("bool", other) == other


@device
def add(a: Tensor["N"], b: Tensor["N"]):
    return a + b


@pytest.mark.parametrize("a, b", list(itertools.product(dtypes.KERNEL_DTYPES, repeat=2)))
def test_eager_and_traced_agree_on_every_pair(a, b):
    x = np.array([1, 2], dtype=NUMPY_DTYPES[a])
    y = np.array([3, 4], dtype=NUMPY_DTYPES[b])
    eager = add(x, y)
    g = trace(add, {"N": 2}, {"a": a, "b": b})
    assert g.nodes[-1].dtype == dtypes.promote(a, b)
    assert eager.dtype == NUMPY_DTYPES[dtypes.promote(a, b)]
    np.testing.assert_array_equal(eager, run_graph(g, [x, y])[0])
    assert eager.astype(np.float32).tolist() == [4, 6]


@device
def with_scalars(x: Tensor["N"]):
    return x + 1, x * 0.5, x + True


@pytest.mark.parametrize(
    "dtype, int_result, float_result",
    [
        ("f32", "f32", "f32"),
        ("f16", "f16", "f16"),
        ("bf16", "bf16", "bf16"),
        ("i32", "i32", "f32"),
    ],
)
def test_python_scalars_are_weak(dtype, int_result, float_result):
    g = trace(with_scalars, {"N": 2}, dtype)
    plus_int, times_float, plus_bool = (g.nodes[i].dtype for i in g.outputs)
    assert (plus_int, times_float, plus_bool) == (int_result, float_result, dtype)
    eager = with_scalars(np.array([2, 4], dtype=NUMPY_DTYPES[dtype]))
    assert [str(e.dtype) for e in eager] == [
        str(NUMPY_DTYPES[d]) for d in (int_result, float_result, dtype)
    ]


@device
def bool_math(x: Tensor["N"]):
    mask = x > 0
    return mask + mask, mask * 1.5, -mask, mask.sum(), mask == True  # noqa: E712


def test_bool_in_arithmetic_becomes_i32():
    g = trace(bool_math, {"N": 3}, "f32")
    assert [g.nodes[i].dtype for i in g.outputs] == ["i32", "f32", "i32", "i32", "bool"]
    twice, scaled, neg, count, same = bool_math(np.array([1, -1, 2], np.float32))
    assert twice.tolist() == [2, 0, 2]
    assert scaled.tolist() == [1.5, 0, 1.5]
    assert neg.tolist() == [-1, 0, -1]
    assert count == 2
    assert same.tolist() == [True, False, True]


@device
def float_ops_on_ints(x: Tensor["N"]):
    return x.exp(), kiln.sqrt(x), x.relu(), abs(x)


def test_float_only_ops_cast_integers_to_f32():
    g = trace(float_ops_on_ints, {"N": 2}, "i32")
    assert [g.nodes[i].dtype for i in g.outputs] == ["f32", "f32", "i32", "i32"]
    _, root, relu, absolute = float_ops_on_ints(np.array([4, -9], np.int32))
    assert root[0] == 2
    assert relu.tolist() == [4, 0] and absolute.tolist() == [4, 9]


def test_dtype_names_and_numpy_types_normalize():
    assert dtypes.normalize("float32") == "f32"
    assert dtypes.normalize(np.float16) == "f16"
    assert dtypes.normalize(ml_dtypes.bfloat16) == "bf16"
    assert dtypes.normalize(np.dtype("int32")) == "i32"
    assert kiln.f32 == "f32" and kiln.bf16 == "bf16"
    with pytest.raises(TraceError, match="unsupported dtype float64"):
        dtypes.normalize(np.float64)
    with pytest.raises(TraceError, match="unsupported dtype 'bool'"):
        dtypes.normalize("bool", allow_bool=False)


def test_half_precision_is_rounded_once_per_op():
    @device
    def chain(x: Tensor["N"]):
        return (x * 3.0) / 3.0

    x = np.array([0.1], dtype=ml_dtypes.bfloat16)
    out = chain(x)
    step = (x.astype(np.float32) * 3).astype(ml_dtypes.bfloat16)
    assert out == (step.astype(np.float32) / 3).astype(ml_dtypes.bfloat16)


def test_docs_promotion_tables_match_the_code():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "language.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| **")]
    assert len(rows) == 5
    header = ["f32", "f16", "bf16", "i32", "bool"]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        left = cells[0].strip("*")
        for right, want in zip(header, cells[1:], strict=True):
            assert dtypes.promote(left, right) == want, (left, right)
    weak = {"float": 1, "int": 2, "bool": 3}
    for line in text.splitlines():
        if line.startswith("| f32 / f16 / bf16 |") or line.startswith(("| i32 |", "| bool |")):
            cells = [c.strip() for c in line.strip("|").split("|")]
            for tensor in ("f32", "f16", "bf16") if "/" in cells[0] else (cells[0],):
                for kind, col in weak.items():
                    want = tensor if cells[col] == "that float" else cells[col]
                    assert dtypes.WEAK_PROMOTION[(tensor, kind)] == want, (tensor, kind)
