"""Work and traffic of a graph: FLOPs and the bytes of its arguments and results."""

from __future__ import annotations

from kiln.ir.graph import Graph

DTYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "i32": 4, "bool": 1}


def flops(graph: Graph) -> int:
    """Floating-point (or integer) operations: 2 per multiply-add, 1 per other element op."""
    total = 0
    for node in graph.nodes:
        if node.op == "matmul":
            a = graph.nodes[node.inputs[0]].type
            total += 2 * node.type.size * a.shape[-1]
        elif node.op == "conv2d":
            w = graph.nodes[node.inputs[1]].type
            kh, kw, c, _ = w.shape
            total += 2 * node.type.size * kh * kw * c
        elif node.op in ("sum", "max", "min", "mean", "prod"):
            total += graph.nodes[node.inputs[0]].type.size
        elif node.op in (
            "arg",
            "const",
            "transpose",
            "reshape",
            "broadcast",
            "cast",
            "slice",
            "concat",
        ):
            continue
        else:
            total += node.type.size
    return total


def io_bytes(graph: Graph) -> int:
    """Bytes read from arguments plus bytes written to results."""
    moved = sum(a.type.size * DTYPE_BYTES[a.dtype] for a in graph.args)
    return moved + sum(o.type.size * DTYPE_BYTES[o.dtype] for o in graph.output_nodes)
