"""Graph -> MLIR text for the IREE target: linalg, arith and math on tensors.

Named linalg ops where they exist (matmul, batch_matmul, transpose, broadcast,
fill, conv_2d_nhwc_hwcf); one ``linalg.generic`` per chain of elementwise
nodes (a node with a single elementwise consumer is computed inside that
consumer's body) and one per reduction. f16/bf16 values are extended to f32
for every op and truncated back after it, which is the oracle's rounding;
matmuls and convolutions accumulate in f32, from half-type operands or, where
the target multiplies a half type slowly, from operands widened in bulk.
The text is deterministic: same graph, same bytes. The function being
written and the named-op emitters live in runners/iree_linalg.py; the fused
elementwise and reduction generics, and the walk over the graph, here.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln.ir.graph import Graph, Node
from kiln.ir.ops import OPS
from kiln.runners.iree_linalg import (
    REDUCTIONS,
    MlirFunc,
    concat,
    conv2d,
    matmul,
    reshape,
    slice_op,
    transpose,
    unsupported,
)
from kiln.runners.iree_scalar import (  # noqa: F401  (literal, reassociation: this module's API)
    ELEM,
    ELEMENTWISE,
    F32_SPECIAL,
    FLOATS,
    HALVES,
    SCALAR,
    Body,
    affine,
    emit_scalar,
    func_name,
    literal,
    reassociation,
    ttype,
)

# ---------------------------------------------------------------------------
# Tensor level: one emitter per op (STYLE 5), each returning the node's value.

Leaf = tuple[str, list[int], str, list[int]]  # (tensor, shape, element type, loops it reads)


def _leaf(f: MlirFunc, nid: int, rank: int) -> Leaf:
    """How a generic over ``rank`` loops reads node ``nid``: a broadcast reads its source."""
    node = f.graph.node(nid)
    if node.op == "broadcast":
        value, t, read = f.broadcast_source(node)
        src = f.graph.node(node.inputs[0])
        return value, [node.shape[d] for d in read], ELEM[src.dtype], read
    return f.tensor(nid), list(node.shape), ELEM[node.dtype], list(range(rank))


def _operands(leaves: list[Leaf], loops: list[int]) -> list[tuple[str, str, str]]:
    """(tensor, type, map) of each leaf in a generic whose loops are the dims ``loops``."""
    return [
        (value, ttype(shape, elem), affine(len(loops), [f"d{loops.index(d)}" for d in read]))
        for value, shape, elem, read in leaves
    ]


def _fused(f: MlirFunc, root: int, rank: int):
    """Leaves and body of the elementwise tree at ``root`` (itself plus inlined producers).

    Returns ``(leaves, value)``: the tensors the tree reads (see :data:`Leaf`);
    ``value(body, in_args)`` emits the tree and returns the root's scalar.
    Uniform constants are literals in the body, never leaves.
    """
    g = f.graph
    leaves: list[Leaf] = []
    slot: dict[int, int] = {}  # leaf node id -> operand index

    def collect(nid: int) -> None:
        if nid in f.splats and nid != root:
            return
        if nid == root or nid in f.inlined:
            for i in g.node(nid).inputs:
                collect(i)
        elif nid not in slot:
            leaf = _leaf(f, nid, rank)
            if leaf not in leaves:
                leaves.append(leaf)
            slot[nid] = leaves.index(leaf)

    collect(root)

    def emit(b: Body, in_args: list[str]) -> str:
        memo: dict[int, str] = {}

        def value(nid: int) -> str:
            if nid not in memo:
                node = g.node(nid)
                if nid in slot:
                    memo[nid] = in_args[slot[nid]]
                elif nid in f.splats:
                    memo[nid] = b.const(f.splats[nid], node.dtype)
                else:
                    args = [value(i) for i in node.inputs]
                    memo[nid] = emit_scalar(b, node, args, g.node(node.inputs[-1]).dtype)
            return memo[nid]

        return value(root)

    return leaves, emit


def _elementwise(f: MlirFunc, root: Node) -> str:
    """One generic for ``root`` and every inlined elementwise node feeding it."""
    rank, elem = root.type.rank, ELEM[root.dtype]
    leaves, emit = _fused(f, root.id, rank)
    loops = list(range(rank))
    ident = affine(rank, [f"d{i}" for i in loops])
    out = (f.empty(root.shape, elem), ttype(root.shape, elem), ident)
    return f.generic(
        _operands(leaves, loops), out, ["parallel"] * rank, lambda b, ins, _: emit(b, ins)
    )


def _without(f: MlirFunc, leaf: Leaf, dims: list[int]) -> Leaf:
    """The leaf with the loops ``dims`` dropped: its slice at index 0 along them."""
    value, shape, elem, read = leaf
    gone = [k for k, d in enumerate(read) if d in dims]
    if not gone:
        return leaf
    small = [n for k, n in enumerate(shape) if k not in gone]
    sizes = ", ".join("1" if k in gone else str(n) for k, n in enumerate(shape))
    zeros, ones = ", ".join(["0"] * len(shape)), ", ".join(["1"] * len(shape))
    value = f.emit(
        f"tensor.extract_slice {value}[{zeros}][{sizes}][{ones}] : "
        f"{ttype(shape, elem)} to {ttype(small, elem)}"
    )
    return value, small, elem, [d for d in read if d not in dims]


_INIT = {  # (op, accumulator) -> identity literal
    **{(op, acc): "0" for op in ("sum", "mean") for acc in ("i32", "i64")},
    ("sum", "f32"): "0.0",
    ("mean", "f32"): "0.0",
    ("sum", "i1"): "false",
    ("mean", "i1"): "false",
    ("max", "f32"): F32_SPECIAL["-inf"],
    ("max", "i32"): str(-(2**31)),
    ("max", "i1"): "false",
    ("min", "f32"): F32_SPECIAL["inf"],
    ("min", "i32"): str(2**31 - 1),
    ("min", "i1"): "true",
    ("prod", "f32"): "1.0",
    ("prod", "i32"): "1",
    ("prod", "i1"): "true",
}
_COMBINE = {
    "sum": {"f32": "arith.addf", "i32": "arith.addi", "i64": "arith.addi", "i1": "arith.ori"},
    "max": {"f32": "arith.maximumf", "i32": "arith.maxsi", "i1": "arith.ori"},
    "min": {"f32": "arith.minimumf", "i32": "arith.minsi", "i1": "arith.andi"},
    "prod": {"f32": "arith.mulf", "i32": "arith.muli", "i1": "arith.andi"},
}


def _reduce(f: MlirFunc, node: Node) -> str:
    """Generics looping over the dims the reduced input varies along, and no others.

    Every loop of a generic must be read by an operand, and IREE 3.13 crashes on
    a multiply-and-sum with a kept loop that only its result reads: a reduced
    dim the input does not vary along is folded into the result (:func:`_finish`),
    a kept one is broadcast back after the loops.
    """
    x = f.graph.node(node.inputs[0])
    axes, rank, dt = tuple(node.attr("axes")), x.type.rank, x.dtype
    acc = "f32" if dt in FLOATS else ("i64" if dt == "i32" and node.op == "mean" else ELEM[dt])
    kept = [i for i in range(rank) if i not in axes]
    folded = [a for a in axes if a not in f.varying[x.id]]
    spread = [k for k in kept if k not in f.varying[x.id]]  # the result is the same along these
    own = [k for k in kept if k not in spread]
    shape = [x.shape[i] for i in own]
    init = f.fill(_INIT[node.op, acc], acc, shape)
    combine = _COMBINE["sum" if node.op == "mean" else node.op][acc]

    if x.id in f.inlined:  # an elementwise producer used only here runs in this loop
        leaves, emit = _fused(f, x.id, rank)
    else:
        leaves, emit = [_leaf(f, x.id, rank)], lambda b, args: args[0]
    leaves = [_without(f, leaf, folded + spread) for leaf in leaves]
    looped = [a for a in axes if a not in folded]
    loops = [i for i in range(rank) if i not in folded + spread]

    def body_fn(b: Body, args: list[str], out: str) -> str:
        v = emit(b, args)
        if dt in HALVES:
            v = b.op(f"arith.extf {v} : {ELEM[dt]} to f32")
        elif acc == "i64":
            v = b.op(f"arith.extsi {v} : i32 to i64")
        return b.op(f"{combine} {v}, {out} : {acc}")

    first = _first_axes(leaves, looped)
    mid = [i for i in loops if i not in first]  # the dims of the first generic's result
    sizes = [x.shape[i] for i in mid]
    out = init if mid == own else f.fill(_INIT[node.op, acc], acc, sizes)
    out_map = affine(len(loops), [f"d{loops.index(i)}" for i in mid])
    iters = ["reduction" if i in first else "parallel" for i in loops]
    value = f.generic(_operands(leaves, loops), (out, ttype(sizes, acc), out_map), iters, body_fn)
    if mid != own:  # the reduced dims the first generic kept
        value = f.generic(
            [(value, ttype(sizes, acc), affine(len(mid), [f"d{i}" for i in range(len(mid))]))],
            (init, ttype(shape, acc), affine(len(mid), [f"d{mid.index(i)}" for i in own])),
            ["reduction" if i in axes else "parallel" for i in mid],
            lambda b, args, out: b.op(f"{combine} {args[0]}, {out} : {acc}"),
        )
    count, repeats = (int(np.prod([x.shape[i] for i in dims])) for dims in (looped, folded))
    value = _finish(f, node.op, value, shape, acc, count, repeats)
    value = f.round_to(value, shape, dt)
    if spread:
        elem, full = ELEM[dt], [x.shape[i] for i in kept]
        value = f.emit(
            f"linalg.broadcast ins({value} : {ttype(shape, elem)}) outs("
            f"{f.empty(full, elem)} : {ttype(full, elem)}) "
            f"dimensions = [{', '.join(str(kept.index(k)) for k in spread)}]"
        )
        shape = full
    if node.attr("keepdims"):  # expanded on first use: a broadcast of it reads this directly
        f.squeezed[node.id] = (value, ttype(shape, ELEM[dt]), kept)
        return None
    return value


def _first_axes(leaves: list[Leaf], axes: list[int]) -> list[int]:
    """The reduced loops of the generic that reads ``leaves``: each leaf reads all or none.

    IREE 3.13 (llvm-cpu) turns a multiply-and-sum whose operand reads some but
    not all of several reduced loops into an invalid ``vector.contract``
    (sum(broadcast(u[A, 1, C]) * x, axis=(0, 1))); the other loops are reduced
    by a second generic over the first one's result.
    """
    reads = [set(read) & set(axes) for *_, read in leaves]
    reads = [r for r in reads if r]
    if not reads:
        return axes
    common = set(axes).intersection(*reads) or {min(reads[0])}
    return [a for a in axes if a in common]


def _finish(f: MlirFunc, op: str, value: str, shape, acc: str, count: int, repeats: int) -> str:
    """Mean's division by the looped ``count``; sum and prod over ``repeats`` folded copies."""
    if op == "mean" and acc == "i64":

        def quotient(b, v):
            q = b.ins("arith.divsi", v, b.op(f"arith.constant {count} : i64"), t="i64")
            return b.op(f"arith.trunci {q} : i64 to i32")

        return f.map_values(value, shape, "i64", "i32", quotient)
    if op == "mean" and acc == "f32" and count != 1:
        return f.map_values(
            value, shape, acc, acc, lambda b, v: b.ins("arith.divf", v, b.const(count, "f32"))
        )
    if repeats == 1 or acc == "i1" or op not in ("sum", "prod"):
        return value
    mul = "arith.mulf" if acc == "f32" else "arith.muli"
    if op == "sum":  # i32 wraps as numpy's int64 sum cast back does
        dtype = "f32" if acc == "f32" else "i32"
        return f.map_values(
            value, shape, acc, acc, lambda b, v: b.ins(mul, v, b.const(repeats, dtype), t=acc)
        )

    def power(b: Body, v: str) -> str:  # square and multiply: ~2 log2(repeats) products
        result, n = None, repeats
        while n:
            if n & 1:
                result = v if result is None else b.ins(mul, result, v, t=acc)
            n >>= 1
            v = b.ins(mul, v, v, t=acc) if n else v
        return result

    return f.map_values(value, shape, acc, acc, power)


