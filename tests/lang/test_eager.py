"""Eager calls compute the right numbers: small inputs, results worked out by hand."""

import math

import ml_dtypes
import numpy as np
import pytest

import kiln
from kiln import Tensor, device

# ruff: noqa: F821  (Tensor["N"] names a dim)


def f32(values) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def i32(values) -> np.ndarray:
    return np.array(values, dtype=np.int32)


@device
def arith(a: Tensor["N"], b: Tensor["N"]):
    return a + b, a - b, a * b, a / b, a**2, 2.0**a, -a, abs(a - 3.0), 10 - a, 12 / a


def test_arithmetic_and_reflected_scalars():
    out = arith(f32([1, 2, 4]), f32([4, 8, 2]))
    expected = [
        [5, 10, 6],
        [-3, -6, 2],
        [4, 16, 8],
        [0.25, 0.25, 2],
        [1, 4, 16],
        [2, 4, 16],
        [-1, -2, -4],
        [2, 1, 1],
        [9, 8, 6],
        [12, 6, 3],
    ]
    assert len(out) == len(expected)
    for got, want in zip(out, expected, strict=True):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want)


@device
def compare(a: Tensor["N"], b: Tensor["N"]):
    return a < b, a <= b, a > b, a >= b, a == b, a != b, a > 2


def test_comparisons_give_bool_tensors():
    out = compare(f32([1, 2, 3]), f32([3, 2, 1]))
    expected = [
        [True, False, False],
        [True, True, False],
        [False, False, True],
        [False, True, True],
        [False, True, False],
        [True, False, True],
        [False, False, True],
    ]
    for got, want in zip(out, expected, strict=True):
        assert got.dtype == np.bool_
        assert got.tolist() == want


@device
def unary(x: Tensor["N"]):
    return x.exp(), x.log(), x.sqrt(), x.rsqrt(), x.tanh(), x.sigmoid(), x.relu(), x.gelu()


def test_unary_math():
    exp, log, sqrt, rsqrt, tanh, sigmoid, relu, gelu = unary(f32([1.0, 4.0]))
    np.testing.assert_allclose(exp, [math.e, math.e**4], rtol=1e-6)
    np.testing.assert_allclose(log, [0.0, math.log(4.0)], rtol=1e-6)
    np.testing.assert_allclose(sqrt, [1.0, 2.0])
    np.testing.assert_allclose(rsqrt, [1.0, 0.5])
    np.testing.assert_allclose(tanh, [0.7615942, 0.9993293], rtol=1e-6)
    np.testing.assert_allclose(sigmoid, [0.7310586, 0.9820138], rtol=1e-6)
    np.testing.assert_allclose(relu, [1.0, 4.0])
    np.testing.assert_allclose(gelu, [0.8411920, 3.9999297], rtol=1e-5)


@device
def relu_neg(x: Tensor["N"]):
    return kiln.relu(x), kiln.maximum(x, 0.5), kiln.minimum(x, 0.5)


def test_relu_maximum_minimum():
    relu, mx, mn = relu_neg(f32([-2, 0, 3]))
    assert relu.tolist() == [0, 0, 3]
    assert mx.tolist() == [0.5, 0.5, 3]
    assert mn.tolist() == [-2, 0, 0.5]


@device
def reductions(x: Tensor["R", "C"]):
    return (
        x.sum(),
        x.sum(axis=0),
        x.sum(axis=-1, keepdims=True),
        x.max(axis=1),
        x.min(axis=(0, 1)),
        x.mean(axis=-1),
        kiln.mean(x),
    )


def test_reductions_with_axes_and_keepdims():
    x = f32([[1, 2, 3], [4, 5, 6]])
    total, cols, rows, rmax, smallest, rmean, mean = reductions(x)
    assert total.shape == () and total == 21
    assert cols.tolist() == [5, 7, 9]
    assert rows.tolist() == [[6], [15]]
    assert rmax.tolist() == [3, 6]
    assert smallest.shape == () and smallest == 1
    assert rmean.tolist() == [2, 5]
    assert mean == 3.5


