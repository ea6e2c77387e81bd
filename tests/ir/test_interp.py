"""Kiln dtype names and numpy dtypes, with ml_dtypes imported only when bf16 is met."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kiln.ir.graph import TensorType
from kiln.ir.interp import NUMPY_DTYPES, evaluate, kiln_dtype


def test_every_name_maps_both_ways():
    assert list(NUMPY_DTYPES) == ["f32", "f16", "bf16", "i32", "bool"]
    for name, dtype in NUMPY_DTYPES.items():
        assert kiln_dtype(dtype) == name
    assert NUMPY_DTYPES["bf16"].name == "bfloat16"
    with pytest.raises(KeyError):
        kiln_dtype(np.float64)
    with pytest.raises(KeyError):
        NUMPY_DTYPES["f64"]


def test_f32_work_never_imports_ml_dtypes_and_bf16_still_works():
    script = textwrap.dedent(
        """
        import sys
        import numpy as np
        import kiln.stages.trace, kiln.stages.visa, kiln.stages.lir
        import kiln.stages.schedule, kiln.stages.edf
        from kiln.inputs import random_inputs
        from kiln.ir.interp import kiln_dtype, run_graph
        from kiln.lang.dtypes import eager_input_dtype, normalize
        from kiln.stages.trace import TraceRequest, run

        (a,) = random_inputs("k", [((4,), "f32")])
        assert kiln_dtype(a.dtype) == "f32" and normalize("float32") == "f32"
        assert eager_input_dtype(np.dtype(np.float64)) == "f32"
        request = TraceRequest("kernels.normalization", "softmax", (("R", 4), ("C", 4)))
        graph = run(request, kiln.stages.trace.Options(), None)
        run_graph(graph, random_inputs("k", [((4, 4), "f32")]))  # the oracle, op by op
        assert "ml_dtypes" not in sys.modules, "imported for f32 work"
        (b,) = random_inputs("k", [((4,), "bf16")])
        assert kiln_dtype(b.dtype) == "bf16" and eager_input_dtype(b.dtype) == "bf16"
        assert normalize(b.dtype) == "bf16"
        """
    )
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([sys.executable, "-c", script], check=True, cwd=repo)  # kernels/ importable


@pytest.mark.filterwarnings("error")  # numpy's cast warnings must not reach the user
def test_out_of_range_casts_keep_numpys_result_without_a_warning():
    big = np.array([1e10, -1e10, np.nan, np.inf, 2.5], np.float32)
    with np.errstate(all="ignore"):
        want_i32 = big.astype(np.int32)
        want_f16 = big.astype(np.float16)
    got = evaluate("cast", [big], {"dtype": "i32"}, TensorType((5,), "i32"))
    np.testing.assert_array_equal(got, want_i32)
    got = evaluate("cast", [big], {"dtype": "f16"}, TensorType((5,), "f16"))
    np.testing.assert_array_equal(got, want_f16)
    assert got[0] == np.inf and got[4] == np.float16(2.5)


@pytest.mark.filterwarnings("error")
def test_bf16_to_i32_of_nan_inf_and_out_of_range_matches_f16_and_f32():
    """ml_dtypes casts bf16 NaN/inf to int32 as 0, but the sim and IREE convert through f32."""
    values = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 2.7, -2.7], np.float32)
    with np.errstate(all="ignore"):
        want = values.astype(np.int32)
    for dtype in ("f32", "f16", "bf16"):
        with np.errstate(over="ignore"):  # 3e9 is inf in f16, which still casts to INT_MIN
            x = values.astype(NUMPY_DTYPES[dtype])
        got = evaluate("cast", [x], {"dtype": "i32"}, TensorType((7,), "i32"))
        np.testing.assert_array_equal(got, want, err_msg=dtype)


def test_pow_gives_the_same_bits_for_a_broadcast_exponent():
    """The sim reads a constant exponent as a stride-0 view; numpy's loop for that case
    computed (-inf) ** 0.5 as sqrt (nan) and (-0.0) ** 0.5 as -0.0, unlike the oracle."""
    base = np.array([-np.inf, -0.0, 4.0, -2.0, np.inf], np.float32)
    for e in (0.5, 2.0, -1.0, 3.0):
        view = np.broadcast_to(np.float32(e), base.shape)
        want = evaluate(
            "pow", [base, np.full(base.shape, e, np.float32)], {}, TensorType((5,), "f32")
        )
        got = evaluate("pow", [base, view], {}, TensorType((5,), "f32"))
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    assert got[0] == np.float32(-np.inf) ** 3  # (-inf) ** 3, from the last exponent


@pytest.mark.parametrize(
    "op,inputs,attrs,out",
    [
        ("sum", [np.full((2, 8), 3e38, np.float32)], {"axes": (1,)}, TensorType((2,), "f32")),
        (
            "matmul",
            [np.full((2, 4), 3e38, np.float32), np.full((4, 2), 3e38, np.float32)],
            {},
            TensorType((2, 2), "f32"),
        ),
    ],
)
def test_an_overflowing_reduction_or_matmul_is_inf_without_a_numpy_warning(op, inputs, attrs, out):
    """The oracle overflows as every target does: numpy's RuntimeWarning, with its own
    file path, leaked into `kiln test` and `kiln run` output."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = evaluate(op, inputs, attrs, out)
    assert np.isinf(result).all()