TENSOR: dict[str, Callable[[MlirFunc, Node], str | None]] = {
    **{op: _elementwise for op in SCALAR},
    **{op: _reduce for op in REDUCTIONS},
    "matmul": matmul,
    "transpose": transpose,
    "reshape": reshape,
    "slice": slice_op,
    "concat": concat,
    "conv2d": conv2d,
}
LAZY = ("arg", "const", "broadcast")  # values made on first use (or never, when folded)


def to_mlir(graph: Graph, widen: tuple[str, ...] = ()) -> str:
    """The graph as one ``func.func`` in MLIR text (see the module docstring).

    Matmul and conv2d operands of a dtype in ``widen`` (f16, bf16) are converted
    to f32 in bulk before the contraction (runners/iree_flags.py chooses them).
    """
    f = MlirFunc(graph, widen)
    for arg in graph.args:
        f.values[arg.id] = f"%arg{arg.attr('index')}"
    for node in graph.nodes:
        if node.op in LAZY or node.id in f.inlined or node.id in f.splats:
            continue
        emitter = TENSOR.get(node.op)
        if emitter is None:
            raise unsupported(node, "no MLIR lowering for this op")
        value = emitter(f, node)
        if value is not None:
            f.values[node.id] = value
    results = [f.tensor(i) for i in graph.outputs]
    out_types = [ttype(n.shape, ELEM[n.dtype]) for n in graph.output_nodes]
    params = ", ".join(
        f"%arg{a.attr('index')}: {ttype(a.shape, ELEM[a.dtype])}" for a in graph.args
    )
    lines = [f"{alias} = {amap}" for amap, alias in f.maps.items()]
    lines.append(f"func.func @{func_name(graph)}({params}) -> ({', '.join(out_types)}) {{")
    lines += ["  " + line for line in f.lines]
    lines.append(f"  return {', '.join(results)} : {', '.join(out_types)}")
    lines.append("}")
    return "\n".join(lines) + "\n"


assert set(SCALAR) == {n for n, d in OPS.items() if d.kind in ELEMENTWISE}