@device
def mm(a: Tensor["M", "K"], b: Tensor["K", "N"]):
    return a @ b


def test_matmul_2d():
    out = mm(f32([[1, 2], [3, 4]]), f32([[5, 6], [7, 8]]))
    assert out.tolist() == [[19, 22], [43, 50]]


@device
def bmm_broadcast(a: Tensor["B", "M", "K"], b: Tensor["K", "N"]):
    return a @ b, kiln.matmul(b.T, a.transpose(0, 2, 1))


def test_batched_matmul_broadcasts_batch_dims():
    a = f32([[[1, 0], [0, 1]], [[2, 0], [0, 2]]])  # identity, 2 * identity
    b = f32([[1, 2], [3, 4]])
    out, swapped = bmm_broadcast(a, b)
    assert out.tolist() == [[[1, 2], [3, 4]], [[2, 4], [6, 8]]]
    assert swapped.tolist() == [[[1, 3], [2, 4]], [[2, 6], [4, 8]]]


@device
def vec_mm(m: Tensor["M", "K"], v: Tensor["K"]):
    return m @ v, v @ m.T, v @ v


def test_matmul_with_vectors_follows_numpy():
    mv, vm, dot = vec_mm(f32([[1, 2], [3, 4]]), f32([1, 1]))
    assert mv.tolist() == [3, 7]
    assert vm.tolist() == [3, 7]
    assert dot.shape == () and dot == 2


@device
def layout(x: Tensor["A", "B", "C"]):
    return x.T, x.transpose(1, 0, 2), kiln.permute(x, 2, 0, 1), x.reshape(3, -1)


def test_transpose_permute_reshape():
    x = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    t, t102, p201, r = layout(x)
    assert t.shape == (3, 2, 1) and t[:, :, 0].tolist() == [[0, 3], [1, 4], [2, 5]]
    assert t102.shape == (2, 1, 3) and t102.tolist() == [[[0, 1, 2]], [[3, 4, 5]]]
    assert p201.shape == (3, 1, 2) and p201.tolist() == [[[0, 3]], [[1, 4]], [[2, 5]]]
    assert r.tolist() == [[0, 1], [2, 3], [4, 5]]


@device
def selects(x: Tensor["N"], lo: Tensor[()]):
    return kiln.where(x > lo, x, 0.0), kiln.broadcast_to(lo, (2, 3)), kiln.where(~(x > lo), 1, 2)


def test_where_broadcast_to_and_not():
    chosen, wide, flipped = selects(f32([1, 5, 3]), 2.0)
    assert chosen.tolist() == [0, 5, 3]
    assert wide.tolist() == [[2, 2, 2], [2, 2, 2]]
    assert flipped.tolist() == [1, 2, 2] and flipped.dtype == np.int32


@device
def casts(x: Tensor["N"]):
    return x.astype("i32"), kiln.cast(x, ml_dtypes.bfloat16), x.astype(np.float16), x.astype("bool")


def test_casts():
    as_int, as_bf16, as_f16, as_bool = casts(f32([1.75, -2.5, 0]))
    assert as_int.dtype == np.int32 and as_int.tolist() == [1, -2, 0]
    assert as_bf16.dtype == ml_dtypes.bfloat16 and as_bf16.astype(np.float32).tolist() == [
        1.75,
        -2.5,
        0,
    ]
    assert as_f16.dtype == np.float16
    assert as_bool.tolist() == [True, True, False]


@device
def conv(x: Tensor["N", "H", "W", "C"], w: Tensor["KH", "KW", "C", "F"]):
    return kiln.conv2d(x, w), kiln.conv2d(x, w, stride=2, padding=1)


def test_conv2d_nhwc_hwio():
    x = np.arange(9, dtype=np.float32).reshape(1, 3, 3, 1)  # 0..8 in a 3x3 image
    w = np.ones((2, 2, 1, 1), np.float32)  # 2x2 box sum
    plain, strided = conv(x, w)
    assert plain[0, :, :, 0].tolist() == [[8, 12], [20, 24]]
    # padded to 5x5, windows at rows/cols 0 and 2: corners of the image
    assert strided[0, :, :, 0].tolist() == [[0, 3], [9, 24]]


