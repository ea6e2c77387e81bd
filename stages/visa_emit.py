"""Emission for the visa stage: each planned group tiled into boxes and unrolled.

Loads of external inputs, the fused chain on resident tiles, stores of the
values needed elsewhere. Used by stages/visa.py.
"""

from __future__ import annotations

import math
from itertools import product

from kiln.ir import visa
from kiln.ir.graph import Node
from kiln.ir.ops import OPS as GRAPH_OPS
from kiln.ir.visa import Imm, Tile, View
from kiln.stages.visa_plan import (
    DramRef,
    Group,
    Planner,
    TileSizes,
    compact_view,
    contiguous_strides,
    fit_box,
    fit_rows,
    fit_transpose,
    iter_boxes,
    producer_box,
    rounded_imm,
)

# how two partial reductions combine (reduce_split)
COMBINE = {"sum": "add", "prod": "mul", "max": "maximum", "min": "minimum"}


class Emitter:
    """Pass 3: unrolled instructions and the buffers they use."""

    def __init__(self, plan: Planner, tiles: TileSizes, home: dict[int, str], pads: dict[int, str]):
        self.plan = plan
        self.graph = plan.graph
        self.tiles = tiles
        self.home = home
        self.pads = pads
        self.instrs: list[visa.Instr] = []
        self.buffers: dict[str, visa.Buffer] = {}
        self.loaded: dict[str, tuple] = {}  # buffer -> (source, shape) it holds unchanged
        self.reduce_steps: dict[int, int] = {}  # reduction node -> boxes reduced so far - 1
        # the graph node each instruction was emitted for (the report's source map)
        self.current = -1
        self.origins: list[int] = []

    # -- primitives ------------------------------------------------------------
    def buffer(self, name: str, dtype: str, shape: tuple[int, ...]) -> str:
        old = self.buffers.get(name)
        if old is None or math.prod(shape) > old.size:
            self.buffers[name] = visa.Buffer(name, dtype, tuple(shape))
        return name

    def emit(self, op: str, dst: Tile | View, *srcs, **attrs) -> None:
        if op in ("load", "fill"):
            key = (srcs[0], dst.shape)
            if self.loaded.get(dst.buf) == key:
                return  # the buffer already holds exactly this
            self.loaded[dst.buf] = key
        elif isinstance(dst, Tile):
            self.loaded.pop(dst.buf, None)
        else:
            for buf, (src, _) in list(self.loaded.items()):
                if isinstance(src, View) and src.tensor == dst.tensor:
                    del self.loaded[buf]
        self.instrs.append(visa.Instr(op, dst, tuple(srcs), tuple(sorted(attrs.items()))))
        self.origins.append(self.current)

    def view(self, nid: int, origin, extent) -> View | None:
        """The DRAM view of a box of node ``nid`` (None for an immediate)."""
        ref = self.plan.loc[nid]
        if isinstance(ref, Imm):
            return None
        offset = ref.offset + sum(o * s for o, s in zip(origin, ref.strides, strict=True))
        return compact_view(View(self.home[ref.base], offset, tuple(extent), ref.strides))

    def operand(self, nid: int, buf: str, view: View | None, shape, cap) -> Tile:
        """Node ``nid``'s data in ``buf``: loaded from ``view``, or filled (no view: immediate)."""
        tile = Tile(self.buffer(buf, self.graph.node(nid).dtype, tuple(cap)), tuple(shape))
        if view is None:
            self.emit("fill", tile, self.plan.loc[nid])
        else:
            self.emit("load", tile, view)
        return tile

    def tile(self, nid: int, buf: str, origin, extent, cap) -> Tile:
        return self.operand(nid, buf, self.view(nid, origin, extent), extent, cap)

    def store(self, nid: int, tile: Tile, origin, extent, shape=None, dest=None) -> None:
        tensor = dest or self.home.get(nid)
        if tensor is None:
            return
        strides = contiguous_strides(shape if shape is not None else self.graph.node(nid).shape)
        offset = sum(o * s for o, s in zip(origin, strides, strict=True))
        self.emit("store", compact_view(View(tensor, offset, tuple(extent), strides)), tile)

    def value(self, g: Group, nid: int, vals: dict, origin, extent, box, need_tile=False):
        if nid in g.aliases:
            return vals[g.aliases[nid]]
        if nid in vals:
            return vals[nid]
        ref = self.plan.loc[nid]
        if isinstance(ref, Imm) and not need_tile:
            return ref
        vals[nid] = self.tile(nid, f"in{nid}_g{g.index}", origin, extent, box)
        return vals[nid]

    # -- groups ------------------------------------------------------------------
    def fused(self, g: Group) -> None:
        axes = g.axes or ()
        if g.producer is not None:
            box = producer_box(g.producer, self.tiles)
        elif g.resident:
            box = fit_rows(g.shape, axes, self.tiles.vector)
        else:
            box = fit_box(g.shape, self.tiles.vector)
        kept_box = tuple(1 if a in axes else b for a, b in enumerate(box))
        order = self.tiles.order if g.producer is not None else "mn"
        for origin, extent, first, last in iter_boxes(g.shape, box, axes, order):
            rows = (
                tuple(0 if a in axes else o for a, o in enumerate(origin)),
                tuple(1 if a in axes else e for a, e in enumerate(extent)),
                kept_box,
            )
            vals: dict[int, Tile | Imm] = {}
            if g.producer is not None:
                p = g.producer
                self.current = p.id
                vals[p.id] = _PRODUCE[p.op](self, p, origin, extent, box)
                self.store(p.id, vals[p.id], origin, extent)
            for m in g.members:
                self.current = m.id
                if GRAPH_OPS[m.op].kind == "reduce":
                    out = self.reduce_step(g, m, axes, vals, (origin, extent, box), first, last)
                    if out is not None:
                        vals[m.id] = out
                    continue
                at, ext, cap = (origin, extent, box) if m.shape == g.shape else rows
                srcs = [self.value(g, i, vals, at, ext, cap) for i in m.inputs]
                dst = Tile(self.buffer(f"v{m.id}", m.dtype, cap), ext)
                self.emit(m.op, dst, *srcs)
                vals[m.id] = dst
                self.store(m.id, dst, at, ext)

    def reduce_step(self, g: Group, red: Node, axes, vals, where, first, last) -> Tile | None:
        """Reduce one box into the accumulator; after the last box, finish and store."""
        origin, extent, box = where
        src = self.value(g, red.inputs[0], vals, origin, extent, box, need_tile=True)
        kept = tuple(1 if a in axes else e for a, e in enumerate(extent))
        cap = tuple(1 if a in axes else b for a, b in enumerate(box))
        op = "sum" if red.op == "mean" else red.op
        sdt = self.graph.node(red.inputs[0]).dtype
        adt = visa.acc_dtype(sdt) if op in ("sum", "prod") else sdt
        # reduce_split: boxes take turns among several accumulators, so consecutive
        # boxes do not wait on each other; the partials are combined after the last
        split = self.tiles.reduce_split if op in COMBINE else 1
        step = 0 if first else self.reduce_steps[red.id] + 1
        self.reduce_steps[red.id] = step
        part = step % split
        name = f"acc{red.id}" if part == 0 else f"acc{red.id}_{part}"
        out = Tile(self.buffer(name, adt, cap), kept)
        self.emit(op, out, src, acc=int(step >= split), axes=axes)
        if not last:
            return None
        out = Tile(self.buffer(f"acc{red.id}", adt, cap), kept)
        for other in range(1, min(split, step + 1)):
            partial = Tile(self.buffer(f"acc{red.id}_{other}", adt, cap), kept)
            self.emit(COMBINE[op], out, out, partial)
        if red.op == "mean":
            count = math.prod(g.shape[a] for a in axes)
            mean = Tile(self.buffer(f"mean{red.id}", adt, cap), kept)
            self.emit("div", mean, out, rounded_imm(count, adt))
            out = mean
        if adt != red.dtype:
            cast = Tile(self.buffer(f"v{red.id}", red.dtype, cap), kept)
            self.emit("cast", cast, out)
            out = cast
        shape = tuple(1 if a in axes else d for a, d in enumerate(g.shape))
        at = tuple(0 if a in axes else o for a, o in enumerate(origin))
        self.store(red.id, out, at, kept, shape=shape)
        return out

    def transpose(self, g: Group) -> None:
        node = g.node
        src = node.inputs[0]
        perm = tuple(node.attr("perm"))
        box = fit_transpose(node.shape, perm, self.tiles.vector)
        in_box = [0] * len(perm)
        for i, p in enumerate(perm):
            in_box[p] = box[i]
        for origin, extent, _, _ in iter_boxes(node.shape, box):
            at, ext = [0] * len(perm), [0] * len(perm)
            for i, p in enumerate(perm):
                at[p], ext[p] = origin[i], extent[i]
            tile = self.tile(src, f"in{src}_g{g.index}", at, ext, in_box)
            out = Tile(self.buffer(f"v{node.id}", node.dtype, box), extent)
            self.emit("transpose", out, tile, perm=perm)
            self.store(node.id, out, origin, extent)

    def copy(self, g: Group) -> None:
        node = g.node
        box = fit_box(node.shape, self.tiles.vector)
        for origin, extent, _, _ in iter_boxes(node.shape, box):
            tile = self.tile(node.id, f"in{node.id}_g{g.index}", origin, extent, box)
            self.store(node.id, tile, origin, extent, dest=g.dest or self.home[node.id])

    def concat(self, g: Group) -> None:
        node = g.node
        axis = node.attr("axis")
        start = 0
        for src in node.inputs:
            shape = self.graph.node(src).shape
            box = fit_box(shape, self.tiles.vector)
            for origin, extent, _, _ in iter_boxes(shape, box):
                tile = self.tile(src, f"in{src}_g{g.index}", origin, extent, box)
                at = tuple(o + start if a == axis else o for a, o in enumerate(origin))
                self.store(node.id, tile, at, extent)
            start += shape[axis]

    def pad(self, g: Group) -> None:
        """Zero the border of the padded conv input, then copy the input into its middle."""
        conv = g.node
        x = self.graph.node(conv.inputs[0])
        n, h, w, c = x.shape
        ph, pw = conv.attr("padding")
        name = self.pads[conv.id]
        strides = contiguous_strides((n, h + 2 * ph, w + 2 * pw, c))
        regions = [
            ((0, 0, 0, 0), (n, ph, w + 2 * pw, c)),
            ((0, ph + h, 0, 0), (n, ph, w + 2 * pw, c)),
            ((0, ph, 0, 0), (n, h, pw, c)),
            ((0, ph, pw + w, 0), (n, h, pw, c)),
        ]
        boxes = []
        for start, shape in regions:
            for origin, extent, _, _ in iter_boxes(shape, fit_box(shape, self.tiles.vector)):
                boxes.append((tuple(s + o for s, o in zip(start, origin, strict=True)), extent))
        if boxes:
            cap = max(math.prod(e) for _, e in boxes)
            zero = Tile(self.buffer(f"zero{conv.id}", x.dtype, (cap,)), (cap,))
            self.emit("fill", zero, rounded_imm(0, x.dtype))
            for origin, extent in boxes:
                offset = sum(o * s for o, s in zip(origin, strides, strict=True))
                view = compact_view(View(name, offset, extent, strides))
                self.emit("store", view, Tile(zero.buf, extent))
        box = fit_box(x.shape, self.tiles.vector)
        for origin, extent, _, _ in iter_boxes(x.shape, box):
            tile = self.tile(x.id, f"in{x.id}_g{g.index}", origin, extent, box)
            at = (origin[0], origin[1] + ph, origin[2] + pw, origin[3])
            offset = sum(o * s for o, s in zip(at, strides, strict=True))
            self.emit("store", compact_view(View(name, offset, extent, strides)), tile)

    # -- producers ---------------------------------------------------------------
    def finish(self, node: Node, acc: Tile, extent, box) -> Tile:
        """The producer's value as a box-shaped tile of its own dtype."""
        if self.buffers[acc.buf].dtype == node.dtype:
            return Tile(acc.buf, tuple(extent))
        out = Tile(self.buffer(f"v{node.id}", node.dtype, box), tuple(extent))
        self.emit("cast", out, Tile(acc.buf, tuple(extent)))
        return out

    def matmul(self, node: Node, origin, extent, box) -> Tile:
        a, b = node.inputs
        k = self.graph.node(a).shape[-1]
        (bm, bn), (cm, cn) = extent[-2:], box[-2:]
        lead, ones = tuple(origin[:-2]), (1,) * (len(origin) - 2)
        m0, n0 = origin[-2:]
        acc = Tile(self.buffer(f"acc{node.id}", visa.acc_dtype(node.dtype), (cm, cn)), (bm, bn))
        tk = max(1, min(self.tiles.k, k))
        for k0 in range(0, k, tk):
            bk = min(tk, k - k0)
            va = self.view(a, lead + (m0, k0), ones + (bm, bk))
            vb = self.view(b, lead + (k0, n0), ones + (bk, bn))
            ta = self.operand(a, f"lhs{node.id}", va, (bm, bk), (cm, tk))
            tb = self.operand(b, f"rhs{node.id}", vb, (bk, bn), (tk, cn))
            self.emit("mma", acc, ta, tb, acc=int(k0 > 0))
        if k == 0:
            self.emit("fill", acc, rounded_imm(0, visa.acc_dtype(node.dtype)))
        return self.finish(node, acc, extent, box)

    def conv2d(self, node: Node, origin, extent, box) -> Tile:
        x, w = node.inputs
        kh, kw, c, _ = self.graph.node(w).shape
        (sh, sw), (dh, dw) = node.attr("stride"), node.attr("dilation")
        n, oh0, ow0, f0 = origin
        _, rows, owb, fb = extent
        cap_m, cap_n = box[1] * box[2], box[3]
        xref = self.plan.loc[x]
        if node.id in self.pads:
            _, hh, ww, cc = self.graph.node(x).shape
            ph, pw = node.attr("padding")
            xt, xoff, xs = (
                self.pads[node.id],
                0,
                contiguous_strides((1, hh + 2 * ph, ww + 2 * pw, cc)),
            )
        elif isinstance(xref, DramRef):
            xt, xoff, xs = self.home[xref.base], xref.offset, xref.strides
        acc = Tile(
            self.buffer(f"acc{node.id}", visa.acc_dtype(node.dtype), (cap_m, cap_n)),
            (rows * owb, fb),
        )
        tk = max(1, min(self.tiles.k, c))
        first = True
        for i, j, c0 in product(range(kh), range(kw), range(0, c, tk)):
            bc = min(tk, c - c0)
            va = None
            if node.id in self.pads or isinstance(xref, DramRef):
                off = xoff + n * xs[0] + (oh0 * sh + i * dh) * xs[1]
                off += (ow0 * sw + j * dw) * xs[2] + c0 * xs[3]
                strides = (sh * xs[1], sw * xs[2], xs[3])
                va = compact_view(View(xt, off, (rows, owb, bc), strides))
            vb = self.view(w, (i, j, c0, f0), (1, 1, bc, fb))
            ta = self.operand(x, f"lhs{node.id}", va, (rows * owb, bc), (cap_m, tk))
            tb = self.operand(w, f"rhs{node.id}", vb, (bc, fb), (tk, cap_n))
            self.emit("mma", acc, ta, tb, acc=int(not first))
            first = False
        return self.finish(node, acc, extent, box)


_PRODUCE = {"matmul": Emitter.matmul, "conv2d": Emitter.conv2d}
EMIT = {
    "fused": Emitter.fused,
    "transpose": Emitter.transpose,
    "copy": Emitter.copy,
    "pad": Emitter.pad,
    "concat": Emitter.concat,
}
