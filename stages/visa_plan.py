"""Planning for the visa stage: tile sizes, groups of fusable nodes, DRAM homes.

The planner walks the traced graph once and puts every computing node into
a group (a fused chain with an optional matmul/conv producer and an optional
reduction, a transpose, a copy or a conv padding); ``dram_homes`` then gives
every value that lives in DRAM its tensor. Used by stages/visa.py.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from itertools import product
from typing import TYPE_CHECKING

import numpy as np

from kiln.errors import StageError
from kiln.ir import visa
from kiln.ir.graph import Graph, Node
from kiln.ir.interp import NUMPY_DTYPES
from kiln.ir.ops import OPS as GRAPH_OPS
from kiln.ir.visa import Imm, View

if TYPE_CHECKING:
    from kiln.stages.visa import Options


@dataclass(frozen=True)
class TileSizes:
    m: int
    n: int
    k: int
    vector: int
    order: str = "mn"  # the order a contraction's output tiles are visited (nm: columns first)
    reduce_split: int = 1  # accumulators a long reduction alternates between


TILE_ORDERS = ("mn", "nm")
MAX_REDUCE_SPLIT = 8  # each accumulator holds a tile of SRAM


def tile_sizes(options: Options, machine: dict) -> TileSizes:
    """Tile sizes: options win; else the largest of 4x/2x/1x the machine tile that fits."""
    for key in ("tile_m", "tile_n", "tile_k", "vector_tile"):
        if getattr(options, key) < 0:
            raise StageError(f"option {key!r} of stage 'visa' must be >= 0")
    if not 1 <= options.reduce_split <= MAX_REDUCE_SPLIT:
        raise StageError(
            f"option 'reduce_split' of stage 'visa' must be between 1 and {MAX_REDUCE_SPLIT}, "
            f"not {options.reduce_split}"
        )
    if options.tile_order not in TILE_ORDERS:
        raise StageError(
            f"option 'tile_order' of stage 'visa' must be one of {', '.join(TILE_ORDERS)}, "
            f"not {options.tile_order!r}"
        )
    tm, tn, tk = (int(d) for d in machine.get("tensor", {}).get("tile", (32, 32, 32)))
    sram = int(machine.get("sram_bytes", 1 << 20))
    f = 4
    while f > 1 and 4 * f * f * (2 * (tm * tk + tk * tn) + 2 * tm * tn) > sram // 2:
        f //= 2
    lanes = int(machine.get("vector", {}).get("lanes", 64))
    vector = options.vector_tile or max(lanes, min(lanes * 64, sram // 256))
    return TileSizes(
        options.tile_m or tm * f,
        options.tile_n or tn * f,
        options.tile_k or tk * f,
        vector,
        options.tile_order,
        options.reduce_split,
    )


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def _is_contig(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    return all(
        d == 1 or s == c for d, s, c in zip(shape, strides, contiguous_strides(shape), strict=True)
    )


def fit_box(shape: tuple[int, ...], budget: int) -> tuple[int, ...]:
    """A box of at most ``budget`` elements, filled from the last axis."""
    box = []
    for d in reversed(shape):
        b = max(1, min(d, budget))
        box.append(b)
        budget = max(1, budget // b)
    return tuple(reversed(box))


def iter_boxes(
    shape: tuple[int, ...], box: tuple[int, ...], inner: tuple[int, ...] = (), order: str = "mn"
):
    """Yield (origin, extent, first, last); ``inner`` axes vary fastest, first/last along them.

    ``order="nm"`` visits the last two outer axes column by column instead of row by row.
    """
    outer = [a for a in range(len(shape)) if a not in inner]
    last_two = [len(shape) - 2, len(shape) - 1]
    if order == "nm" and len(shape) >= 2 and outer[-2:] == last_two:
        outer[-2:] = outer[-2:][::-1]
    steps = {a: range(0, shape[a], box[a]) for a in range(len(shape))}
    inner_list = list(product(*(steps[a] for a in inner)))
    for out in product(*(steps[a] for a in outer)):
        for j, inn in enumerate(inner_list):
            origin = [0] * len(shape)
            for a, o in zip(outer + list(inner), out + inn, strict=True):
                origin[a] = o
            extent = tuple(min(box[a], shape[a] - origin[a]) for a in range(len(shape)))
            yield tuple(origin), extent, j == 0, j == len(inner_list) - 1


def compact_view(view: View) -> View:
    """Drop size-1 dims and merge dims that are contiguous with each other."""
    shape, strides = _compact(view.shape, view.strides)
    return View(view.tensor, view.offset, shape, strides)


@functools.lru_cache(maxsize=4096)
def _compact(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[tuple, tuple]:
    # memoized: a large kernel's views repeat a few (shape, strides) at many offsets
    dims = [(d, s) for d, s in zip(shape, strides, strict=True) if d != 1]
    merged: list[tuple[int, int]] = []
    for d, s in dims:
        if merged and merged[-1][1] == d * s:
            merged[-1] = (merged[-1][0] * d, s)
        else:
            merged.append((d, s))
    return tuple(d for d, _ in merged), tuple(s for _, s in merged)


def rounded_imm(value, dtype: str) -> Imm:
    """An immediate rounded to ``dtype`` as the interpreter rounds const nodes."""
    with np.errstate(over="ignore", invalid="ignore"):  # 70000.0 in f16 is inf, as in the graph
        rounded = np.asarray(value).astype(NUMPY_DTYPES[dtype]).item()
    if dtype in visa.FLOAT_DTYPES:
        return Imm(float(rounded), dtype)
    return Imm(int(rounded) if dtype == "i32" else bool(rounded), dtype)


@dataclass(frozen=True)
class DramRef:
    """Elements of node ``base``'s contiguous DRAM data: offset and strides per dim."""

    base: int
    offset: int
    strides: tuple[int, ...]


