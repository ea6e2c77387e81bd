"""Stage 1: graph -> vISA (tiled program over virtual tile buffers).

Planning walks the graph once and puts every computing node into a group:
a fused group (an optional matmul/conv producer, a chain of same-shaped
elementwise nodes, an optional reduction at the end), a transpose, a copy
(materializing a view or a result) or a conv padding. Emission then tiles
each group's iteration space into boxes and unrolls it: loads of external
inputs, the chain on resident tiles, stores of the values needed elsewhere.
Broadcasts and contiguous reshapes are DRAM views (stride 0 on broadcast
axes), scalar constants are immediates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path

import numpy as np

from kiln.errors import ArtifactError, Location, StageError, VerifyError
from kiln.fsutil import write_bytes_atomic
from kiln.ir import visa
from kiln.ir.edf import gc_paused
from kiln.ir.graph import Graph, Node
from kiln.ir.interp import NUMPY_DTYPES
from kiln.ir.ops import OPS as GRAPH_OPS
from kiln.ir.visa import Imm, Tile, View

NAME = "visa"
ARTIFACT = "kernel.visa"


@dataclass(frozen=True)
class Options:
    tile_m: int = 0  # matmul rows per tile; 0: a multiple of the machine's tensor tile
    tile_n: int = 0
    tile_k: int = 0
    vector_tile: int = 0  # elements per vector tile; 0: from vector lanes and SRAM
    fusion: bool = True  # run elementwise chains on resident tiles


@dataclass(frozen=True)
class _Tiles:
    m: int
    n: int
    k: int
    vector: int


def _tiles(options: Options, machine: dict) -> _Tiles:
    """Tile sizes: options win; else the largest of 4x/2x/1x the machine tile that fits."""
    for key in ("tile_m", "tile_n", "tile_k", "vector_tile"):
        if getattr(options, key) < 0:
            raise StageError(f"option {key!r} of stage 'visa' must be >= 0")
    tm, tn, tk = (int(d) for d in machine.get("tensor", {}).get("tile", (32, 32, 32)))
    sram = int(machine.get("sram_bytes", 1 << 20))
    f = 4
    while f > 1 and 4 * f * f * (2 * (tm * tk + tk * tn) + 2 * tm * tn) > sram // 2:
        f //= 2
    lanes = int(machine.get("vector", {}).get("lanes", 64))
    vector = options.vector_tile or max(lanes, min(lanes * 64, sram // 256))
    return _Tiles(
        options.tile_m or tm * f, options.tile_n or tn * f, options.tile_k or tk * f, vector
    )


def _contig(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def _is_contig(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    return all(d == 1 or s == c for d, s, c in zip(shape, strides, _contig(shape), strict=True))


def _fit(shape: tuple[int, ...], budget: int) -> tuple[int, ...]:
    """A box of at most ``budget`` elements, filled from the last axis."""
    box = []
    for d in reversed(shape):
        b = max(1, min(d, budget))
        box.append(b)
        budget = max(1, budget // b)
    return tuple(reversed(box))


def _boxes(shape: tuple[int, ...], box: tuple[int, ...], inner: tuple[int, ...] = ()):
    """Yield (origin, extent, first, last); ``inner`` axes vary fastest, first/last along them."""
    outer = [a for a in range(len(shape)) if a not in inner]
    steps = {a: range(0, shape[a], box[a]) for a in range(len(shape))}
    inner_list = list(product(*(steps[a] for a in inner)))
    for out in product(*(steps[a] for a in outer)):
        for j, inn in enumerate(inner_list):
            origin = [0] * len(shape)
            for a, o in zip(outer + list(inner), out + inn, strict=True):
                origin[a] = o
            extent = tuple(min(box[a], shape[a] - origin[a]) for a in range(len(shape)))
            yield tuple(origin), extent, j == 0, j == len(inner_list) - 1


def _compact(view: View) -> View:
    """Drop size-1 dims and merge dims that are contiguous with each other."""
    dims = [(d, s) for d, s in zip(view.shape, view.strides, strict=True) if d != 1]
    merged: list[tuple[int, int]] = []
    for d, s in dims:
        if merged and merged[-1][1] == d * s:
            merged[-1] = (merged[-1][0] * d, s)
        else:
            merged.append((d, s))
    return View(view.tensor, view.offset, tuple(d for d, _ in merged), tuple(s for _, s in merged))


def _imm(value, dtype: str) -> Imm:
    """An immediate rounded to ``dtype`` as the interpreter rounds const nodes."""
    rounded = np.asarray(value).astype(NUMPY_DTYPES[dtype]).item()
    if dtype in visa.FLOAT_DTYPES:
        return Imm(float(rounded), dtype)
    return Imm(int(rounded) if dtype == "i32" else bool(rounded), dtype)


@dataclass(frozen=True)
class _Ref:
    """Elements of node ``base``'s contiguous DRAM data: offset and strides per dim."""

    base: int
    offset: int
    strides: tuple[int, ...]


