"""Broken kernels: every trace error names the kernel's own file, line and source text."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from kiln import trace
from kiln.errors import TraceError

BROKEN = """\
import sys

import numpy as np

import kiln
from kiln import Tensor, device


def scale_of(x):
    return 1.0 / 0  # <- user_helper


@device
def shape_mismatch(a: Tensor["N"], b: Tensor["M"]):
    return a + b  # <- shape_mismatch


@device
def matmul_mismatch(a: Tensor["M", "K"], b: Tensor["J", "N"]):
    return a @ b  # <- matmul_mismatch


@device
def python_if(x: Tensor["N"]):
    if x.sum() > 0:  # <- python_if
        return x
    return -x


@device
def python_bool(x: Tensor["N"]):
    big = bool(x.max() > 10.0)  # <- python_bool
    return x * big


@device
def numpy_ufunc(x: Tensor["N"]):
    return np.sin(x)  # <- numpy_ufunc


@device
def numpy_function(x: Tensor["N"]):
    return np.cumsum(x)  # <- numpy_function


@device
def unknown_method(x: Tensor["N"]):
    y = x * 2.0
    return y.cumsum()  # <- unknown_method


@device
def unbound_dim(
    x: Tensor["R", "C"],
    bias: Tensor["Q"],  # <- unbound_dim
):
    return x + bias


@device
def pair(a: Tensor["N"], b: Tensor["N"]):
    return a + b


@device
def wrong_arg_count(x: Tensor["N"]):
    return pair(x)  # <- wrong_arg_count


@device
def returns_number(x: Tensor["N"]):
    y = x + 1.0
    return 3  # <- returns_number


@device
def returns_nothing(x: Tensor["N"]):  # <- returns_nothing
    x + 1.0


@device
def user_exception(x: Tensor["N"]):
    factor = len(x) // 0  # <- user_exception
    return x * factor


@device
def user_helper(x: Tensor["N"]):
    return x * scale_of(x)


@device
def bad_reshape(x: Tensor["R", "C"]):
    return x.reshape(5, -1)  # <- bad_reshape


@device
def bad_axis(x: Tensor["R", "C"]):
    return x.sum(axis=2)  # <- bad_axis


@device
def bad_dtype(x: Tensor["N"]):
    return x.astype("f64")  # <- bad_dtype


TABLE = np.arange(4.0)


@device
def captured_array(x: Tensor["N"]):
    return x + TABLE  # <- captured_array


@device
def no_annotation(x: Tensor["N"], y):  # <- no_annotation
    return x + y


@device
def exits(x: Tensor["N"]):
    y = x + 1.0
    sys.exit(0)  # <- exits
    return y


@device
def exits_with_text(x: Tensor["N"]):
    raise SystemExit("bye")  # <- exits_with_text


@device
def exits_when_eager(x: Tensor["N"]):
    if not x.is_traced:
        sys.exit(3)  # <- exits_when_eager
    return x + 1.0


@device
def keyword_only(x: Tensor["N"], *, y: Tensor["N"]):  # <- keyword_only
    return x + y


@device
def empty_slice(x: Tensor["N"]):
    return x[100:200]  # <- empty_slice


@device
def call_mismatch(a: Tensor["N"], b: Tensor["M"]):
    return pair(a, b) * 2  # <- call_mismatch


@device
def empty_full(x: Tensor["N"]):
    return x.sum() + kiln.full((0, 4), 1.0).sum(axis=0)  # <- empty_full


@device
def negative_broadcast(x: Tensor["N"]):
    return kiln.broadcast_to(x, (-1, 4))  # <- negative_broadcast


@device
def huge_tensor(x: Tensor["N"]):
    return x + kiln.full((2**20, 2**20), 1.0).sum()  # <- huge_tensor


@device
def argmax_two_axes(x: Tensor["R", "C"]):
    return kiln.argmax(x, axis=(0, 1))  # <- argmax_two_axes


@device
def floor_divide(a: Tensor["N"], b: Tensor["N"]):
    return a // b  # <- floor_divide


@device
def remainder(a: Tensor["N"]):
    return 7.0 % a  # <- remainder


