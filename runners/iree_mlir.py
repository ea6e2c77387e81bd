"""Graph -> MLIR text for the IREE target: linalg, arith and math on tensors.

Named linalg ops where they exist (matmul, batch_matmul, transpose, broadcast,
fill, conv_2d_nhwc_hwcf); one ``linalg.generic`` per chain of elementwise
nodes (a node with a single elementwise consumer is computed inside that
consumer's body) and one per reduction. f16/bf16 values are extended to f32
for every op and truncated back after it, which is the oracle's rounding.
The text is deterministic: same graph, same bytes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from kiln.runners.iree_scalar import (  # noqa: F401  (func_name, literal: part of this module's API)
    ELEM,
    ELEMENTWISE,
    F32_SPECIAL,
    FLOATS,
    HALVES,
    SCALAR,
    Body,
    affine,
    constant_op,
    emit_scalar,
    func_name,
    literal,
    reassociation,
    splat_values,
    ttype,
    varying_dims,
)

from kiln.errors import TargetError
from kiln.ir.graph import Graph, Node
from kiln.ir.ops import OPS

# ---------------------------------------------------------------------------
# Tensor level: one emitter per op (STYLE 5), each returning the node's value.

REDUCTIONS = ("sum", "max", "min", "mean", "prod")
# Ops whose generic computes a single-use elementwise producer in its own body.
FUSES_PRODUCERS = (*SCALAR, *REDUCTIONS)


class _Func:
    """The body of one func.func being written: SSA names, map aliases, node values."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.lines: list[str] = []
        self.maps: dict[str, str] = {}
        self.values: dict[int, str] = {}
        self._broadcasts: dict[int, tuple[str, str, list[int]]] = {}
        self.squeezed: dict[int, tuple[str, str, list[int]]] = {}  # keepdims reduce -> unexpanded
        self._count = 0
        self.splats = splat_values(graph)  # written as literals, never as splat tensors
        self.varying = varying_dims(graph, self.splats)
        users, outputs = graph.users(), set(graph.outputs)
        self.inlined = {
            n.id
            for n in graph.nodes
            if n.op in SCALAR
            and n.id not in outputs
            and len(set(users[n.id])) == 1
            and graph.node(users[n.id][0]).op in FUSES_PRODUCERS
        }

    # -- text helpers ---------------------------------------------------
    def fresh(self) -> str:
        self._count += 1
        return f"%{self._count - 1}"

    def emit(self, text: str) -> str:
        name = self.fresh()
        self.lines.append(f"{name} = {text}")
        return name

    def alias(self, amap: str) -> str:
        if amap not in self.maps:
            self.maps[amap] = "#map" + (str(len(self.maps)) if self.maps else "")
        return self.maps[amap]

    def fill(self, value: str, elem: str, shape) -> str:
        cst = self.emit(constant_op(value, elem))
        t = ttype(shape, elem)
        return self.emit(
            f"linalg.fill ins({cst} : {elem}) outs({self.empty(shape, elem)} : {t}) -> {t}"
        )

    def empty(self, shape, elem: str) -> str:
        return self.emit(f"tensor.empty() : {ttype(shape, elem)}")

    def collapse(self, value: str, groups: str, src: str, dst: str) -> str:
        return self.emit(f"tensor.collapse_shape {value} {groups} : {src} into {dst}")

    def expand(self, value: str, groups: str, src: str, shape, elem: str) -> str:
        dims = ", ".join(map(str, shape))
        dst = ttype(shape, elem)
        return self.emit(
            f"tensor.expand_shape {value} {groups} output_shape [{dims}] : {src} into {dst}"
        )

    def generic(self, ins, out: tuple[str, str, str], iters: list[str], body_fn) -> str:
        """``ins``/``out`` are (value, tensor type, affine map); body_fn(body, in_args, out_arg)."""
        name = self.fresh()
        maps = ", ".join(self.alias(m) for _, _, m in [*ins, out])
        kinds = ", ".join(f'"{k}"' for k in iters)
        head = f"{name} = linalg.generic {{indexing_maps = [{maps}], iterator_types = [{kinds}]}}"
        if ins:
            head += f" ins({', '.join(v for v, _, _ in ins)} : {', '.join(t for _, t, _ in ins)})"
        head += f" outs({out[0]} : {out[1]}) {{"
        in_args = [f"%in{k}" for k in range(len(ins))]
        elems = [_elem_of(t) for _, t, _ in [*ins, out]]
        params = ", ".join(f"{a}: {e}" for a, e in zip([*in_args, "%out"], elems, strict=True))
        body = Body(self)
        result = body_fn(body, in_args, "%out")
        self.lines += [head, f"^bb0({params}):"]
        self.lines += ["  " + line for line in body.lines]
        self.lines += [f"  linalg.yield {result} : {elems[-1]}", f"}} -> {out[1]}"]
        return name

    def map_values(self, src: str, shape, in_elem: str, out_elem: str, fn) -> str:
        """An elementwise generic over one tensor: fn(body, value) -> value."""
        ident = affine(len(shape), [f"d{i}" for i in range(len(shape))])
        out = (self.empty(shape, out_elem), ttype(shape, out_elem), ident)
        return self.generic(
            [(src, ttype(shape, in_elem), ident)],
            out,
            ["parallel"] * len(shape),
            lambda b, ins, _: fn(b, ins[0]),
        )

    def round_to(self, src: str, shape, dtype: str) -> str:
        """f32 accumulator -> f16/bf16 result (a no-op for other dtypes)."""
        if dtype not in HALVES:
            return src
        elem = ELEM[dtype]
        return self.map_values(src, shape, "f32", elem, lambda b, v: b.narrow(v, elem))

    # -- node values ----------------------------------------------------
    def tensor(self, nid: int) -> str:
        """The tensor value of a node, materializing lazy consts and broadcasts."""
        if nid not in self.values:
            node = self.graph.node(nid)
            if nid in self.splats:
                self.values[nid] = self.fill(
                    literal(self.splats[nid], node.dtype), ELEM[node.dtype], node.shape
                )
            elif node.op == "broadcast":
                self.values[nid] = _broadcast(self, node)
            elif nid in self.squeezed:
                value, t, kept = self.squeezed[nid]
                groups = reassociation(node.type.rank, kept)
                self.values[nid] = self.expand(value, groups, t, node.shape, ELEM[node.dtype])
            else:
                raise unsupported(node, "value used before it was lowered")
        return self.values[nid]

    def broadcast_source(self, node: Node) -> tuple[str, str, list[int]]:
        """(value, type, output dims it spans): the input without its stretched unit dims."""
        if node.id not in self._broadcasts:
            src = self.graph.node(node.inputs[0])
            offset = node.type.rank - src.type.rank
            kept = [i for i, d in enumerate(src.shape) if d != 1 or node.shape[i + offset] == 1]
            elem = ELEM[src.dtype]
            if src.id in self.squeezed and self.squeezed[src.id][2] == kept:
                value, t, _ = self.squeezed[src.id]
                self._broadcasts[node.id] = (value, t, [i + offset for i in kept])
                return self._broadcasts[node.id]
            value, t = self.tensor(src.id), ttype(src.shape, elem)
            if len(kept) < src.type.rank:
                small = ttype([src.shape[i] for i in kept], elem)
                value = self.collapse(value, reassociation(src.type.rank, kept), t, small)
                t = small
            self._broadcasts[node.id] = (value, t, [i + offset for i in kept])
        return self._broadcasts[node.id]


