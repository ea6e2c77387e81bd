"""The traced graph is in normal form and depends on nothing but the kernel's code."""

import importlib.util

import numpy as np
import pytest

import kiln
from kiln import Tensor, device, trace
from kiln.errors import TraceError
from kiln.ir.graph import Graph
from kiln.ir.interp import run_graph

# ruff: noqa: F821  (Tensor["N"] names a dim)


def ops(graph: Graph) -> list[str]:
    return [n.op for n in graph.nodes]


@device
def bias_add(x: Tensor["R", "C"], b: Tensor["C"]):
    return x + b


def test_broadcast_is_an_explicit_node():
    g = trace(bias_add, {"R": 2, "C": 3}, "f32")
    assert ops(g) == ["arg", "arg", "broadcast", "add"]
    bcast = g.nodes[2]
    assert bcast.inputs == (1,) and bcast.attr("shape") == (2, 3) and bcast.shape == (2, 3)
    assert g.nodes[3].inputs == (0, 2)


@device
def scaled(x: Tensor["N"]):
    return x * 2 + 0.5


def test_python_scalars_become_const_nodes_of_the_tensor_dtype():
    g = trace(scaled, {"N": 4}, "f16")
    assert ops(g) == ["arg", "const", "broadcast", "mul", "const", "broadcast", "add"]
    two, half = g.nodes[1], g.nodes[4]
    assert two.shape == () and two.dtype == "f16" and two.attr("value") == 2.0
    assert isinstance(two.attr("value"), float)
    assert half.attr("value") == 0.5
    assert g.nodes[-1].dtype == "f16"


@device
def mixed(a: Tensor["N"], b: Tensor["N"]):
    return a + b


def test_mixed_dtypes_get_explicit_casts():
    g = trace(mixed, {"N": 4}, {"a": "i32", "b": "bf16"})
    assert ops(g) == ["arg", "arg", "cast", "add"]
    assert g.nodes[2].attr("dtype") == "bf16" and g.nodes[2].inputs == (0,)
    g = trace(mixed, {"N": 4}, {"a": "f16", "b": "bf16"})
    assert ops(g) == ["arg", "arg", "cast", "cast", "add"]
    assert g.nodes[-1].dtype == "f32"


@device
def int_mean(x: Tensor["R", "C"]):
    return x.mean(axis=-1), x / 2


def test_integer_mean_and_division_cast_to_f32_first():
    g = trace(int_mean, {"R": 2, "C": 3}, "i32")
    assert ops(g) == ["arg", "cast", "mean", "cast", "const", "broadcast", "div"]
    assert g.nodes[2].attr("axes") == (1,) and g.nodes[2].attr("keepdims") is False
    assert g.nodes[4].dtype == "f32"
    assert [g.nodes[i].dtype for i in g.outputs] == ["f32", "f32"]


@device
def reduce_axes(x: Tensor["A", "B", "C"]):
    return x.sum(axis=(-1, 0)), x.max(axis=-2, keepdims=True)


def test_reduction_axes_are_normalized_and_sorted():
    g = trace(reduce_axes, {"A": 2, "B": 3, "C": 4}, "f32")
    assert g.nodes[1].attr("axes") == (0, 2) and g.nodes[1].shape == (3,)
    assert g.nodes[2].attr("axes") == (1,) and g.nodes[2].shape == (2, 1, 4)


@device
def dead_code(x: Tensor["N"]):
    unused = x.exp() * 3.0  # noqa: F841
    return x + 1.0


def test_unused_values_are_dropped_and_ids_stay_positions():
    g = trace(dead_code, {"N": 4}, "f32")
    assert ops(g) == ["arg", "const", "broadcast", "add"]
    assert [n.id for n in g.nodes] == list(range(len(g.nodes)))


@device
def unused_arg(x: Tensor["N"], y: Tensor["N"]):
    return x


def test_arguments_are_kept_even_when_unused():
    g = trace(unused_arg, {"N": 4}, "f32")
    assert [(a.attr("name"), a.attr("index")) for a in g.args] == [("x", 0), ("y", 1)]
    assert g.outputs == (0,)


@device
def two_outputs(x: Tensor["N"]):
    return x.exp(), x.log()


def test_graph_metadata():
    g = trace(two_outputs, {"N": 4, "Z": 9}, "f32")
    assert g.name == "two_outputs"
    assert g.bindings == (("N", 4), ("Z", 9))
    assert len(g.outputs) == 2
    assert Graph.from_json(g.to_json()) == g


@device
def vector_matmul(m: Tensor["M", "K"], v: Tensor["K"]):
    return m @ v


def test_vector_matmul_is_reshape_matmul_reshape():
    g = trace(vector_matmul, {"M": 3, "K": 2}, "f32")
    assert ops(g) == ["arg", "arg", "reshape", "matmul", "reshape"]
    assert g.nodes[-1].shape == (3,)


@device
def batch_bcast(a: Tensor["B", "M", "K"], b: Tensor["K", "N"]):
    return a @ b


def test_matmul_batch_dims_are_broadcast_explicitly():
    g = trace(batch_bcast, {"B": 2, "M": 3, "K": 4, "N": 5}, "f32")
    assert ops(g) == ["arg", "arg", "broadcast", "matmul"]
    assert g.nodes[2].shape == (2, 4, 5)


@device
def keyword_only(x: Tensor["N"], *, scale: Tensor[()]):
    return x * scale


def test_keyword_only_tensor_arguments_are_refused():
    """Targets pass a kernel's inputs by position: a keyword-only one would trace, then fail."""
    with pytest.raises(TraceError, match="kernel arguments must be positional"):
        trace(keyword_only, {"N": 3}, "f32")


@device
def everything(x: Tensor["R", "C"], w: Tensor["C", "C"], m: Tensor["C"]):
    h = kiln.gelu(x @ w) + kiln.sigmoid(m) * kiln.tanh(x)
    h = kiln.where(h > 0, h, h * 0.01) - kiln.minimum(x, 1.0) / kiln.maximum(m.abs(), 0.5)
    h = (h.reshape(-1) ** 2).reshape(x.shape).T.transpose(1, 0)
    return kiln.sqrt(h.sum(axis=0) + 1.0).astype("bf16"), -(x.max() - x.min()) + h.mean()


def test_eager_equals_the_interpreted_graph_bit_for_bit():
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((3, 4), (4, 4), (4,))]
    g = trace(everything, {"R": 3, "C": 4}, "f32")
    for eager, interp in zip(everything(*args), run_graph(g, args), strict=True):
        assert eager.dtype == interp.dtype
        np.testing.assert_array_equal(eager, interp)


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_comment_and_blank_line_edits_leave_graph_bytes_identical(tmp_path):
    source = (
        "from kiln import Tensor, device\n\n\n"
        "@device\n"
        'def k(x: Tensor["N"]):\n'
        "    return (x * 2.0).exp()\n"
    )
    path = tmp_path / "edited.py"
    path.write_text(source)
    before = trace(load(path, "edited_a").k, {"N": 8}, "f32").to_json()
    path.write_text(
        "# a new header comment\n\n\n" + source.replace("    return", "    # why\n    return")
    )
    after = trace(load(path, "edited_b").k, {"N": 8}, "f32").to_json()
    assert before == after


def test_same_trace_twice_is_byte_identical():
    a = trace(everything, {"R": 3, "C": 4}, "f32").to_json()
    b = trace(everything, {"R": 3, "C": 4}, "f32").to_json()
    assert a == b
