"""kiln.moveaxis takes ints or sequences of axes, with NumPy's rules and refusals."""

import itertools

import numpy as np
import pytest

import kiln
from kiln import Tensor, device, trace
from kiln.errors import TraceError

A = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)


def _moved(source, destination):
    @device
    def kernel(a: Tensor["A", "B", "C", "D"]):  # noqa: F821
        return kiln.moveaxis(a, source, destination)

    return kernel


@pytest.mark.parametrize(
    "source, destination",
    [
        ((0, 1), (2, 0)),
        ([0, 1], [1, 0]),
        ((-1, 0), (0, -1)),
        ((3,), (0,)),
        ((), ()),
        (2, -1),
        ((0, 1, 2), (2, 1, 0)),
        ((1, 3), (3, 1)),
        (np.int64(1), np.int32(3)),
    ],
)
def test_moveaxis_agrees_with_numpy(source, destination):
    got = _moved(source, destination)(A)
    want = np.moveaxis(A, source, destination)
    assert got.shape == want.shape and np.array_equal(got, want)


def test_every_pair_of_axes_moved_to_every_pair_agrees_with_numpy():
    for src in itertools.permutations(range(4), 2):
        for dst in itertools.permutations(range(4), 2):
            assert np.array_equal(_moved(src, dst)(A), np.moveaxis(A, src, dst)), (src, dst)


@pytest.mark.parametrize(
    "source, destination, words, found",
    [
        ((0, 0), (1, 2), "repeated axis in source (0, 0)", "axis 0 names axis 0 again"),
        ((0, 1), (2, -2), "repeated axis in destination (2, -2)", "axis -2 names axis 2 again"),
        ((0, 1), (2,), "source and destination must have the same number of axes", None),
        ((0,), (5,), "moveaxis destination: axis 5 is out of range for rank 4", "5"),
        ((0, "a"), (1, 2), "moveaxis source: axis must be an int, got 'a'", None),
    ],
)
def test_moveaxis_refuses_what_numpy_refuses_at_the_kernels_line(source, destination, words, found):
    with pytest.raises(TraceError) as info:
        trace(_moved(source, destination), {"A": 2, "B": 3, "C": 4, "D": 5}, "f32")
    assert words in info.value.message
    assert found is None or info.value.found == found
    assert info.value.location.file == __file__