def _elem_of(tensor_type: str) -> str:
    return tensor_type[len("tensor<") : -1].rsplit("x", 1)[-1]


Leaf = tuple[str, list[int], str, list[int]]  # (tensor, shape, element type, loops it reads)


def _leaf(f: _Func, nid: int, rank: int) -> Leaf:
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


def _fused(f: _Func, root: int, rank: int):
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


def _elementwise(f: _Func, root: Node) -> str:
    """One generic for ``root`` and every inlined elementwise node feeding it."""
    rank, elem = root.type.rank, ELEM[root.dtype]
    leaves, emit = _fused(f, root.id, rank)
    loops = list(range(rank))
    ident = affine(rank, [f"d{i}" for i in loops])
    out = (f.empty(root.shape, elem), ttype(root.shape, elem), ident)
    return f.generic(
        _operands(leaves, loops), out, ["parallel"] * rank, lambda b, ins, _: emit(b, ins)
    )


def _without(f: _Func, leaf: Leaf, dims: list[int]) -> Leaf:
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


def _reduce(f: _Func, node: Node) -> str:
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


def _finish(f: _Func, op: str, value: str, shape, acc: str, count: int, repeats: int) -> str:
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


def _matmul(f: _Func, node: Node) -> str:
    if node.dtype == "bool":
        raise unsupported(node, "matmul needs a numeric dtype")
    a, b = (f.graph.node(i) for i in node.inputs)
    acc, elem, rank = ("f32" if node.dtype in FLOATS else "i32"), ELEM[node.dtype], node.type.rank
    values = [f.tensor(a.id), f.tensor(b.id)]
    shapes = [list(a.shape), list(b.shape)]
    groups = "[[" + ", ".join(map(str, range(rank - 2))) + f"], [{rank - 2}], [{rank - 1}]]"
    if rank > 3:  # fold the batch dims into one
        for k in range(2):
            flat = [int(np.prod(shapes[k][:-2]))] + shapes[k][-2:]
            src = ttype(shapes[k], elem)
            values[k], shapes[k] = f.collapse(values[k], groups, src, ttype(flat, elem)), flat
    out_shape = shapes[0][:-1] + shapes[1][-1:]
    init, tout = f.fill("0.0" if acc == "f32" else "0", acc, out_shape), ttype(out_shape, acc)
    op = "linalg.matmul" if rank == 2 else "linalg.batch_matmul"
    operands = f"{values[0]}, {values[1]} : {ttype(shapes[0], elem)}, {ttype(shapes[1], elem)}"
    value = f.emit(f"{op} ins({operands}) outs({init} : {tout}) -> {tout}")
    if rank > 3:
        value = f.expand(value, groups, tout, node.shape, acc)
    return f.round_to(value, node.shape, node.dtype)


