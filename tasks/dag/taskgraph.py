"""The task DAG as a networkx graph: `kiln graph` and the report's build view.

Built from the same doit task dicts a build runs (compile and test tasks):
an edge ``a -> b`` says task ``b`` reads a file task ``a`` writes. With
``why``, each compile task carries what `kiln status` says about it.
"""

from __future__ import annotations

import json

import networkx as nx

from kiln.tasks.checks.results import task_instance
from kiln.tasks.dag.compile import compile_tasks
from kiln.tasks.model.project import KernelInstance, Project


def task_graph(
    project: Project, instances: list[KernelInstance], why: bool = False, tests: bool = True
) -> nx.DiGraph:
    """Tasks of ``instances`` as nodes (attrs: kind, instance, stage, reasons), deps as edges."""
    dicts = [("compile", t) for t in compile_tasks(project, instances)]
    if tests:
        from kiln.tasks.dag.test_tasks import test_tasks

        dicts += [("test", t) for t in test_tasks(project, instances)]
    g = nx.DiGraph()
    producers: dict[str, str] = {}
    for kind, t in dicts:
        name = f"{kind}:{t['name']}"
        owner = task_instance(name)
        if owner is not None:
            instance, step = owner
        else:
            instance, _, step = t["name"].partition("@")
        g.add_node(name, kind=kind, instance=instance, stage=step, reasons=None)
        for target in t.get("targets", []):
            producers[str(target)] = name
    for kind, t in dicts:
        name = f"{kind}:{t['name']}"
        for dep in t.get("file_dep", []):
            if str(dep) in producers:
                g.add_edge(producers[str(dep)], name)
    if why:
        from kiln.tasks.dag.status import explain

        for name, reasons in explain(project, instances):
            if name in g:
                g.nodes[name]["reasons"] = reasons
    return g


def would_run(g: nx.DiGraph, node: str) -> bool:
    return bool(g.nodes[node].get("reasons"))


def to_json(g: nx.DiGraph) -> str:
    nodes = [
        {
            "name": n,
            "kind": d["kind"],
            "instance": d["instance"],
            "stage": d["stage"],
            **(
                {"would_run": bool(d["reasons"]), "reasons": d["reasons"]}
                if d["reasons"] is not None
                else {}
            ),
        }
        for n, d in g.nodes(data=True)
    ]
    return json.dumps({"nodes": nodes, "edges": [list(e) for e in g.edges]}, indent=1) + "\n"


def to_dot(g: nx.DiGraph) -> str:
    lines = ["digraph kiln {", "  rankdir=LR;", '  node [shape=box, fontname="monospace"];']
    for n, d in g.nodes(data=True):
        attrs = [f"label={_quote(n)}"]
        if d["reasons"]:
            attrs += [
                "style=filled",
                'fillcolor="#ffd6cc"',
                f"tooltip={_quote('; '.join(d['reasons']))}",
            ]
        lines.append(f"  {_quote(n)} [{', '.join(attrs)}];")
    for a, b in g.edges:
        lines.append(f"  {_quote(a)} -> {_quote(b)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_mermaid(g: nx.DiGraph) -> str:
    ids = {n: f"t{i}" for i, n in enumerate(g.nodes)}
    lines = ["graph LR"]
    for n, d in g.nodes(data=True):
        label = n.replace('"', "'")
        if d["reasons"]:
            label += "<br/>" + "; ".join(d["reasons"]).replace('"', "'")
        lines.append(f'  {ids[n]}["{label}"]')
    lines.extend(f"  {ids[a]} --> {ids[b]}" for a, b in g.edges)
    rerun = [ids[n] for n in g.nodes if would_run(g, n)]
    if rerun:
        lines.append("  classDef rerun fill:#ffd6cc,stroke:#c0392b")
        lines.append(f"  class {','.join(rerun)} rerun")
    return "\n".join(lines) + "\n"


def render(g: nx.DiGraph, fmt: str) -> str:
    return {"dot": to_dot, "json": to_json, "mermaid": to_mermaid}[fmt](g)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
