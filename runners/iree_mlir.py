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
    ttype,
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
            if node.op == "const":
                self.values[nid] = self.fill(
                    literal(node.attr("value"), node.dtype), ELEM[node.dtype], node.shape
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

    def scalar_leaf(self, nid: int) -> Node | None:
        """The const node a leaf reads, when it is a (broadcast) scalar constant."""
        node = self.graph.node(nid)
        if node.op == "broadcast":
            node = self.graph.node(node.inputs[0])
        return node if node.op == "const" else None


def _elem_of(tensor_type: str) -> str:
    return tensor_type[len("tensor<") : -1].rsplit("x", 1)[-1]


def _fused(f: _Func, root: int, rank: int):
    """Operands and body of the elementwise tree at ``root`` (itself plus inlined producers).

    Returns ``(operands, value)``: operands are (tensor, type, map) over ``rank``
    loops; ``value(body, in_args)`` emits the tree and returns the root's scalar.
    """
    g = f.graph
    ident = affine(rank, [f"d{i}" for i in range(rank)])
    operands: list[tuple[str, str, str]] = []
    slot: dict[int, int] = {}  # leaf node id -> operand index

    def collect(nid: int) -> None:
        if nid == root or nid in f.inlined:
            for i in g.node(nid).inputs:
                collect(i)
        elif nid not in slot and f.scalar_leaf(nid) is None:
            node = g.node(nid)
            if node.op == "broadcast":
                value, t, dims = f.broadcast_source(node)
                operand = (value, t, affine(rank, [f"d{d}" for d in dims]))
            else:
                operand = (f.tensor(nid), ttype(node.shape, ELEM[node.dtype]), ident)
            if operand not in operands:
                operands.append(operand)
            slot[nid] = operands.index(operand)

    collect(root)

    def emit(b: Body, in_args: list[str]) -> str:
        memo: dict[int, str] = {}

        def value(nid: int) -> str:
            if nid not in memo:
                node, const = g.node(nid), f.scalar_leaf(nid)
                if nid in slot:
                    memo[nid] = in_args[slot[nid]]
                elif const is not None and nid != root and nid not in f.inlined:
                    memo[nid] = b.const(const.attr("value"), const.dtype)
                else:
                    args = [value(i) for i in node.inputs]
                    memo[nid] = emit_scalar(b, node, args, g.node(node.inputs[-1]).dtype)
            return memo[nid]

        return value(root)

    return operands, emit


def _elementwise(f: _Func, root: Node) -> str:
    """One generic for ``root`` and every inlined elementwise node feeding it."""
    rank, elem = root.type.rank, ELEM[root.dtype]
    operands, emit = _fused(f, root.id, rank)
    out = (
        f.empty(root.shape, elem),
        ttype(root.shape, elem),
        affine(rank, [f"d{i}" for i in range(rank)]),
    )
    return f.generic(operands, out, ["parallel"] * rank, lambda b, ins, _: emit(b, ins))


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
    x = f.graph.node(node.inputs[0])
    axes, rank, dt = tuple(node.attr("axes")), x.type.rank, x.dtype
    acc = "f32" if dt in FLOATS else ("i64" if dt == "i32" and node.op == "mean" else ELEM[dt])
    kept = [i for i in range(rank) if i not in axes]
    shape = [x.shape[i] for i in kept]
    init = f.fill(_INIT[node.op, acc], acc, shape)
    combine = _COMBINE["sum" if node.op == "mean" else node.op][acc]

    if x.id in f.inlined:  # an elementwise producer used only here runs in this loop
        ins, emit = _fused(f, x.id, rank)
    else:
        ident = affine(rank, [f"d{i}" for i in range(rank)])
        ins, emit = [(f.tensor(x.id), ttype(x.shape, ELEM[dt]), ident)], lambda b, args: args[0]

    def body_fn(b: Body, args: list[str], out: str) -> str:
        v = emit(b, args)
        if dt in HALVES:
            v = b.op(f"arith.extf {v} : {ELEM[dt]} to f32")
        elif acc == "i64":
            v = b.op(f"arith.extsi {v} : i32 to i64")
        return b.op(f"{combine} {v}, {out} : {acc}")

    out = (init, ttype(shape, acc), affine(rank, [f"d{i}" for i in kept]))
    iters = ["reduction" if i in axes else "parallel" for i in range(rank)]
    value = f.generic(ins, out, iters, body_fn)
    count = int(np.prod([x.shape[i] for i in axes]))
    if node.op == "mean" and acc == "i64":

        def finish(b, v):
            q = b.ins("arith.divsi", v, b.op(f"arith.constant {count} : i64"), t="i64")
            return b.op(f"arith.trunci {q} : i64 to i32")

        value = f.map_values(value, shape, "i64", "i32", finish)
    elif node.op == "mean" and acc == "f32":
        value = f.map_values(
            value, shape, "f32", "f32", lambda b, v: b.ins("arith.divf", v, b.const(count, "f32"))
        )
    value = f.round_to(value, shape, dt)
    if node.attr("keepdims"):  # expanded on first use: a broadcast of it reads this directly
        f.squeezed[node.id] = (value, ttype(shape, ELEM[dt]), kept)
        return None
    return value


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
    const = f.scalar_leaf(node.id)
    elem = ELEM[node.dtype]
    if const is not None:
        return f.fill(literal(const.attr("value"), const.dtype), elem, node.shape)
    value, t, dims = f.broadcast_source(node)
    added = [d for d in range(node.type.rank) if d not in dims]
    if not added:
        return value
    init = f.empty(node.shape, elem)
    return f.emit(
        f"linalg.broadcast ins({value} : {t}) outs({init} : {ttype(node.shape, elem)}) "
        f"dimensions = [{', '.join(map(str, added))}]"
    )


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
        if node.op in LAZY or node.id in f.inlined:
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