@dataclass
class _Group:
    """A unit of emission. A fused group runs its members box by box on resident tiles.

    Its reductions share ``axes``. When every box spans those axes whole
    (``resident``), a reduction's result is complete inside the box, so later
    members may use it: ops on the kept shape, and ops on the full shape
    through in-group broadcasts (``aliases``). Otherwise the reduction
    accumulates across boxes and closes the group.
    """

    index: int
    kind: str  # fused | transpose | copy | pad
    shape: tuple[int, ...]
    producer: Node | None = None
    members: list[Node] = field(default_factory=list)  # elementwise ops and reductions, in order
    axes: tuple[int, ...] | None = None
    resident: bool = False
    aliases: dict[int, int] = field(default_factory=dict)  # broadcast node -> member it repeats
    node: Node | None = None  # transpose / copy / pad subject
    dest: str | None = None  # copy into this tensor (None: the node's home)

    @property
    def kept(self) -> tuple[int, ...]:
        axes = self.axes or ()
        return tuple(1 if a in axes else d for a, d in enumerate(self.shape))

    def accepts(self, shape: tuple[int, ...]) -> bool:
        """Can an elementwise op of this shape run in this group?"""
        if self.kind != "fused":
            return False
        if shape == self.shape:
            return self.axes is None or self.resident
        return self.resident and shape == self.kept

    def defines(self) -> list[Node]:
        found = [self.producer, *self.members]
        if self.kind in ("transpose", "copy") and self.dest is None:
            found.append(self.node)
        return [n for n in found if n is not None]


_ELEMENTWISE = ("unary", "binary", "compare", "select", "cast")


