"""Imports point down the documented layers, and kiln.tasks has no import cycle.

The order (../DESIGN.md, "Layering"): kiln.ir is pure data; kiln.lang builds
graphs from it; stages turn one IR into the next; the compiler driver runs
stages; runners read artifacts; kiln.tasks is the only place that knows doit.
"""

from __future__ import annotations

import ast

import networkx as nx

from tests.test_lint import kiln_modules

# layer -> what it must never import (prefix match on dotted names)
FORBIDDEN = {
    "kiln.ir": ("kiln.lang", "kiln.stages", "kiln.runners", "kiln.tasks", "kiln.driver", "doit"),
    "kiln.lang": ("kiln.stages", "kiln.runners", "kiln.tasks", "kiln.driver", "doit"),
    "kiln.stages": ("kiln.runners", "kiln.tasks", "kiln.driver", "doit"),
    "kiln.driver": ("kiln.runners", "kiln.tasks", "doit"),
    "kiln.runners": ("kiln.tasks", "kiln.driver", "doit"),
    "kiln.cache": ("kiln.stages", "kiln.runners", "kiln.tasks", "kiln.driver", "doit"),
    "kiln.pipeline": ("kiln.stages", "kiln.runners", "kiln.tasks", "kiln.driver", "doit"),
}


def imports(path, *, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def layer_of(module: str) -> str | None:
    return next(
        (layer for layer in FORBIDDEN if module == layer or module.startswith(layer + ".")), None
    )


def test_every_import_points_down_the_layers():
    wrong = []
    for module, path in kiln_modules().items():
        layer = layer_of(module)
        if layer is None:
            continue
        for name in imports(path):
            if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN[layer]):
                wrong.append(f"{module} imports {name}")
    assert not wrong, "\n".join(wrong)


ENGINE = (
    "kiln.tasks.ahead",
    "kiln.tasks.chain_action",
    "kiln.tasks.chain_record",
    "kiln.tasks.chain_worker",
    "kiln.tasks.compile",
    "kiln.tasks.instance_spec",
    "kiln.tasks.pool",
    "kiln.tasks.remote_exec",
    "kiln.tasks.options_check",
)


def test_the_build_engine_has_no_import_cycle_lazy_imports_included():
    modules = kiln_modules()
    graph = nx.DiGraph()
    for module, path in modules.items():
        if not module.startswith("kiln.tasks"):
            continue
        for name in imports(path):
            target = name if name in modules else name.rpartition(".")[0]
            if target in modules and target.startswith("kiln.tasks") and target != module:
                graph.add_edge(module, target)
    cycles = [c for c in nx.simple_cycles(graph) if any(m in ENGINE for m in c)]
    assert not cycles, cycles
