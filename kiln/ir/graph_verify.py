"""A traced graph's structural invariants: ids, ops, dtypes, order and inferred types.

Apart from kiln/ir/graph.py because the checks need the op registry
(kiln/ir/ops.py), which needs the graph's types.
"""

from __future__ import annotations

from kiln.ir.graph import DTYPES, Graph
from kiln.ir.ops import OPS, infer


def verify_graph(graph: Graph) -> None:
    """Check a graph's structural invariants; raise ValueError naming node and rule."""

    seen: set[int] = set()
    for pos, n in enumerate(graph.nodes):
        if n.id != pos:
            raise ValueError(f"node {n.id}: ids must equal positions (found at {pos})")
        if n.op not in OPS:
            raise ValueError(f"node {n.id}: unknown op {n.op!r}")
        if n.type.dtype not in DTYPES:
            raise ValueError(f"node {n.id} ({n.op}): unknown dtype {n.type.dtype!r}")
        for i in n.inputs:
            if i not in seen:
                raise ValueError(f"node {n.id} ({n.op}): input {i} is not defined before it")
        expected = infer(
            n.op, [graph.nodes[i].type for i in n.inputs], dict(n.attrs), declared=n.type
        )
        if expected != n.type:
            raise ValueError(
                f"node {n.id} ({n.op}): type {n.type} does not match inferred {expected}"
            )
        seen.add(n.id)
    if not graph.outputs:
        raise ValueError("graph has no outputs")
    for o in graph.outputs:
        if o not in seen:
            raise ValueError(f"output {o} is not a node")
