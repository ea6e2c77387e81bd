"""tasks.dispatch: how an app's kernel call is matched to a built instance."""

import numpy as np

from kiln import Tensor, device
from kiln.tasks.apps.dispatch import _arguments, _bindings

# ruff: noqa: F821  (Tensor["N"] names a dim)


@device
def scale(x: Tensor["M", "N"], s: Tensor[()]):
    return x * s


def test_a_numpy_scalar_stays_a_0d_argument():
    x = np.ones((2, 3), np.float32)
    for s in (np.float32(2.0), np.array(2.0, np.float32), 2.0):
        arrays, dtypes = _arguments(scale, (x.T.T, s), {})
        assert arrays["s"].shape == () and dtypes == {"x": "f32", "s": "f32"}
    assert _bindings(scale, arrays) == (("M", 2), ("N", 3))


def test_non_contiguous_and_wide_inputs_are_converted_to_contiguous_kernel_dtypes():
    x = np.arange(12, dtype=np.float64).reshape(3, 4).T
    arrays, dtypes = _arguments(scale, (x, np.int64(3)), {})
    assert arrays["x"].flags.c_contiguous and arrays["x"].dtype == np.float32
    assert arrays["x"].tolist() == x.tolist() and dtypes["s"] == "i32"
