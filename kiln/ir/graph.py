"""The traced graph: the IR every compiler stage and target starts from.

A graph is a tuple of nodes in topological order. Every node carries its
result type (concrete shape and dtype), so later stages never re-infer.
The tracer makes broadcasts and dtype casts explicit: the inputs of an
elementwise node always share one shape and one dtype.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

DTYPES = ("f32", "f16", "bf16", "i32", "bool")
ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2, "i32": 4, "bool": 1}  # bytes per element
# The largest tensor Kiln accepts, argument or intermediate: past it a tensor cannot
# exist on any target, and the stages would spend minutes (and all memory) tiling it.
MAX_TENSOR_BYTES = 4 * 2**30

AttrValue = Any  # JSON scalars, or tuples of them (never lists: nodes are hashable)


@dataclass(frozen=True, slots=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: str

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.size * ITEMSIZE[self.dtype]

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(str(d) for d in self.shape)}]"


@dataclass(frozen=True, slots=True)
class Node:
    """One operation. ``attrs`` is sorted by key so equal nodes serialize equally."""

    id: int
    op: str
    inputs: tuple[int, ...]
    type: TensorType
    attrs: tuple[tuple[str, AttrValue], ...] = ()

    def attr(self, name: str, default: AttrValue = None) -> AttrValue:
        for key, value in self.attrs:
            if key == name:
                return value
        return default

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype


def make_attrs(**attrs: AttrValue) -> tuple[tuple[str, AttrValue], ...]:
    """Canonical attribute tuple: sorted keys, lists frozen to tuples."""
    return tuple(sorted((k, _freeze(v)) for k, v in attrs.items()))


def _freeze(value: AttrValue) -> AttrValue:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


@dataclass(frozen=True, slots=True)
class Graph:
    """A traced kernel at one shape binding.

    ``bindings`` records the symbolic dims the shapes came from, so a dump
    says which shape set it is. Arguments are ``arg`` nodes with attrs
    ``name`` and ``index``.
    """

    name: str
    nodes: tuple[Node, ...]
    outputs: tuple[int, ...]
    bindings: tuple[tuple[str, int], ...] = ()

    def node(self, node_id: int) -> Node:
        node = self.nodes[node_id]
        assert node.id == node_id
        return node

    @property
    def args(self) -> tuple[Node, ...]:
        found = [n for n in self.nodes if n.op == "arg"]
        return tuple(sorted(found, key=lambda n: n.attr("index")))

    @property
    def output_nodes(self) -> tuple[Node, ...]:
        return tuple(self.nodes[i] for i in self.outputs)

    def users(self) -> dict[int, list[int]]:
        """Node id -> ids of the nodes that read it (in order)."""
        table: dict[int, list[int]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                table[i].append(n.id)
        return table

    # -- canonical form -------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": "kiln.graph/1",
            "name": self.name,
            "bindings": {k: v for k, v in self.bindings},
            "nodes": [
                {
                    "id": n.id,
                    "op": n.op,
                    "inputs": list(n.inputs),
                    "shape": list(n.type.shape),
                    "dtype": n.type.dtype,
                    "attrs": {k: _thaw(v) for k, v in n.attrs},
                }
                for n in self.nodes
            ],
            "outputs": list(self.outputs),
            "edges": [[i, n.id] for n in self.nodes for i in n.inputs],
        }

    def to_json(self) -> bytes:
        """Canonical bytes: sorted keys, fixed separators, trailing newline."""
        text = json.dumps(self.to_dict(), sort_keys=True, indent=1, allow_nan=False)
        return (text + "\n").encode()

    @property
    def key(self) -> str:
        return hashlib.sha256(self.to_json()).hexdigest()

    @staticmethod
    def from_dict(data: dict) -> Graph:
        if data.get("format") != "kiln.graph/1":
            raise ValueError(f"not a kiln graph (format {data.get('format')!r})")
        nodes = tuple(
            Node(
                id=int(n["id"]),
                op=str(n["op"]),
                inputs=tuple(int(i) for i in n["inputs"]),
                type=TensorType(tuple(int(d) for d in n["shape"]), str(n["dtype"])),
                attrs=make_attrs(**_const_value(str(n["op"]), n.get("attrs", {}))),
            )
            for n in data["nodes"]
        )
        return Graph(
            name=str(data["name"]),
            nodes=nodes,
            outputs=tuple(int(i) for i in data["outputs"]),
            bindings=tuple(sorted((str(k), int(v)) for k, v in data.get("bindings", {}).items())),
        )

    @staticmethod
    def from_json(raw: bytes | str) -> Graph:
        return Graph.from_dict(json.loads(raw))


def _thaw(value: AttrValue) -> AttrValue:
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # JSON has no inf/nan: "inf", "-inf", "nan"
    return value


def _const_value(op: str, attrs: dict) -> dict:
    """A const's non-finite value comes back from its JSON spelling ("inf", "-inf", "nan")."""
    value = attrs.get("value")
    if op == "const" and value in ("inf", "-inf", "nan"):
        return {**attrs, "value": float(value)}
    return attrs
