"""kiln.outputs: the summary line `kiln run` prints and the files --save-outputs writes."""

import ml_dtypes
import numpy as np

from kiln.outputs import describe_output


def test_bf16_outputs_get_the_summary_line_f32_gets():
    values = np.linspace(0.5, 1.0, 9).astype(ml_dtypes.bfloat16)
    assert describe_output("0", values) == (
        "  out 0: bf16[9]  min 0.5  max 1  mean 0.75  std 0.161374"
    )
    grid = np.full((40, 40), 0.5625, ml_dtypes.bfloat16)
    assert (
        describe_output("1", grid)
        == "  out 1: bf16[40, 40]  min 0.5625  max 0.5625  mean 0.5625  std 0"
    )


def test_every_ml_dtypes_type_is_summarised_not_printed_as_its_repr():
    floats = np.array([1.0, np.nan, 3.0], ml_dtypes.float8_e4m3fn)
    assert describe_output("0", floats) == (
        "  out 0: float8_e4m3fn[3]  min 1  max 3  mean 2  std 1  non-finite 1"
    )
    ints = np.array([-3, 7], ml_dtypes.int4)
    assert describe_output("0", ints) == "  out 0: int4[2]  min -3  max 7  mean 2  std 5"


def test_integer_statistics_print_exactly():
    total = np.array(50331651, np.int32)
    assert describe_output("0", total) == (
        "  out 0: i32[]  min 50331651  max 50331651  mean 50331651  std 0"
    )
    pair = np.array([50331651, 50331652], np.int32)
    assert describe_output("0", pair) == (
        "  out 0: i32[2]  min 50331651  max 50331652  mean 50331651.5  std 0.5"
    )
    assert describe_output("0", np.array([1, 2, 4], np.int32)).endswith("mean 2.33333  std 1.24722")


def test_an_empty_output_and_a_non_array_are_described():
    assert describe_output("0", np.zeros((0, 3), np.float32)) == "  out 0: f32[0, 3]  (no values)"
    assert describe_output("out", {"a": 1}) == "  out: {'a': 1}"