@device
def generator(x: Tensor["N"]):  # <- generator
    yield x + 1.0


@device
def returns_object(x: Tensor["N"]):
    return object()  # <- returns_object


@device
def arange_range(x: Tensor["N"]):
    return x + kiln.arange(2, 6)  # <- arange_range


@device
def varargs(*xs: Tensor["N"]):  # <- varargs
    return xs[0] + xs[1]


@device
def nested_outputs(x: Tensor["N"]):
    return (x + 1, (x + 2, x + 3))  # <- nested_outputs


@device
def inline_number(x: Tensor["N"]):
    return pair(x, 2.0)  # <- inline_number


@device
def round_decimals(x: Tensor["N"]):
    return round(x, 2)  # <- round_decimals
"""

SIZES = {"N": 4, "M": 5, "K": 3, "J": 2, "R": 4, "C": 6}


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> tuple[object, Path]:
    path = tmp_path_factory.mktemp("kernels") / "broken_kernels.py"
    path.write_text(BROKEN)
    spec = importlib.util.spec_from_file_location("broken_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, path


def marked_line(tag: str) -> tuple[int, str]:
    for number, text in enumerate(BROKEN.splitlines(), start=1):
        if text.endswith(f"# <- {tag}"):
            return number, text.strip()
    raise AssertionError(f"no marker {tag}")


CASES = [
    ("shape_mismatch", "shape_mismatch", ["shape mismatch", "(4,)", "(5,)"]),
    ("matmul_mismatch", "matmul_mismatch", ["inner dimensions differ", "(5, 3)", "(2, 4)"]),
    ("python_if", "python_if", ["data-dependent control flow is not supported: use kiln.where"]),
    ("python_bool", "python_bool", ["data-dependent control flow is not supported"]),
    ("numpy_ufunc", "numpy_ufunc", ["np.sin is not supported on kiln tensors"]),
    ("numpy_function", "numpy_function", ["np.cumsum is not supported on kiln tensors"]),
    ("unknown_method", "unknown_method", ["no attribute 'cumsum'"]),
    ("unbound_dim", "unbound_dim", ["dim 'Q'", "argument 'bias'", "not bound"]),
    ("wrong_arg_count", "wrong_arg_count", ["kernel 'pair' takes (a, b)", "missing"]),
    ("returns_number", "returns_number", ["returned an int, not a Tensor"]),
    ("returns_nothing", "returns_nothing", ["returned nothing"]),
    ("user_exception", "user_exception", ["ZeroDivisionError"]),
    ("user_helper", "user_helper", ["ZeroDivisionError", "division by zero"]),
    ("bad_reshape", "bad_reshape", ["cannot reshape", "(4, 6)", "(5, -1)"]),
    ("bad_axis", "bad_axis", ["axis 2 is out of range", "rank 2"]),
    ("bad_dtype", "bad_dtype", ["unsupported dtype 'f64'"]),
    ("captured_array", "captured_array", ["numpy array of shape (4,)", "argument"]),
    ("no_annotation", "no_annotation", ["argument 'y'", "needs dims"]),
    ("exits", "exits", ["kernel 'exits' called sys.exit(0) while tracing", "must not exit"]),
    ("exits_with_text", "exits_with_text", ["called sys.exit('bye') while tracing"]),
    (
        "keyword_only",
        "keyword_only",
        ["argument 'y' of kernel 'keyword_only' is keyword-only", "must be positional"],
    ),
    (
        "empty_slice",
        "empty_slice",
        ["slice 100:200 of axis 0 (size 4) is empty: kernels cannot produce empty tensors"],
    ),
    (
        "call_mismatch",
        "call_mismatch",
        ["dim 'N' is 4 in argument 'a' but 5 in argument 'b'", "'pair' declares its arguments"],
    ),
    ("empty_full", "empty_full", ["full: shape (0, 4)", "cannot make empty tensors"]),
    ("negative_broadcast", "negative_broadcast", ["broadcast_to: shape (-1, 4)", "dims >= 1"]),
    ("huge_tensor", "huge_tensor", ["(1048576, 1048576)", "at most 4 GiB per tensor"]),
    ("argmax_two_axes", "argmax_two_axes", ["argmax: axis must be an int or None, got (0, 1)"]),
    ("floor_divide", "floor_divide", ["`//` (floor_divide) is not a kiln op", "kiln.floor"]),
    ("remainder", "remainder", ["`%` (remainder) is not a kiln op"]),
    ("generator", "generator", ["kernel 'generator' is a generator", "found: a generator"]),
    ("returns_object", "returns_object", ["returned an object", "found: an object"]),
    (
        "arange_range",
        "arange_range",
        [
            "error: arange takes one argument n (np.arange(n)), got arange(2, 6)",
            "hint: write kiln.arange(4) + 2",
        ],
    ),
    (
        "varargs",
        "varargs",
        [
            "error: argument 'xs' of kernel 'varargs' is *args/**kwargs: kernels take named "
            "tensors",
            "expected: one named argument per tensor: def varargs(x: Tensor[...], y: Tensor[...])",
            "found: *xs",
        ],
    ),
    (
        "nested_outputs",
        "nested_outputs",
        [
            "error: output 1 of kernel 'nested_outputs' is a tuple, not a Tensor",
            "expected: a Tensor or a flat tuple of Tensors",
            "hint: return a flat tuple of Tensors: return a, b, c",
        ],
    ),
    (
        "inline_number",
        "inline_number",
        ["error: argument 'b' of kernel 'pair' should have rank 1 (Tensor['N']), got shape ()"],
    ),
    (
        "round_decimals",
        "round_decimals",
        [
            "error: round: only rounding to whole numbers is a kiln op, got decimals=2",
            "hint: scale first: kiln.round(x * 100) / 100",
        ],
    ),
]


@pytest.mark.parametrize("kernel, tag, fragments", CASES, ids=[c[0] for c in CASES])
def test_trace_error_points_at_kernel_line(broken, kernel, tag, fragments):
    module, path = broken
    with pytest.raises(TraceError) as info:
        trace(getattr(module, kernel), SIZES, "f32")
    err = info.value
    text = err.render()
    for fragment in fragments:
        assert fragment in text, text
    line, source = marked_line(tag)
    assert err.location is not None
    assert Path(err.location.file) == path
    assert err.location.line == line, text
    assert err.location.source.strip() == source
    assert f"{path}:{line}" in text  # the rendered header names the kernel's file:line


def test_an_unknown_method_lists_the_ops_a_kernel_may_use(broken):
    module, _ = broken
    with pytest.raises(TraceError) as info:
        trace(module.unknown_method, SIZES, "f32")
    methods, attributes = info.value.notes[0], info.value.notes[1]
    assert methods.startswith("supported methods: abs, ") and " sum," in methods
    assert attributes == "attributes: T, dtype, mT, ndim, shape, size"
    # eager-mode helpers and the tensor's internal slot are no kernel ops
    for helper in ("numpy", "is_traced", "type"):
        assert f" {helper}," not in methods + "," and f" {helper}," not in attributes + ","


def test_errors_never_point_into_kiln(broken):
    module, _ = broken
    for kernel, _, _ in CASES:
        with pytest.raises(TraceError) as info:
            trace(getattr(module, kernel), SIZES, "f32")
        assert "/kiln/" not in info.value.location.file


def test_messages_carry_no_memory_address_and_no_reshape(broken):
    module, _ = broken
    for kernel in ("generator", "returns_object", "empty_slice", "argmax_two_axes"):
        with pytest.raises(TraceError) as info:
            trace(getattr(module, kernel), SIZES, "f32")
        text = info.value.render()
        assert " at 0x" not in text and "reshape" not in text and "raised by" not in text, text


def test_eager_empty_slice_and_floor_divide_say_the_same(broken):
    module, _ = broken
    x = np.ones(4, np.float32)
    with pytest.raises(TraceError, match="slice 100:200 of axis 0 .* is empty"):
        module.empty_slice(x)
    with pytest.raises(TraceError, match="is not a kiln op"):
        module.floor_divide(x, x)


def test_user_exception_is_chained_for_debugging(broken):
    module, _ = broken
    with pytest.raises(TraceError) as info:
        trace(module.user_exception, SIZES, "f32")
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_eager_call_reports_the_same_line(broken):
    module, path = broken
    with pytest.raises(TraceError) as info:
        module.shape_mismatch(np.zeros(4, np.float32), np.zeros(5, np.float32))
    assert Path(info.value.location.file) == path
    assert info.value.location.line == marked_line("shape_mismatch")[0]


def test_eager_user_exception_propagates_unchanged(broken):
    module, _ = broken
    with pytest.raises(ZeroDivisionError):
        module.user_exception(np.zeros(4, np.float32))


def test_eager_sys_exit_is_a_trace_error_not_an_exit(broken):
    """The cpu oracle runs kernels eagerly: an exit there must not end `kiln test`."""
    module, path = broken
    with pytest.raises(TraceError) as info:
        module.exits_when_eager(np.zeros(4, np.float32))
    text = info.value.render()
    assert "kernel 'exits_when_eager' called sys.exit(3) while running on the host" in text
    assert Path(info.value.location.file) == path
    assert info.value.location.line == marked_line("exits_when_eager")[0]


def test_keyword_only_argument_is_refused_eagerly_too(broken):
    module, _ = broken
    x = np.zeros(4, np.float32)
    with pytest.raises(TraceError, match="kernel arguments must be positional"):
        module.keyword_only(x, y=x)


def test_eager_wrong_argument_count_names_the_signature(broken):
    module, path = broken
    with pytest.raises(TraceError, match=r"takes \(a, b\)") as info:
        module.pair(np.zeros(4, np.float32))
    assert Path(info.value.location.file) == path


def test_eager_conflicting_dim_sizes(broken):
    module, _ = broken
    with pytest.raises(TraceError, match="dim 'N' is 4 in argument 'a' but 3 in argument 'b'"):
        module.pair(np.zeros(4, np.float32), np.zeros(3, np.float32))


def test_unknown_attribute_still_behaves_for_hasattr(broken):
    module, _ = broken
    seen = []

    @module.device
    def probe(x: module.Tensor["N"]):  # noqa: F821
        seen.append(hasattr(x, "cumsum"))
        return x

    trace(probe, {"N": 2}, "f32")
    assert seen == [False]


def test_hint_suggests_close_method_name(broken):
    module, _ = broken

    @module.device
    def typo(x: module.Tensor["N"]):  # noqa: F821
        return x.sqr()

    with pytest.raises(TraceError) as info:
        trace(typo, {"N": 2}, "f32")
    assert "sqrt" in info.value.hint


def test_trace_config_errors(broken):
    module, _ = broken
    with pytest.raises(TraceError, match="unsupported dtype 'f64'"):
        trace(module.pair, {"N": 4}, "f64")
    with pytest.raises(TraceError, match="not an argument"):
        trace(module.pair, {"N": 4}, {"a": "f32", "c": "f32", "*": "f32"})
    with pytest.raises(TraceError, match="no dtype for argument 'b'"):
        trace(module.pair, {"N": 4}, {"a": "f32"})
    with pytest.raises(TraceError, match="positive integer"):
        trace(module.pair, {"N": 0}, "f32")
    with pytest.raises(TraceError, match="not a @device function"):
        trace(module.scale_of, {"N": 4}, "f32")


def test_non_finite_constants_trace_and_survive_graph_json():
    """-inf masks are ordinary constants; graph JSON spells them "inf"/"-inf"/"nan"."""
    import kiln
    from kiln import Tensor, device
    from kiln.ir.graph import Graph

    @device
    def masked(x: Tensor[4]):
        return kiln.where(x > 0, x, float("-inf")) + kiln.where(x < -5, kiln.inf, 0.0)

    graph = trace(masked, {}, "f32")
    values = sorted(n.attr("value") for n in graph.nodes if n.op == "const")
    assert values[0] == float("-inf") and values[-1] == float("inf")
    text = graph.to_json()
    assert b'"-inf"' in text and b'"inf"' in text
    assert Graph.from_json(text).to_json() == text