@dataclass
class Group:
    """A unit of emission. A fused group runs its members box by box on resident tiles.

    Its reductions share ``axes``. When every box spans those axes whole
    (``resident``), a reduction's result is complete inside the box, so later
    members may use it: ops on the kept shape, and ops on the full shape
    through in-group broadcasts (``aliases``). Otherwise the reduction
    accumulates across boxes and closes the group.
    """

    index: int
    kind: str  # fused | transpose | copy | pad | concat
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
        if self.kind in ("transpose", "copy", "concat") and self.dest is None:
            found.append(self.node)
        return [n for n in found if n is not None]


_ELEMENTWISE = ("unary", "binary", "compare", "select", "cast")


class Planner:
    """Pass 1: groups in emission order, the location of every value, fusion decisions."""

    def __init__(self, graph: Graph, fusion: bool, tiles: TileSizes):
        self.graph = graph
        self.fusion = fusion
        self.tiles = tiles
        self.groups: list[Group] = []
        self.group_of: dict[int, Group] = {}
        self.loc: dict[int, DramRef | Imm] = {}
        self.avail: dict[int, int] = {}  # node -> index of the group that makes its data
        self.copies: dict[int, Group] = {}  # view node -> the group materializing it
        for node in graph.nodes:
            kind = GRAPH_OPS[node.op].kind if node.op in GRAPH_OPS else None
            handler = _PLAN.get(node.op) or _PLAN.get(kind)
            if handler is None:
                raise StageError(
                    f"kernel {graph.name}: the visa stage cannot lower op {node.op!r} "
                    f"(node {node.id})"
                )
            handler(self, node)

    def new(self, kind: str, shape: tuple[int, ...], **kw) -> Group:
        group = Group(len(self.groups), kind, shape, **kw)
        self.groups.append(group)
        return group

    def computed(self, node: Node, group: Group) -> None:
        self.group_of[node.id] = group
        self.loc[node.id] = DramRef(node.id, 0, contiguous_strides(node.shape))
        self.avail[node.id] = group.index

    def arg(self, node: Node) -> None:
        self.loc[node.id] = DramRef(node.id, 0, contiguous_strides(node.shape))
        self.avail[node.id] = -1

    def const(self, node: Node) -> None:
        self.loc[node.id] = rounded_imm(node.attr("value"), node.dtype)
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
        self.loc[node.id] = DramRef(ref.base, ref.offset, tuple(strides))
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
            ref = DramRef(src.id, 0, contiguous_strides(src.shape))
            self.avail[node.id] = self.copies[src.id].index
        self.loc[node.id] = DramRef(ref.base, ref.offset, contiguous_strides(node.shape))

    def transpose(self, node: Node) -> None:
        self.computed(node, self.new("transpose", node.shape, node=node))

    def slice(self, node: Node) -> None:
        """A strided window of its input: no instructions, only a view (like broadcast)."""
        ref = self.loc[node.inputs[0]]
        self.avail[node.id] = self.avail[node.inputs[0]]
        if isinstance(ref, Imm):
            self.loc[node.id] = ref
            return
        starts, steps = node.attr("starts"), node.attr("steps")
        offset = ref.offset + sum(a * s for a, s in zip(starts, ref.strides, strict=True))
        strides = tuple(s * k for s, k in zip(ref.strides, steps, strict=True))
        self.loc[node.id] = DramRef(ref.base, offset, strides)

    def concat(self, node: Node) -> None:
        """Each input copied into its place in the result."""
        self.computed(node, self.new("concat", node.shape, node=node))

    def elementwise(self, node: Node) -> None:
        group = self._join_target(node) if self.fusion else None
        if group is None:
            group = self.new("fused", node.shape)
        group.members.append(node)
        self.computed(node, group)

    def _join_target(self, node: Node) -> Group | None:
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
                box = producer_box(group.producer, self.tiles)
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
    "arg": Planner.arg,
    "const": Planner.const,
    "broadcast": Planner.broadcast,
    "reshape": Planner.reshape,
    "transpose": Planner.transpose,
    "slice": Planner.slice,
    "concat": Planner.concat,
    "reduce": Planner.reduce,
    "matmul": Planner.producer,
    "conv2d": Planner.producer,
    **{kind: Planner.elementwise for kind in _ELEMENTWISE},
}