@device
def integer_math(a: Tensor["N"], b: Tensor["N"]):
    return a + b, a / b, a.mean(), a * 2, a * 0.5


def test_integer_kernels_follow_promotion_rules():
    s, q, m, twice, half = integer_math(i32([1, 2, 3]), i32([2, 2, 2]))
    assert s.dtype == np.int32 and s.tolist() == [3, 4, 5]
    assert q.dtype == np.float32 and q.tolist() == [0.5, 1, 1.5]
    assert m.dtype == np.float32 and m == 2
    assert twice.dtype == np.int32 and twice.tolist() == [2, 4, 6]
    assert half.dtype == np.float32 and half.tolist() == [0.5, 1, 1.5]


@device
def half_precision(a: Tensor["N"]):
    return a * 3.0, a + 1


def test_weak_scalars_keep_half_precision():
    a = np.array([1, 2], dtype=np.float16)
    x, y = half_precision(a)
    assert x.dtype == np.float16 and y.dtype == np.float16
    assert x.tolist() == [3, 6]


def test_numpy_defaults_and_python_scalars_are_accepted():
    out = arith(np.array([1.0, 2.0, 4.0]), np.array([4.0, 8.0, 2.0]))  # float64 -> f32
    assert out[0].dtype == np.float32 and out[0].tolist() == [5, 10, 6]
    assert selects(f32([3, 1]), 2)[0].tolist() == [3, 0]  # an int argument: i32 0-d tensor


def test_numpy_ufuncs_and_functions_map_to_kiln_ops():
    @device
    def via_numpy(x: Tensor["R", "C"]):
        return np.exp(x) + np.maximum(x, 1.0), np.sum(x, axis=-1), np.transpose(x)

    x = f32([[0, 2]])
    e, s, t = via_numpy(x)
    np.testing.assert_allclose(e, [[2.0, math.exp(2) + 2]], rtol=1e-6)
    assert s.tolist() == [2]
    assert t.tolist() == [[0], [2]]


def test_returned_tuple_and_single_output_shapes():
    assert isinstance(mm(f32([[1]]), f32([[2]])), np.ndarray)
    assert isinstance(relu_neg(f32([1])), tuple)


@device
def composed(a: Tensor["N"], b: Tensor["N"]):
    return arith(a, b)[0] * 2.0  # one kernel calling another: inlined


def test_kernels_compose():
    assert composed(f32([1, 2]), f32([3, 4])).tolist() == [8, 12]


def test_device_function_metadata():
    assert arith.__name__ == "arith"
    assert arith.__module__ == __name__
    assert arith.__wrapped__ is arith.fn
    assert mm.params == (("a", ("M", "K")), ("b", ("K", "N")))
    assert selects.params[1] == ("lo", ())
    assert repr(Tensor["M", 4]) == "Tensor['M', 4]"


def test_bad_dims_in_annotation_are_rejected():
    with pytest.raises(TypeError, match="dims must be names"):
        Tensor["M", 1.5]
    with pytest.raises(TypeError):
        Tensor[0]


def test_tensor_cannot_be_constructed_directly():
    with pytest.raises(TypeError):
        Tensor()


@device
def inc(i: Tensor["N"]):
    return i + 1


@device
def inc_scalar(i: Tensor[()]):
    return i + 1


def test_int64_arguments_outside_i32_are_refused_not_wrapped():
    from kiln.errors import TraceError

    edges = np.array([-(2**31), 2**31 - 2], np.int64)
    assert inc(edges).tolist() == [-(2**31) + 1, 2**31 - 1]
    with pytest.raises(TraceError) as info:
        inc(np.array([3, 2**32 + 5, -(2**40)], np.int64))
    text = info.value.render()
    assert "error: argument 'i' of kernel 'inc': 4294967301 at index (1,) does not fit in i32" in (
        text
    )
    assert "expected: ints from -2147483648 to 2147483647 (int64 arrays become i32)" in text
    with pytest.raises(TraceError, match=r"'inc_scalar': 1099511627776 does not fit in i32"):
        inc_scalar(2**40)  # a Python int
    with pytest.raises(TraceError, match=r"'inc_scalar': -2147483649 does not fit in i32"):
        inc_scalar(np.int64(-(2**31) - 1))


