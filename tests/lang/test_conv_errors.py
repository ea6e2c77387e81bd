"""conv, conv_dgrad and conv_wgrad name themselves and the shapes as the user gave them."""

import numpy as np
import pytest

import kiln
from kiln import Tensor, device
from kiln.errors import TraceError

DY = np.ones((1, 4, 4, 2), np.float32)
W = np.ones((2, 3, 3, 2), np.float32)  # NHWC filter: K, taps..., C/groups
X = np.ones((1, 6, 6, 2), np.float32)


def _raised(body, a, b) -> TraceError:
    @device
    def kernel(a: Tensor["A", "B", "C", "D"], b: Tensor["E", "F", "G", "H"]):  # noqa: F821
        return body(a, b)

    with pytest.raises(TraceError) as info:
        kernel(a, b)
    assert info.value.location.file == __file__
    return info.value


def test_conv_dgrad_with_a_wrong_rank_x_shape_names_it_and_the_shapes_given():
    error = _raised(lambda dy, w: kiln.conv_dgrad(dy, w, (1, 2, 3)), DY, W)
    assert error.message == (
        "conv_dgrad: x_shape has rank 3, not 4 like dy; "
        "got dy (1, 4, 4, 2), w (2, 3, 3, 2), x_shape (1, 2, 3)"
    )
    assert (error.expected, error.found) == ("x_shape of rank 4, as dy", "x_shape (1, 2, 3)")
    assert "x_shape is the shape of conv's input x" in error.hint
    # channels first: a short x_shape was an IndexError inside kiln
    error = _raised(lambda dy, w: kiln.conv_dgrad(dy, w, (3,), layout="NCHW"), DY, W)
    assert error.found == "x_shape (3,)"


def test_conv_dgrad_with_a_wrong_rank_filter_blames_w_not_x_shape():
    error = _raised(lambda dy, w: kiln.conv_dgrad(dy, w[0], (1, 6, 6, 2)), DY, W)
    assert error.message.startswith("conv_dgrad: w has rank 3, not 4 like dy")
    assert error.found == "w (3, 3, 2)" and error.hint is None


def test_conv_dgrad_shape_and_option_errors_say_conv_dgrad_in_the_users_layout():
    error = _raised(lambda dy, w: kiln.conv_dgrad(dy, w, (1, 7, 7, 2)), DY, W)
    assert error.message == (
        "conv_dgrad: dy has shape (1, 4, 4, 2), but the convolution's output is (1, 5, 5, 2)"
    )
    nchw, oihw = np.ones((1, 2, 4, 4), np.float32), np.ones((2, 2, 3, 3), np.float32)
    error = _raised(lambda dy, w: kiln.conv_dgrad(dy, w, (1, 2, 7, 7), layout="NCHW"), nchw, oihw)
    assert error.expected == "dy of shape (1, 2, 5, 5)" and error.found == "dy (1, 2, 4, 4)"
    error = _raised(lambda dy, w: kiln.conv_dgrad(dy, w, (1, 6, 6, 2), stride=0), DY, W)
    assert error.message == "conv_dgrad: stride must be an int >= 1 or 2 of them, got 0"


def test_conv_wgrad_with_a_wrong_rank_w_shape_names_it_and_the_shapes_given():
    error = _raised(lambda x, dy: kiln.conv_wgrad(x, dy, (2, 3, 3)), X, DY)
    assert error.message == (
        "conv_wgrad: w_shape has rank 3, not 4 like x; "
        "got x (1, 6, 6, 2), dy (1, 4, 4, 2), w_shape (2, 3, 3)"
    )
    assert "w_shape is the shape of conv's filter w" in error.hint
    error = _raised(lambda x, dy: kiln.conv_wgrad(x, dy[0], (2, 3, 3, 2)), X, DY)
    assert error.found == "dy (4, 4, 2)"
    error = _raised(lambda x, dy: kiln.conv_wgrad(x, dy, (2, 3, 3, 2), groups=0), X, DY)
    assert error.message == "conv_wgrad: groups must be a positive int, got 0"


def test_conv_with_operands_of_different_or_unsupported_rank():
    error = _raised(lambda x, w: kiln.conv(x, w[0]), X, W)
    assert (error.expected, error.found) == ("w of rank 4, as x", "w (3, 3, 2)")
    error = _raised(lambda x, w: kiln.conv(x[0, 0], w[0, 0]), X, W)
    assert error.message.startswith("conv: x has rank 2; a convolution's operands have rank 3")


def test_correct_gradients_still_have_the_shapes_asked_for():
    dgrad = _ok(lambda dy, w: kiln.conv_dgrad(dy, w, (1, 6, 6, 2)), DY, W)
    assert dgrad.shape == (1, 6, 6, 2) and float(dgrad[0, 2, 2, 0]) == 18.0
    assert _ok(lambda x, dy: kiln.conv_wgrad(x, dy, (2, 3, 3, 2)), X, DY).shape == (2, 3, 3, 2)


def _ok(body, a, b):
    @device
    def kernel(a: Tensor["A", "B", "C", "D"], b: Tensor["E", "F", "G", "H"]):  # noqa: F821
        return body(a, b)

    return kernel(a, b)
