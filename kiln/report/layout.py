"""Graph layouts for the page, computed here with networkx so the page only draws.

Layered drawing: each node's layer is its topological generation (inputs at
the top); within a layer nodes are ordered by the mean position of their
predecessors, which untangles most edges of the DAGs a kernel makes.
"""

from __future__ import annotations

import networkx as nx

from kiln.ir.graph import Graph
from kiln.ir.lir import Program

# a LIR graph larger than this is not drawn (the timeline shows the same instructions)
MAX_DRAWN_NODES = 3000


def layered_positions(g: nx.DiGraph, centre: bool = True) -> dict:
    """node -> (x, y): y is the topological generation, x the slot within it."""
    positions: dict = {}
    layers = [sorted(layer, key=str) for layer in nx.topological_generations(g)]
    width = max((len(layer) for layer in layers), default=0)
    for y, layer in enumerate(layers):
        if y:
            layer.sort(key=lambda n: (_barycentre(g, n, positions), str(n)))
        offset = (width - len(layer)) / 2 if centre else 0
        for x, node in enumerate(layer):
            positions[node] = (round(offset + x, 2), y)
    return positions


def _barycentre(g: nx.DiGraph, node, positions: dict) -> float:
    xs = [positions[p][0] for p in g.predecessors(node) if p in positions]
    return sum(xs) / len(xs) if xs else 0.0


def drawn_graph(g: nx.DiGraph, label, group, line=None, centre: bool = True) -> dict:
    """Nodes with coordinates and labels, and edges, as the page's graph view takes them."""
    if g.number_of_nodes() > MAX_DRAWN_NODES:
        return {"omitted": g.number_of_nodes(), "nodes": [], "edges": []}
    pos = layered_positions(g, centre)
    index = {n: i for i, n in enumerate(g.nodes)}
    nodes = []
    for n in g.nodes:
        entry = {"id": n, "label": label(n), "group": group(n), "x": pos[n][0], "y": pos[n][1]}
        if line is not None and line(n) is not None:
            entry["line"] = line(n)
        nodes.append(entry)
    return {"nodes": nodes, "edges": [[index[a], index[b]] for a, b in g.edges]}


def traced_graph(graph: Graph, lines: dict[int, int] | None = None) -> dict:
    """The traced graph drawn: one node per op (label: op and result type)."""
    g = nx.DiGraph()
    for node in graph.nodes:
        g.add_node(node.id)
        for src in node.inputs:
            g.add_edge(src, node.id)
    by_id = {n.id: n for n in graph.nodes}

    def label(n: int) -> str:
        node = by_id[n]
        name = node.attr("name")
        head = f"{node.op} {name}" if name else node.op
        return f"{head} {node.type}"

    lines = lines or {}
    return drawn_graph(g, label, lambda n: by_id[n].op, lambda n: lines.get(n))


def lir_graph(program: Program) -> dict:
    """The LIR dependency graph drawn: one node per instruction, one edge per dependency."""
    g = nx.DiGraph()
    for ins in program.instrs:
        g.add_node(ins.id)
    for ins in program.instrs:
        for dep in ins.deps:
            g.add_edge(dep.src, ins.id)
    by_id = {i.id: i for i in program.instrs}
    return drawn_graph(
        g,
        lambda n: f"#{n} {by_id[n].opcode} {by_id[n].unit}",
        lambda n: by_id[n].unit_kind,
    )
