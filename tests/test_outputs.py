"""kiln.outputs: the summary line `kiln run` prints and the files --save-outputs writes."""

import ml_dtypes
import numpy as np
import pytest

from kiln.errors import KilnError
from kiln.outputs import describe_output, flatten_outputs, load_outputs, save_outputs


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


def test_outputs_whose_names_clean_to_one_file_name_are_all_saved(tmp_path):
    outputs = flatten_outputs({"a/b": np.ones(3), "a_b": np.zeros(2), "A_B": np.full(1, 7.0)})
    written = save_outputs(outputs, tmp_path)
    assert [p.name for p in written] == ["a_b~3.npy", "a_b.npy", "A_B~2.npy"]
    loaded = load_outputs(tmp_path)
    assert list(loaded) == ["a/b", "a_b", "A_B"]
    assert np.array_equal(loaded["a/b"], np.ones(3)) and np.array_equal(loaded["a_b"], np.zeros(2))
    assert np.array_equal(loaded["A_B"], [7.0])
    assert np.array_equal(np.load(tmp_path / "a_b~3.npy"), np.ones(3))


def test_a_dotted_key_and_a_nested_path_that_spell_one_name_stay_apart(tmp_path):
    x, y, z = np.full(2, 1.0), np.full(2, 2.0), np.full(3, 3.0)
    outputs = flatten_outputs({"c": [x, y], "c.0": z})
    assert [name for name, _ in outputs] == ["c.0~2", "c.1", "c.0"]
    save_outputs(outputs, tmp_path)
    loaded = load_outputs(tmp_path)
    assert sorted(loaded) == ["c.0", "c.0~2", "c.1"]
    assert np.array_equal(loaded["c.0"], z) and np.array_equal(loaded["c.0~2"], x)
    assert np.array_equal(loaded["c.1"], y)


def test_saving_where_a_file_stands_says_what_was_expected_and_found(tmp_path):
    (tmp_path / "afile").write_text("mine")
    with pytest.raises(KilnError) as caught:
        save_outputs([("out0", np.zeros(2, np.float32))], tmp_path / "afile")
    error = caught.value
    assert "--save-outputs" in str(error) and error.expected == "a directory"
    assert error.found == f"the file {tmp_path / 'afile'}"
    assert (tmp_path / "afile").read_text() == "mine"


def test_a_complex_output_is_described_by_numpy_dtype_and_magnitudes():
    z = np.array([3 + 4j, 0 - 1j], dtype=np.complex128)
    assert describe_output("z", z) == "  out z: complex128[2]  |z| min 1  max 5"