class _Planner:
    """Pass 1: groups in emission order, the location of every value, fusion decisions."""

    def __init__(self, graph: Graph, fusion: bool, tiles: _Tiles):
        self.graph = graph
        self.fusion = fusion
        self.tiles = tiles
        self.groups: list[_Group] = []
        self.group_of: dict[int, _Group] = {}
        self.loc: dict[int, _Ref | Imm] = {}
        self.avail: dict[int, int] = {}  # node -> index of the group that makes its data
        self.copies: dict[int, _Group] = {}  # view node -> the group materializing it
        for node in graph.nodes:
            kind = GRAPH_OPS[node.op].kind if node.op in GRAPH_OPS else None
            handler = _PLAN.get(node.op) or _PLAN.get(kind)
            if handler is None:
                raise StageError(
                    f"kernel {graph.name}: the visa stage cannot lower op {node.op!r} "
                    f"(node {node.id})"
                )
            handler(self, node)

    def new(self, kind: str, shape: tuple[int, ...], **kw) -> _Group:
        group = _Group(len(self.groups), kind, shape, **kw)
        self.groups.append(group)
        return group

    def computed(self, node: Node, group: _Group) -> None:
        self.group_of[node.id] = group
        self.loc[node.id] = _Ref(node.id, 0, _contig(node.shape))
        self.avail[node.id] = group.index

    def arg(self, node: Node) -> None:
        self.loc[node.id] = _Ref(node.id, 0, _contig(node.shape))
        self.avail[node.id] = -1

    def const(self, node: Node) -> None:
        self.loc[node.id] = _imm(node.attr("value"), node.dtype)
        self.avail[node.id] = -1

    def broadcast(self, node: Node) -> None:
        src = self.graph.node(node.inputs[0])
        ref = self.loc[src.id]
        self.avail[node.id] = self.avail[src.id]
        if isinstance(ref, Imm):
            self.loc[node.id] = ref
            return
        lead = node.type.rank - src.type.rank
        strides = [0] * lead + [
            s if d == o else 0
            for d, o, s in zip(src.shape, node.shape[lead:], ref.strides, strict=True)
        ]
        self.loc[node.id] = _Ref(ref.base, ref.offset, tuple(strides))
        group = self.group_of.get(src.id)
        if (
            self.fusion
            and group is not None
            and group.resident
            and src.id not in group.aliases
            and src.shape == group.kept
            and node.shape == group.shape
        ):  # a reduction's result repeated over the rows it reduced: stays on its tile
            group.aliases[node.id] = src.id
            self.group_of[node.id] = group

    def reshape(self, node: Node) -> None:
        src = self.graph.node(node.inputs[0])
        ref = self.loc[src.id]
        self.avail[node.id] = self.avail[src.id]
        if isinstance(ref, Imm):
            self.loc[node.id] = ref
            return
        if not _is_contig(src.shape, ref.strides):  # materialize the view first
            if src.id not in self.copies:
                self.copies[src.id] = self.new("copy", src.shape, node=src)
            ref = _Ref(src.id, 0, _contig(src.shape))
            self.avail[node.id] = self.copies[src.id].index
        self.loc[node.id] = _Ref(ref.base, ref.offset, _contig(node.shape))

    def transpose(self, node: Node) -> None:
        self.computed(node, self.new("transpose", node.shape, node=node))

    def elementwise(self, node: Node) -> None:
        group = self._join_target(node) if self.fusion else None
        if group is None:
            group = self.new("fused", node.shape)
        group.members.append(node)
        self.computed(node, group)

    def _join_target(self, node: Node) -> _Group | None:
        open_groups = [
            g
            for i in node.inputs
            if (g := self.group_of.get(i)) is not None and g.accepts(node.shape)
        ]
        if not open_groups:
            return None
        target = max(open_groups, key=lambda g: g.index)
        for i in node.inputs:
            if self.group_of.get(i) is not target and self.avail[i] >= target.index:
                return None
        return target

    def reduce(self, node: Node) -> None:
        src = self.graph.node(node.inputs[0])
        axes = tuple(node.attr("axes"))
        group = self.group_of.get(src.id)
        fusable = (
            self.fusion
            and group is not None
            and group.kind == "fused"
            and src.id not in group.aliases
            and src.shape == group.shape
            and (group.axes is None or (group.resident and group.axes == axes))
        )
        if not fusable:
            group = self.new("fused", src.shape)
        if group.axes is None:
            group.axes = axes
            if group.producer is not None:
                box = _producer_box(group.producer, self.tiles)
                group.resident = all(box[a] == group.shape[a] for a in axes)
            else:
                group.resident = math.prod(group.shape[a] for a in axes) <= self.tiles.vector
        group.members.append(node)
        self.computed(node, group)

    def producer(self, node: Node) -> None:
        if node.op == "conv2d" and any(node.attr("padding")):
            self.new("pad", (), node=node)
        self.computed(node, self.new("fused", node.shape, producer=node))


_PLAN = {
    "arg": _Planner.arg,
    "const": _Planner.const,
    "broadcast": _Planner.broadcast,
    "reshape": _Planner.reshape,
    "transpose": _Planner.transpose,
    "reduce": _Planner.reduce,
    "matmul": _Planner.producer,
    "conv2d": _Planner.producer,
    **{kind: _Planner.elementwise for kind in _ELEMENTWISE},
}


