"""Layered graph layouts (kiln/report/layout.py)."""

from __future__ import annotations

import networkx as nx

from kiln.ir.graph import Graph, Node, TensorType
from kiln.report import layout


def test_layers_are_topological_generations():
    g = nx.DiGraph([("a", "c"), ("b", "c"), ("c", "d")])
    pos = layout.layered_positions(g)
    assert {n: y for n, (_, y) in pos.items()} == {"a": 0, "b": 0, "c": 1, "d": 2}
    assert pos["c"][0] == 0.5  # centred under a and b
    assert layout.layered_positions(g, centre=False)["c"] == (0, 1)


def test_traced_graph_carries_labels_edges_and_source_lines():
    t = TensorType((4,), "f32")
    graph = Graph(
        "k",
        (Node(0, "arg", (), t, (("index", 0), ("name", "x"))), Node(1, "exp", (0,), t)),
        (1,),
    )
    drawn = layout.traced_graph(graph, {1: 12})
    assert [n["label"] for n in drawn["nodes"]] == ["arg x f32[4]", "exp f32[4]"]
    assert drawn["edges"] == [[0, 1]]
    assert drawn["nodes"][1]["line"] == 12 and "line" not in drawn["nodes"][0]


def test_a_huge_graph_is_not_drawn(monkeypatch):
    monkeypatch.setattr(layout, "MAX_DRAWN_NODES", 3)
    g = nx.path_graph(5, create_using=nx.DiGraph)
    assert layout.drawn_graph(g, str, str) == {"omitted": 5, "nodes": [], "edges": []}