def dram_homes(plan: Planner) -> tuple[list[visa.DramTensor], dict[int, str], dict[int, str]]:
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
            isinstance(ref, DramRef)
            and ref.offset == 0
            and _is_contig(node.shape, ref.strides)
            and ref.base in defined
            and ref.base not in home
            # the output is the whole of its base (a leading slice is a view, not a home)
            and graph.node(ref.base).type.size == node.type.size
        ):
            home[ref.base] = name
        else:
            plan.groups.append(Group(len(plan.groups), "copy", node.shape, node=node, dest=name))
    users = graph.users()
    outputs = set(graph.outputs)

    def used_outside(g: Group, nid: int) -> bool:
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


def producer_box(node: Node, t: TileSizes) -> tuple[int, ...]:
    """The output box of one matmul/conv tile: tile_m x tile_n (conv: whole output rows)."""
    if node.op == "matmul":
        m, n = node.shape[-2:]
        return (1,) * (node.type.rank - 2) + (min(t.m, m), min(t.n, n))
    _, oh, ow, f = node.shape
    if ow <= t.m:
        return (1, min(oh, max(1, t.m // ow)), ow, min(t.n, f))
    return (1, 1, t.m, min(t.n, f))


def fit_rows(shape: tuple[int, ...], axes: tuple[int, ...], budget: int) -> tuple[int, ...]:
    """A box spanning the reduced ``axes`` whole, the rest filled from the last axis."""
    box = [shape[a] if a in axes else 1 for a in range(len(shape))]
    rest = max(1, budget // max(1, math.prod(box)))
    for a in reversed(range(len(shape))):
        if a not in axes:
            box[a] = max(1, min(shape[a], rest))
            rest = max(1, rest // box[a])
    return tuple(box)


def fit_transpose(shape: tuple[int, ...], perm: tuple[int, ...], budget: int) -> tuple[int, ...]:
    """A box that is wide along both the output's and the input's last axis."""
    rank = len(shape)
    a, b = rank - 1, perm.index(rank - 1) if rank else 0
    if rank < 2 or a == b:
        return fit_box(shape, budget)
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