def _homes(plan: _Planner) -> tuple[list[visa.DramTensor], dict[int, str], dict[int, str]]:
    """Pass 2: a DRAM tensor for every argument, result, stored value and conv padding."""
    graph = plan.graph
    tensors: list[visa.DramTensor] = []
    home: dict[int, str] = {}
    taken: set[str] = set()

    def add(name: str, role: str, shape: tuple[int, ...], dtype: str) -> str:
        while name in taken:
            name += "_"
        taken.add(name)
        tensors.append(visa.DramTensor(name, role, tuple(shape), dtype))
        return name

    for a in graph.args:
        home[a.id] = add(str(a.attr("name") or f"arg{a.attr('index')}"), "input", a.shape, a.dtype)
    defined = {n.id for g in plan.groups for n in g.defines()}
    for i, oid in enumerate(graph.outputs):
        node = graph.node(oid)
        name = add(f"out{i}", "output", node.shape, node.dtype)
        ref = plan.loc[oid]
        if (
            isinstance(ref, _Ref)
            and ref.offset == 0
            and _is_contig(node.shape, ref.strides)
            and ref.base in defined
            and ref.base not in home
        ):
            home[ref.base] = name
        else:
            plan.groups.append(_Group(len(plan.groups), "copy", node.shape, node=node, dest=name))
    users = graph.users()
    outputs = set(graph.outputs)

    def used_outside(g: _Group, nid: int) -> bool:
        return any(
            plan.group_of.get(u) is not g or (u in g.aliases and used_outside(g, u))
            for u in users[nid]
        )

    pads: dict[int, str] = {}
    for g in plan.groups:
        if g.kind == "pad":
            n, h, w, c = graph.node(g.node.inputs[0]).shape
            ph, pw = g.node.attr("padding")
            shape = (n, h + 2 * ph, w + 2 * pw, c)
            pads[g.node.id] = add(f"pad{g.node.id}", "scratch", shape, g.node.dtype)
        for node in g.defines():
            needed = g.kind != "fused" or used_outside(g, node.id) or node.id in outputs
            if needed and node.id not in home:
                home[node.id] = add(f"t{node.id}", "scratch", node.shape, node.dtype)
    return tensors, home, pads


