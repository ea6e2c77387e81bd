"""The func.func being written for the IREE target, and its named linalg ops.

``MlirFunc`` holds one function's text as it grows (SSA names, map aliases,
each node's value); the emitters here lower the ops with a named linalg or
tensor form: matmul, transpose, reshape, broadcast, conv2d, slice, concat.
runners/iree_mlir.py adds the fused elementwise and reduction generics and
walks the graph.
"""

from __future__ import annotations

import numpy as np

from kiln.errors import TargetError
from kiln.ir.graph import Graph, Node
from kiln.runners.iree_scalar import (
    ELEM,
    FLOATS,
    HALVES,
    SCALAR,
    Body,
    affine,
    constant_op,
    literal,
    reassociation,
    splat_values,
    ttype,
    varying_dims,
)

REDUCTIONS = ("sum", "max", "min", "mean", "prod")
# Ops whose generic computes a single-use elementwise producer in its own body.
FUSES_PRODUCERS = (*SCALAR, *REDUCTIONS)


class MlirFunc:
    """The body of one func.func being written: SSA names, map aliases, node values."""

    def __init__(self, graph: Graph, widen: tuple[str, ...] = ()):
        self.graph = graph
        self.widen = frozenset(widen)  # half types whose contraction operands become f32
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
        elems = [elem_of(t) for _, t, _ in [*ins, out]]
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

    def widened(self, value: str, shape, elem: str) -> str:
        """A contraction operand converted to f32 as one elementwise op, kept apart
        (IREE folds a lone ``extf`` back into the contraction, whose half-type
        microkernel then converts in its inner loop: f16 gemm 1024^3 took 2x f32)."""
        wide = self.map_values(
            value, shape, elem, "f32", lambda b, v: b.op(f"arith.extf {v} : {elem} to f32")
        )
        return self.barrier(wide, ttype(shape, "f32"))

    def barrier(self, value: str, tensor_type: str) -> str:
        """``value`` as it is: IREE fuses nothing across it."""
        return self.emit(f"util.optimization_barrier {value} : {tensor_type}")

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
                self.values[nid] = broadcast(self, node)
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


def elem_of(tensor_type: str) -> str:
    return tensor_type[len("tensor<") : -1].rsplit("x", 1)[-1]


def matmul(f: MlirFunc, node: Node) -> str:
    if node.dtype == "bool":
        raise unsupported(node, "matmul needs a numeric dtype")
    a, b = (f.graph.node(i) for i in node.inputs)
    acc, elem, rank = ("f32" if node.dtype in FLOATS else "i32"), ELEM[node.dtype], node.type.rank
    values = [f.tensor(a.id), f.tensor(b.id)]
    shapes = [list(a.shape), list(b.shape)]
    if node.dtype in f.widen:
        values = [f.widened(v, s, elem) for v, s in zip(values, shapes, strict=True)]
        elem = "f32"
    groups = "[[" + ", ".join(map(str, range(rank - 2))) + f"], [{rank - 2}], [{rank - 1}]]"
    if rank > 3:  # fold the batch dims into one
        for k in range(2):
            flat = [int(np.prod(shapes[k][:-2]))] + shapes[k][-2:]
            src = ttype(shapes[k], elem)
            values[k], shapes[k] = f.collapse(values[k], groups, src, ttype(flat, elem)), flat
    if len(shapes[0]) == 3:
        # iree-compile 3.13 with data tiling miscompiles a batch_matmul whose operand is
        # a fused broadcasting elementwise op (every batch after the first came out wrong):
        # the barrier keeps each operand a tensor of its own
        values = [f.barrier(v, ttype(s, elem)) for v, s in zip(values, shapes, strict=True)]
    out_shape = shapes[0][:-1] + shapes[1][-1:]
    init, tout = f.fill("0.0" if acc == "f32" else "0", acc, out_shape), ttype(out_shape, acc)
    op = "linalg.matmul" if rank == 2 else "linalg.batch_matmul"
    operands = f"{values[0]}, {values[1]} : {ttype(shapes[0], elem)}, {ttype(shapes[1], elem)}"
    value = f.emit(f"{op} ins({operands}) outs({init} : {tout}) -> {tout}")
    if rank > 3:
        value = f.expand(value, groups, tout, node.shape, acc)
    return f.round_to(value, node.shape, node.dtype)


def transpose(f: MlirFunc, node: Node) -> str:
    x, elem = f.graph.node(node.inputs[0]), ELEM[node.dtype]
    perm = ", ".join(map(str, node.attr("perm")))
    init = f.empty(node.shape, elem)
    return f.emit(
        f"linalg.transpose ins({f.tensor(x.id)} : {ttype(x.shape, elem)}) "
        f"outs({init} : {ttype(node.shape, elem)}) permutation = [{perm}]"
    )


def reshape(f: MlirFunc, node: Node) -> str:
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


def broadcast(f: MlirFunc, node: Node) -> str:
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
    return f.barrier(value, out)


def conv2d(f: MlirFunc, node: Node) -> str:
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


def _im2col_matmul(f: MlirFunc, node: Node, value: str, tx: str, w: Node, elem: str, acc: str):
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
    if node.dtype in f.widen:  # the patch matrix is gathered narrow, then widened once
        lhs, rhs = f.widened(lhs, (rows, depth), elem), f.widened(rhs, (depth, nf), elem)
        lhs_t, rhs_t = ttype((rows, depth), "f32"), ttype((depth, nf), "f32")
    else:  # gathered on its own: fused into the matmul's packing it ran 2.3x slower (f32)
        lhs = f.barrier(lhs, lhs_t)
    init = f.fill(literal(0, acc), acc, (rows, nf))
    tout = ttype((rows, nf), acc)
    flat = f.emit(
        f"linalg.matmul ins({lhs}, {rhs} : {lhs_t}, {rhs_t}) outs({init} : {tout}) -> {tout}"
    )
    return f.expand(flat, groups, tout, node.shape, acc)


def slice_op(f: MlirFunc, node: Node) -> str:
    x, elem = f.graph.node(node.inputs[0]), ELEM[node.dtype]
    offsets, strides = node.attr("starts"), node.attr("steps")
    sizes = node.shape

    def text(values) -> str:
        return "[" + ", ".join(map(str, values)) + "]"

    return f.emit(
        f"tensor.extract_slice {f.tensor(x.id)}{text(offsets)}{text(sizes)}{text(strides)} "
        f": {ttype(x.shape, elem)} to {ttype(node.shape, elem)}"
    )


def concat(f: MlirFunc, node: Node) -> str:
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


def unsupported(node: Node, why: str) -> TargetError:
    return TargetError(
        f"iree: cannot lower node {node.id} ({node.op} -> {node.type}): {why}",
        hint="run the kernel on the cpu target, or file an issue with --dump-dfg output",
    )