def test_float64_arguments_keep_nan_and_inf():
    out = inc(np.array([np.inf, np.nan, -np.inf]))  # float64 becomes f32, as documented
    assert out.dtype == np.float32 and out[0] == np.inf and np.isnan(out[1]) and out[2] == -np.inf


def test_empty_array_arguments_are_refused():
    from kiln.errors import TraceError

    with pytest.raises(TraceError) as info:
        arith(f32([]), f32([]))
    assert (
        "error: argument 'a' of kernel 'arith' is empty (shape (0,)): a kernel's tensors are "
        "never empty" in info.value.render()
    )


def test_clip_takes_numpy_2_min_and_max_keywords():
    from kiln.errors import TraceError

    @device
    def clipped(x: Tensor["N"]):
        return (
            x.clip(max=1.0),
            x.clip(min=0.0),
            x.clip(0.0, 1.0),
            kiln.clip(x, min=-1, max=0.5),
            np.clip(x, max=0.0),
            x.clip(a_min=0.5),
        )

    x = f32([-2, 0.25, 3])
    out = [o.tolist() for o in clipped(x)]
    assert out == [
        [-2, 0.25, 1],
        [0, 0.25, 3],
        [0, 0.25, 1],
        [-1, 0.25, 0.5],
        [-2, 0, 0],
        [0.5, 0.5, 3],
    ]

    @device
    def both(x: Tensor["N"]):
        return kiln.clip(x, 0.0, min=1.0)

    with pytest.raises(TraceError, match="clip: give a_min or min, not both"):
        both(x)


def test_python_round_is_kiln_round():
    @device
    def rounded(x: Tensor["N"], i: Tensor["N"]):
        return round(x), round(x, 0), round(i)

    x = f32([0.5, 1.5, -2.5, 2.7])
    r, r0, ri = rounded(x, i32([1, 2, 3, 4]))
    assert r.tolist() == [0, 2, -2, 3] and r0.tolist() == r.tolist() and r.dtype == np.float32
    assert ri.dtype == np.int32 and ri.tolist() == [1, 2, 3, 4]


def test_full_takes_its_dtype_from_the_fill_value_as_numpy_does():
    @device
    def fills(x: Tensor["N"]):
        return (
            kiln.full((2,), 2),
            kiln.full((2,), True),
            kiln.full((2,), 2.5),
            kiln.full((2,), 2, dtype="f16"),
            kiln.full_like(x, 7),
        )

    out = fills(f32([1, 2, 3]))
    assert [o.dtype for o in out] == [np.int32, np.bool_, np.float32, np.float16, np.float32]
    assert [o.tolist() for o in out[:3]] == [[2, 2], [True, True], [2.5, 2.5]]


def test_concatenate_axis_none_flattens_first():
    @device
    def flat_cat(a: Tensor["R", "C"], b: Tensor["N"], s: Tensor[()]):
        return kiln.concatenate([a, b, s], axis=None)

    a, b, s = f32([[1, 2], [3, 4]]), i32([5, 6]), f32(7)
    out = flat_cat(a, b, s)
    np.testing.assert_array_equal(out, np.concatenate([a, b, s], axis=None))
    assert out.dtype == np.float32


def test_arange_still_takes_a_dtype_by_position():
    @device
    def ramp(x: Tensor["N"]):
        return kiln.arange(x.shape[0], "f32"), kiln.arange(3, dtype="f16")

    r, h = ramp(f32([9, 9, 9, 9]))
    assert r.dtype == np.float32 and r.tolist() == [0, 1, 2, 3]
    assert h.dtype == np.float16 and h.tolist() == [0, 1, 2]