def _transpose(f: _Func, node: Node) -> str:
    x, elem = f.graph.node(node.inputs[0]), ELEM[node.dtype]
    perm = ", ".join(map(str, node.attr("perm")))
    init = f.empty(node.shape, elem)
    return f.emit(
        f"linalg.transpose ins({f.tensor(x.id)} : {ttype(x.shape, elem)}) "
        f"outs({init} : {ttype(node.shape, elem)}) permutation = [{perm}]"
    )


def _reshape(f: _Func, node: Node) -> str:
    """Through a flat 1-D tensor: always valid, and IREE folds the pair."""
    x, elem = f.graph.node(node.inputs[0]), ELEM[node.dtype]
    value = f.tensor(x.id)
    if x.shape == node.shape:
        return value
    flat = ttype([x.type.size], elem)
    if x.type.rank == 0:
        value = f.expand(value, "[]", ttype((), elem), [1], elem)
    elif x.type.rank > 1:
        value = f.collapse(value, reassociation(x.type.rank, [0]), ttype(x.shape, elem), flat)
    if node.type.rank == 0:
        value = f.collapse(value, "[]", flat, ttype((), elem))
    elif node.type.rank > 1:
        value = f.expand(value, reassociation(node.type.rank, [0]), flat, node.shape, elem)
    return value


def _broadcast(f: _Func, node: Node) -> str:
    elem = ELEM[node.dtype]
    value, t, dims = f.broadcast_source(node)
    added = [d for d in range(node.type.rank) if d not in dims]
    if not added:
        return value
    init, out = f.empty(node.shape, elem), ttype(node.shape, elem)
    value = f.emit(
        f"linalg.broadcast ins({value} : {t}) outs({init} : {out}) "
        f"dimensions = [{', '.join(map(str, added))}]"
    )
    # iree-compile 3.13 with data tiling at O3 crashes (PackOp::getResultShape) when a
    # broadcast fuses into a matmul operand's encoding; the barrier keeps it a tensor.
    return f.emit(f"util.optimization_barrier {value} : {out}")


def _conv2d(f: _Func, node: Node) -> str:
    x, w = (f.graph.node(i) for i in node.inputs)
    if node.dtype == "bool":
        raise unsupported(node, "conv2d needs a numeric dtype")
    elem, acc = ELEM[node.dtype], ("f32" if node.dtype in FLOATS else "i32")
    ph, pw = node.attr("padding")
    value, tx = f.tensor(x.id), ttype(x.shape, elem)
    if ph or pw:
        zero = f.emit(f"arith.constant {literal(0, node.dtype)} : {elem}")
        n, h, wd, c = x.shape
        padded = ttype((n, h + 2 * ph, wd + 2 * pw, c), elem)
        name = f.fresh()
        f.lines += [
            f"{name} = tensor.pad {value} low[0, {ph}, {pw}, 0] high[0, {ph}, {pw}, 0] {{",
            "^bb0(%i0: index, %i1: index, %i2: index, %i3: index):",
            f"  tensor.yield {zero} : {elem}",
            f"}} : {tx} to {padded}",
        ]
        value, tx = name, padded
    result = _im2col_matmul(f, node, value, tx, w, elem, acc)
    return f.round_to(result, node.shape, node.dtype)


