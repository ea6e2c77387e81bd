"""where with fewer than 3 arguments and a zero slice step: Kiln's own words at the user's line."""

import numpy as np
import pytest

import kiln
from kiln import Tensor, device, trace
from kiln.errors import TraceError


@device
def where_one(a: Tensor["N"]):  # noqa: F821
    return kiln.where(a > 0)


@device
def where_two(a: Tensor["N"]):  # noqa: F821
    return kiln.where(a > 0, a)


@device
def numpy_where_one(a: Tensor["N"]):  # noqa: F821
    return np.where(a > 0)


@device
def zero_step(a: Tensor["N", "M"]):  # noqa: F821
    return a[1:, ::0]


def _line(fn) -> int:
    return fn.fn.__code__.co_firstlineno + 2


@pytest.mark.parametrize("kernel", [where_one, numpy_where_one])
def test_one_argument_where_says_it_needs_three_not_a_type_error(kernel):
    with pytest.raises(TraceError) as info:
        trace(kernel, {"N": 4}, "f32")
    error = info.value
    assert error.message.startswith("where: needs 3 arguments, where(condition, a, b), got 1;")
    assert "nonzero" in error.message and "raised by" not in error.render()
    assert (error.expected, error.found) == ("where(condition, a, b)", "where(condition)")
    assert (error.location.file, error.location.line) == (__file__, _line(kernel))
    with pytest.raises(TraceError, match="where: needs 3 arguments"):  # eagerly too
        kernel(np.ones(4, np.float32))


def test_two_argument_where_names_what_it_was_given():
    with pytest.raises(TraceError) as info:
        trace(where_two, {"N": 4}, "f32")
    assert info.value.message == "where: needs 3 arguments, where(condition, a, b), got 2"
    assert info.value.found == "where(condition, a)"


def test_a_zero_slice_step_names_the_slice_and_axis_not_a_value_error():
    with pytest.raises(TraceError) as info:
        trace(zero_step, {"N": 4, "M": 3}, "f32")
    error = info.value
    assert error.message == "slice ::0 of axis 1: slice step cannot be zero"
    assert error.found == "::0: step 0" and "raised by" not in error.render()
    assert (error.location.file, error.location.line) == (__file__, _line(zero_step))
    with pytest.raises(TraceError, match="slice step cannot be zero"):
        zero_step(np.ones((4, 3), np.float32))
