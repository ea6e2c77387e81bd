"""Graph -> MLIR text: pinned against a golden file, plus the rules the text follows.

Set KILN_UPDATE_GOLDEN=1 to rewrite the golden file after an intended change
(and read the diff: it is the review of the lowering change).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from kiln.errors import TargetError
from kiln.ir.graph import Graph, Node, TensorType, make_attrs
from kiln.ir.graph_verify import verify_graph
from kiln.runners.iree_mlir import func_name, literal, reassociation, to_mlir

GOLDEN = Path(__file__).parent / "golden"


def _node(nodes, op, inputs, out_shape, dtype="f32", **attrs) -> int:
    out = TensorType(out_shape, dtype)
    nodes.append(Node(len(nodes), op, tuple(inputs), out, make_attrs(**attrs)))
    return len(nodes) - 1


def scaled_softmax_graph() -> Graph:
    """exp(x * w + 1) / sum(..., keepdims): a fused chain, a reduce, a broadcast back."""
    n: list[Node] = []
    x = _node(n, "arg", (), (4, 8), name="x", index=0)
    w = _node(n, "arg", (), (8,), name="w", index=1)
    wb = _node(n, "broadcast", (w,), (4, 8), shape=(4, 8))
    one = _node(n, "const", (), (), value=1.0)
    oneb = _node(n, "broadcast", (one,), (4, 8), shape=(4, 8))
    e = _node(
        n, "exp", (_node(n, "add", (_node(n, "mul", (x, wb), (4, 8)), oneb), (4, 8)),), (4, 8)
    )
    s = _node(n, "sum", (e,), (4, 1), axes=(1,), keepdims=True)
    out = _node(n, "div", (e, _node(n, "broadcast", (s,), (4, 8), shape=(4, 8))), (4, 8))
    graph = Graph("scaled_softmax.small", tuple(n), (out, s))
    verify_graph(graph)
    return graph


def test_golden_elementwise_and_reduce():
    text = to_mlir(scaled_softmax_graph())
    path = GOLDEN / "scaled_softmax.mlir"
    if os.environ.get("KILN_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


def test_text_is_deterministic():
    assert to_mlir(scaled_softmax_graph()) == to_mlir(scaled_softmax_graph())


def test_elementwise_chain_is_one_generic():
    text = to_mlir(scaled_softmax_graph())
    # mul+add+exp fused; the sum; the div: three generics, no materialized broadcast.
    assert text.count("linalg.generic") == 3
    assert "linalg.broadcast" not in text and "tensor.expand_shape" in text


def test_single_use_producer_is_computed_inside_the_reduction():
    n: list[Node] = []
    x = _node(n, "arg", (), (4, 8), name="x", index=0)
    sq = _node(n, "mul", (x, x), (4, 8))
    s = _node(n, "sum", (sq,), (4,), axes=(1,), keepdims=False)
    text = to_mlir(Graph("sumsq", tuple(n), (s,)))
    assert text.count("linalg.generic") == 1 and "arith.mulf %in0, %in0" in text


def test_half_precision_is_computed_in_f32_and_rounded_per_op():
    n: list[Node] = []
    x = _node(n, "arg", (), (8,), "f16", name="x", index=0)
    y = _node(n, "arg", (), (8,), "bf16", name="y", index=1)
    ex = _node(n, "exp", (x,), (8,), "f16")
    ey = _node(n, "neg", (_node(n, "exp", (y,), (8,), "bf16"),), (8,), "bf16")
    text = to_mlir(Graph("halves", tuple(n), (ex, ey)))
    assert "arith.extf" in text and "math.exp" in text and ": f32" in text
    assert "arith.truncf" in text  # f16 rounds with truncf
    assert "i16 to bf16" in text  # bf16 rounds with integer ops (IREE folds extf(truncf))


def test_unknown_op_is_a_target_error():
    n: list[Node] = []
    x = _node(n, "arg", (), (2,), name="x", index=0)
    y = _node(n, "frobnicate", (x,), (2,))
    with pytest.raises(TargetError, match="frobnicate"):
        to_mlir(Graph("bad", tuple(n), (y,)))


def test_literals_are_exact_and_parseable():
    assert literal(1.0, "f32") == "1.0"
    assert literal(0.1, "f32") == "0.1"
    assert literal(1e-5, "f32") == "1.0e-05"
    assert literal(float("-inf"), "f32") == "0xFF800000"
    assert literal(float("nan"), "bf16") == "0x7FC0"
    assert literal(0.1, "f16") == str(np.float32(np.float16(0.1)))
    assert literal(3.7, "i32") == "3" and literal(2, "bool") == "true"


def test_reassociation_groups_unit_dims_with_their_neighbours():
    assert reassociation(2, [0]) == "[[0, 1]]"
    assert reassociation(3, [1]) == "[[0, 1, 2]]"
    assert reassociation(4, [0, 2]) == "[[0, 1], [2, 3]]"
    assert reassociation(2, []) == "[]"


def test_function_name_is_an_mlir_identifier():
    g = scaled_softmax_graph()
    assert func_name(g) == "scaled_softmax_small"
    assert f"func.func @{func_name(g)}(" in to_mlir(g)


def test_golden_compiles_with_iree():
    compiler = pytest.importorskip("iree.compiler", reason="needs the 'iree' extra")
    vmfb = compiler.compile_str(
        (GOLDEN / "scaled_softmax.mlir").read_text(),
        target_backends=["llvm-cpu"],
        extra_args=["--iree-llvmcpu-target-cpu=generic"],
    )
    assert len(vmfb) > 0


def slice_concat_prod_graph() -> Graph:
    """x[1:4, ::2] next to x[:3, :3] (a strided window and a concat), then a prod reduction."""
    n: list[Node] = []
    x = _node(n, "arg", (), (4, 6), name="x", index=0)
    a = _node(n, "slice", (x,), (3, 3), starts=(1, 0), steps=(1, 2), sizes=(3, 3))
    b = _node(n, "slice", (x,), (3, 3), starts=(0, 0), steps=(1, 1), sizes=(3, 3))
    cat = _node(n, "concat", (a, b), (3, 6), axis=1)
    out = _node(n, "prod", (cat,), (3,), axes=(1,), keepdims=False)
    graph = Graph("slice_concat_prod", tuple(n), (out, cat))
    verify_graph(graph)
    return graph


def test_golden_slice_concat_prod():
    text = to_mlir(slice_concat_prod_graph())
    path = GOLDEN / "slice_concat_prod.mlir"
    if os.environ.get("KILN_UPDATE_GOLDEN"):
        path.write_text(text)
    assert "tensor.extract_slice %arg0[1, 0][3, 3][1, 2]" in text
    assert text.count("tensor.insert_slice") == 2
    assert text == path.read_text()


def _bcast_graph(name, src_shape, shape, reduce_op, axes, with_x=False, value=None) -> Graph:
    """reduce_op(broadcast(w or a const) [* x], axes): the input does not vary along some axes."""
    n: list[Node] = []
    x = _node(n, "arg", (), shape, name="x", index=0)
    if value is None:
        w = _node(n, "arg", (), src_shape, name="w", index=1)
    else:
        w = _node(n, "const", (), (), value=value)
    b = _node(n, "broadcast", (w,), shape, shape=shape)
    y = _node(n, "mul", (b, x), shape) if with_x else b
    out_shape = tuple(d for i, d in enumerate(shape) if i not in axes)
    out = _node(n, reduce_op, (y,), out_shape, axes=axes, keepdims=False)
    graph = Graph(name, tuple(n), (out,))
    verify_graph(graph)
    return graph


def test_reduction_of_a_constant_is_a_literal_not_a_loop():
    text = to_mlir(_bcast_graph("c_sum", (), (3, 5), "sum", (1,), value=1.0))
    assert "linalg.generic" not in text
    assert "arith.constant 5.0 : f32" in text and "linalg.fill" in text
    text = to_mlir(_bcast_graph("c_prod", (), (3, 5), "prod", (1,), value=2.0))
    assert "arith.constant 32.0 : f32" in text


def test_reduction_along_a_broadcast_dim_is_folded_into_a_product():
    text = to_mlir(_bcast_graph("r_bcol", (3, 1), (3, 5), "sum", (1,)))
    assert 'iterator_types = ["parallel"]' in text  # no loop over the stretched dim
    assert "arith.constant 5.0 : f32" in text and "arith.mulf" in text
    text = to_mlir(_bcast_graph("r_bmax", (3, 1), (3, 5), "max", (1,)))
    assert "arith.constant 5.0" not in text  # max of copies is the value


def test_operand_reading_part_of_several_reduced_loops_reduces_in_two_steps():
    text = to_mlir(_bcast_graph("r_part", (2, 1, 5), (2, 3, 5), "sum", (0, 1), with_x=True))
    assert 'iterator_types = ["reduction", "parallel", "parallel"]' in text
    assert 'iterator_types = ["reduction", "parallel"]' in text
    text = to_mlir(_bcast_graph("r_whole", (2, 1, 5), (2, 3, 5), "sum", (0,), with_x=True))
    assert text.count("linalg.generic") == 1  # a single reduced loop: one generic


def test_kept_dim_no_operand_reads_is_broadcast_after_the_reduction():
    text = to_mlir(_bcast_graph("r_spread", (1, 3, 1), (2, 3, 5), "sum", (1,)))
    assert 'iterator_types = ["reduction"]' in text  # one loop: the dim w varies along
    assert "linalg.broadcast" in text and "dimensions = [0, 1]" in text


def _contractions_graph(dtype: str) -> Graph:
    """A matmul and a padded 3x3 conv2d in ``dtype``."""
    n: list[Node] = []
    a = _node(n, "arg", (), (4, 6), dtype, name="a", index=0)
    b = _node(n, "arg", (), (6, 5), dtype, name="b", index=1)
    x = _node(n, "arg", (), (1, 4, 4, 3), dtype, name="x", index=2)
    w = _node(n, "arg", (), (3, 3, 3, 2), dtype, name="w", index=3)
    mm = _node(n, "matmul", (a, b), (4, 5), dtype)
    conv = _node(
        n, "conv2d", (x, w), (1, 4, 4, 2), dtype, stride=(1, 1), padding=(1, 1), dilation=(1, 1)
    )
    graph = Graph(f"contract_{dtype}", tuple(n), (mm, conv))
    verify_graph(graph)
    return graph


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_widened_halves_reach_the_contractions_as_f32(dtype):
    """Operands converted in bulk, each behind a barrier (else IREE folds the extf back)."""
    text = to_mlir(_contractions_graph(dtype), widen=(dtype,))
    matmuls = [line for line in text.splitlines() if "linalg.matmul" in line]
    assert len(matmuls) == 2 and all(f"x{dtype}>" not in line for line in matmuls)
    assert text.count(f"arith.extf %in0 : {dtype} to f32") == 4
    assert text.count("util.optimization_barrier") == 4
    assert text.count("arith.truncf") + text.count("arith.bitcast") >= 2  # rounded back


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_native_halves_feed_the_contractions_directly(dtype):
    text = to_mlir(_contractions_graph(dtype), widen=())
    matmuls = [line for line in text.splitlines() if "linalg.matmul" in line]
    assert all(f"x{dtype}>, tensor<" in line and "xf32>)" in line for line in matmuls)
    assert "arith.extf" not in text
    # the conv's patch matrix is gathered on its own, apart from the matmul's packing
    assert text.count("util.optimization_barrier") == 1