def _im2col_matmul(f: _Func, node: Node, value: str, tx: str, w: Node, elem: str, acc: str):
    """conv2d as one matmul: the (N*OH*OW, KH*KW*C) patch matrix times the HWIO filter
    seen as (KH*KW*C, F). IREE's CPU matmuls are much faster than its direct convolutions."""
    (sh, sw), (dh, dw) = node.attr("stride"), node.attr("dilation")
    kh, kw, c, nf = w.shape
    n, oh, ow, _ = node.shape
    rows, depth = n * oh * ow, kh * kw * c
    window = ttype((n, oh, ow, c), elem)
    cols_type = ttype((n, oh, ow, depth), elem)
    cols = f.empty((n, oh, ow, depth), elem)
    for i in range(kh):
        for j in range(kw):
            tap = f.emit(
                f"tensor.extract_slice {value}[0, {i * dh}, {j * dw}, 0][{n}, {oh}, {ow}, {c}]"
                f"[1, {sh}, {sw}, 1] : {tx} to {window}"
            )
            cols = f.emit(
                f"tensor.insert_slice {tap} into {cols}[0, 0, 0, {(i * kw + j) * c}]"
                f"[{n}, {oh}, {ow}, {c}][1, 1, 1, 1] : {window} into {cols_type}"
            )
    groups = "[[0, 1, 2], [3]]"
    lhs_t, rhs_t = ttype((rows, depth), elem), ttype((depth, nf), elem)
    lhs = f.collapse(cols, groups, cols_type, lhs_t)
    rhs = f.collapse(f.tensor(w.id), groups, ttype(w.shape, elem), rhs_t)
    init = f.fill(literal(0, acc), acc, (rows, nf))
    tout = ttype((rows, nf), acc)
    flat = f.emit(
        f"linalg.matmul ins({lhs}, {rhs} : {lhs_t}, {rhs_t}) outs({init} : {tout}) -> {tout}"
    )
    return f.expand(flat, groups, tout, node.shape, acc)


def _slice(f: _Func, node: Node) -> str:
    x, elem = f.graph.node(node.inputs[0]), ELEM[node.dtype]
    offsets, strides = node.attr("starts"), node.attr("steps")
    sizes = node.shape

    def text(values) -> str:
        return "[" + ", ".join(map(str, values)) + "]"

    return f.emit(
        f"tensor.extract_slice {f.tensor(x.id)}{text(offsets)}{text(sizes)}{text(strides)} "
        f": {ttype(x.shape, elem)} to {ttype(node.shape, elem)}"
    )


def _concat(f: _Func, node: Node) -> str:
    """Each input inserted at its offset into one result tensor."""
    axis, elem, rank = node.attr("axis"), ELEM[node.dtype], node.type.rank
    value, start = f.empty(node.shape, elem), 0
    for src in (f.graph.node(i) for i in node.inputs):
        offsets = [start if a == axis else 0 for a in range(rank)]
        start += src.shape[axis]
        if src.type.size == 0:
            continue
        value = f.emit(
            f"tensor.insert_slice {f.tensor(src.id)} into {value}"
            f"[{', '.join(map(str, offsets))}][{', '.join(map(str, src.shape))}]"
            f"[{', '.join(['1'] * rank)}] : {ttype(src.shape, elem)} into "
            f"{ttype(node.shape, elem)}"
        )
    return value


TENSOR: dict[str, Callable[[_Func, Node], str | None]] = {
    **{op: _elementwise for op in SCALAR},
    **{op: _reduce for op in REDUCTIONS},
    "matmul": _matmul,
    "transpose": _transpose,
    "reshape": _reshape,
    "slice": _slice,
    "concat": _concat,
    "conv2d": _conv2d,
}
LAZY = ("arg", "const", "broadcast")  # values made on first use (or never, when folded)


def to_mlir(graph: Graph) -> str:
    """The graph as one ``func.func`` in MLIR text (see the module docstring)."""
    f = _Func(graph)
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


def unsupported(node: Node, why: str) -> TargetError:
    return TargetError(
        f"iree: cannot lower node {node.id} ({node.op} -> {node.type}): {why}",
        hint="run the kernel on the cpu target, or file an issue with --dump-dfg output",
    )


assert set(SCALAR) == {n for n, d in OPS.items() if d.kind in ELEMENTWISE}