def _producer_box(node: Node, t: _Tiles) -> tuple[int, ...]:
    """The output box of one matmul/conv tile: tile_m x tile_n (conv: whole output rows)."""
    if node.op == "matmul":
        m, n = node.shape[-2:]
        return (1,) * (node.type.rank - 2) + (min(t.m, m), min(t.n, n))
    _, oh, ow, f = node.shape
    if ow <= t.m:
        return (1, min(oh, max(1, t.m // ow)), ow, min(t.n, f))
    return (1, 1, t.m, min(t.n, f))


def _fit_rows(shape: tuple[int, ...], axes: tuple[int, ...], budget: int) -> tuple[int, ...]:
    """A box spanning the reduced ``axes`` whole, the rest filled from the last axis."""
    box = [shape[a] if a in axes else 1 for a in range(len(shape))]
    rest = max(1, budget // max(1, math.prod(box)))
    for a in reversed(range(len(shape))):
        if a not in axes:
            box[a] = max(1, min(shape[a], rest))
            rest = max(1, rest // box[a])
    return tuple(box)


def _fit_transpose(shape: tuple[int, ...], perm: tuple[int, ...], budget: int) -> tuple[int, ...]:
    """A box that is wide along both the output's and the input's last axis."""
    rank = len(shape)
    a, b = rank - 1, perm.index(rank - 1) if rank else 0
    if rank < 2 or a == b:
        return _fit(shape, budget)
    box = [1] * rank
    box[a] = min(shape[a], max(1, math.isqrt(budget)))
    box[b] = min(shape[b], max(1, budget // box[a]))
    box[a] = min(shape[a], max(1, budget // box[b]))
    rest = max(1, budget // (box[a] * box[b]))
    for axis in reversed(range(rank)):
        if axis not in (a, b):
            box[axis] = max(1, min(shape[axis], rest))
            rest = max(1, rest // box[axis])
    return tuple(box)


class _Emitter:
    """Pass 3: unrolled instructions and the buffers they use."""

    def __init__(self, plan: _Planner, tiles: _Tiles, home: dict[int, str], pads: dict[int, str]):
        self.plan = plan
        self.graph = plan.graph
        self.tiles = tiles
        self.home = home
        self.pads = pads
        self.instrs: list[visa.Instr] = []
        self.buffers: dict[str, visa.Buffer] = {}
        self.loaded: dict[str, tuple] = {}  # buffer -> (source, shape) it holds unchanged

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

    def view(self, nid: int, origin, extent) -> View | None:
        """The DRAM view of a box of node ``nid`` (None for an immediate)."""
        ref = self.plan.loc[nid]
        if isinstance(ref, Imm):
            return None
        offset = ref.offset + sum(o * s for o, s in zip(origin, ref.strides, strict=True))
        return _compact(View(self.home[ref.base], offset, tuple(extent), ref.strides))

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
        strides = _contig(shape if shape is not None else self.graph.node(nid).shape)
        offset = sum(o * s for o, s in zip(origin, strides, strict=True))
        self.emit("store", _compact(View(tensor, offset, tuple(extent), strides)), tile)

    def value(self, g: _Group, nid: int, vals: dict, origin, extent, box, need_tile=False):
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
    def fused(self, g: _Group) -> None:
        axes = g.axes or ()
        if g.producer is not None:
            box = _producer_box(g.producer, self.tiles)
        elif g.resident:
            box = _fit_rows(g.shape, axes, self.tiles.vector)
        else:
            box = _fit(g.shape, self.tiles.vector)
        kept_box = tuple(1 if a in axes else b for a, b in enumerate(box))
        for origin, extent, first, last in _boxes(g.shape, box, axes):
            rows = (
                tuple(0 if a in axes else o for a, o in enumerate(origin)),
                tuple(1 if a in axes else e for a, e in enumerate(extent)),
                kept_box,
            )
            vals: dict[int, Tile | Imm] = {}
            if g.producer is not None:
                p = g.producer
                vals[p.id] = _PRODUCE[p.op](self, p, origin, extent, box)
                self.store(p.id, vals[p.id], origin, extent)
            for m in g.members:
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

    def reduce_step(self, g: _Group, red: Node, axes, vals, where, first, last) -> Tile | None:
        """Reduce one box into the accumulator; after the last box, finish and store."""
        origin, extent, box = where
        src = self.value(g, red.inputs[0], vals, origin, extent, box, need_tile=True)
        kept = tuple(1 if a in axes else e for a, e in enumerate(extent))
        cap = tuple(1 if a in axes else b for a, b in enumerate(box))
        op = "sum" if red.op == "mean" else red.op
        sdt = self.graph.node(red.inputs[0]).dtype
        adt = visa.acc_dtype(sdt) if op == "sum" else sdt
        out = Tile(self.buffer(f"acc{red.id}", adt, cap), kept)
        self.emit(op, out, src, acc=int(not first), axes=axes)
        if not last:
            return None
        if red.op == "mean":
            count = math.prod(g.shape[a] for a in axes)
            mean = Tile(self.buffer(f"mean{red.id}", adt, cap), kept)
            self.emit("div", mean, out, _imm(count, adt))
            out = mean
        if adt != red.dtype:
            cast = Tile(self.buffer(f"v{red.id}", red.dtype, cap), kept)
            self.emit("cast", cast, out)
            out = cast
        shape = tuple(1 if a in axes else d for a, d in enumerate(g.shape))
        at = tuple(0 if a in axes else o for a, o in enumerate(origin))
        self.store(red.id, out, at, kept, shape=shape)
        return out

    def transpose(self, g: _Group) -> None:
        node = g.node
        src = node.inputs[0]
        perm = tuple(node.attr("perm"))
        box = _fit_transpose(node.shape, perm, self.tiles.vector)
        in_box = [0] * len(perm)
        for i, p in enumerate(perm):
            in_box[p] = box[i]
        for origin, extent, _, _ in _boxes(node.shape, box):
            at, ext = [0] * len(perm), [0] * len(perm)
            for i, p in enumerate(perm):
                at[p], ext[p] = origin[i], extent[i]
            tile = self.tile(src, f"in{src}_g{g.index}", at, ext, in_box)
            out = Tile(self.buffer(f"v{node.id}", node.dtype, box), extent)
            self.emit("transpose", out, tile, perm=perm)
            self.store(node.id, out, origin, extent)

    def copy(self, g: _Group) -> None:
        node = g.node
        box = _fit(node.shape, self.tiles.vector)
        for origin, extent, _, _ in _boxes(node.shape, box):
            tile = self.tile(node.id, f"in{node.id}_g{g.index}", origin, extent, box)
            self.store(node.id, tile, origin, extent, dest=g.dest or self.home[node.id])

    def pad(self, g: _Group) -> None:
        """Zero the border of the padded conv input, then copy the input into its middle."""
        conv = g.node
        x = self.graph.node(conv.inputs[0])
        n, h, w, c = x.shape
        ph, pw = conv.attr("padding")
        name = self.pads[conv.id]
        strides = _contig((n, h + 2 * ph, w + 2 * pw, c))
        regions = [
            ((0, 0, 0, 0), (n, ph, w + 2 * pw, c)),
            ((0, ph + h, 0, 0), (n, ph, w + 2 * pw, c)),
            ((0, ph, 0, 0), (n, h, pw, c)),
            ((0, ph, pw + w, 0), (n, h, pw, c)),
        ]
        boxes = []
        for start, shape in regions:
            for origin, extent, _, _ in _boxes(shape, _fit(shape, self.tiles.vector)):
                boxes.append((tuple(s + o for s, o in zip(start, origin, strict=True)), extent))
        if boxes:
            cap = max(math.prod(e) for _, e in boxes)
            zero = Tile(self.buffer(f"zero{conv.id}", x.dtype, (cap,)), (cap,))
            self.emit("fill", zero, _imm(0, x.dtype))
            for origin, extent in boxes:
                offset = sum(o * s for o, s in zip(origin, strides, strict=True))
                view = _compact(View(name, offset, extent, strides))
                self.emit("store", view, Tile(zero.buf, extent))
        box = _fit(x.shape, self.tiles.vector)
        for origin, extent, _, _ in _boxes(x.shape, box):
            tile = self.tile(x.id, f"in{x.id}_g{g.index}", origin, extent, box)
            at = (origin[0], origin[1] + ph, origin[2] + pw, origin[3])
            offset = sum(o * s for o, s in zip(at, strides, strict=True))
            self.emit("store", _compact(View(name, offset, extent, strides)), tile)

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
            self.emit("fill", acc, _imm(0, visa.acc_dtype(node.dtype)))
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
            xt, xoff, xs = self.pads[node.id], 0, _contig((1, hh + 2 * ph, ww + 2 * pw, cc))
        elif isinstance(xref, _Ref):
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
            if node.id in self.pads or isinstance(xref, _Ref):
                off = xoff + n * xs[0] + (oh0 * sh + i * dh) * xs[1]
                off += (ow0 * sw + j * dw) * xs[2] + c0 * xs[3]
                strides = (sh * xs[1], sw * xs[2], xs[3])
                va = _compact(View(xt, off, (rows, owb, bc), strides))
            vb = self.view(w, (i, j, c0, f0), (1, 1, bc, fb))
            ta = self.operand(x, f"lhs{node.id}", va, (rows * owb, bc), (cap_m, tk))
            tb = self.operand(w, f"rhs{node.id}", vb, (bc, fb), (tk, cap_n))
            self.emit("mma", acc, ta, tb, acc=int(not first))
            first = False
        return self.finish(node, acc, extent, box)


_PRODUCE = {"matmul": _Emitter.matmul, "conv2d": _Emitter.conv2d}
_EMIT = {
    "fused": _Emitter.fused,
    "transpose": _Emitter.transpose,
    "copy": _Emitter.copy,
    "pad": _Emitter.pad,
}


# -- stage protocol -----------------------------------------------------------------


def run(graph: Graph, options: Options, machine: dict) -> visa.Program:
    """Lower a traced graph to a tiled vISA program for ``machine``."""
    with gc_paused():  # many small long-lived records: collector passes find nothing
        return _run(graph, options, machine)


def _run(graph: Graph, options: Options, machine: dict) -> visa.Program:
    tiles = _tiles(options, machine)
    plan = _Planner(graph, options.fusion, tiles)
    tensors, home, pads = _homes(plan)
    emitter = _Emitter(plan, tiles, home, pads)
    for group in plan.groups:
        _EMIT[group.kind](emitter, group)
    return visa.Program(
        kernel=graph.name,
        bindings=tuple(graph.bindings),
        tensors=tuple(tensors),
        buffers=tuple(emitter.buffers.values()),
        instrs=tuple(emitter.instrs),
    )


def serialize(program: visa.Program) -> bytes:
    return visa.print_program(program).encode()


def read(path: str | Path) -> visa.Program:
    """Parse a vISA text artifact (or a hand-edited dump)."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"cannot read vISA artifact: {exc}", Location(str(path))) from None
    try:
        return visa.parse(text)
    except visa.VisaParseError as exc:
        raise ArtifactError(
            f"malformed vISA at line {exc.line}",
            location=Location(str(path), exc.line, source=exc.source),
            expected=exc.expected,
            found=exc.found,
        ) from None


def verify(program: visa.Program, machine: dict) -> None:
    try:
        visa.verify(program)
    except visa.VisaError as exc:
        raise VerifyError(f"stage visa: kernel {program.kernel}: {exc}") from None


def _dump_text(program: visa.Program, path: str | Path, machine: dict) -> None:
    write_bytes_atomic(path, serialize(program))


DUMPS = {"visa": _dump_text}
