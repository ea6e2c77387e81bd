"""Imports point down the documented layers, and no module imports itself back.

The order (docs/stages.md, "Where the code lives"), bottom first: kiln.ir is
pure data; kiln.lang builds graphs from it; stages turn one IR into the next;
the compiler driver runs stages; runners read artifacts; kiln.tasks is the
only place that knows doit, itself in layers (model, chain, execution,
checks, dag, commands, apps); kiln.report draws what builds left; kiln.cli.command
parses the command line and is imported by nothing. Function-level imports
count as imports; ``if TYPE_CHECKING:`` blocks, never executed, do not.
"""

from __future__ import annotations

import ast

import networkx as nx

from tests.test_lint import kiln_modules

# layer -> what it must never import (prefix match on dotted names)
BASE = ("kiln.tasks", "kiln.report", "kiln.cli")
FORBIDDEN = {
    "kiln.ir": ("kiln.lang", "kiln.stages", "kiln.runners", "kiln.driver", "doit", *BASE),
    "kiln.lang": ("kiln.stages", "kiln.runners", "kiln.driver", "doit", *BASE),
    "kiln.stages": ("kiln.runners", "kiln.driver", "doit", *BASE),
    "kiln.driver": ("kiln.runners", "doit", *BASE),
    "kiln.runners": ("kiln.driver", "doit", *BASE),
    "kiln.cache": ("kiln.stages", "kiln.runners", "kiln.driver", "doit", *BASE),
    "kiln.pipeline": ("kiln.stages", "kiln.runners", "kiln.driver", "doit", *BASE),
    "kiln.tune": ("doit", *BASE),
    "kiln.tasks": ("kiln.cli",),
    "kiln.report": ("kiln.cli",),
    "kiln.cli": (),
}
# kiln's own root modules (errors, fsutil, inputs, ...) are the floor everyone stands on
ROOT_FORBIDDEN = ("doit", *BASE)

# kiln.tasks, bottom first: a module imports its own layer or those below
TASK_LAYERS = ("model", "chain", "execution", "checks", "dag", "commands", "apps")
# the one upward call: the report page's doit task runs the page writer (kiln.report)
ALLOWED_UP = {("kiln.tasks.dag.report_task", "kiln.report.page")}


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(path, *, top_level_only: bool = False) -> set[str]:
    """Dotted names a module imports: ``from a.b import c`` gives ``a.b.c``, which is the
    module a.b.c where there is one, else the name c of module a.b."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(nodes, depth: int) -> None:
        for node in nodes:
            if _type_checking(node):
                continue
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            if not top_level_only or isinstance(node, (ast.If, ast.Try)):
                visit(list(ast.iter_child_nodes(node)), depth + 1)

    visit(tree.body, 0)
    return found


def layer_of(module: str) -> str | None:
    return next(
        (layer for layer in FORBIDDEN if module == layer or module.startswith(layer + ".")), None
    )


def is_root_module(module: str) -> bool:
    return module.count(".") == 1 and module not in FORBIDDEN and module != "kiln.__main__"


def _resolve(name: str, modules) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(modules) -> nx.DiGraph:
    graph = nx.DiGraph()
    for module, path in modules.items():
        graph.add_node(module)
        for name in imports(path):
            target = _resolve(name, modules)
            if target and target != module and not module.startswith(target + "."):
                graph.add_edge(module, target)  # a parent package always runs first: no edge
    return graph


def test_every_import_points_down_the_layers():
    modules = kiln_modules()
    wrong = []
    for module, path in modules.items():
        layer = layer_of(module)
        if layer is not None:
            bad = FORBIDDEN[layer]
        elif is_root_module(module):
            bad = ROOT_FORBIDDEN
        else:
            continue
        for name in imports(path):
            target = _resolve(name, modules) or name
            if (module, target) in ALLOWED_UP:
                continue
            if any(name == b or name.startswith(b + ".") for b in bad):
                wrong.append(f"{module} imports {name}")
    assert not wrong, "\n".join(wrong)


def task_layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) >= 3 and parts[:2] == ["kiln", "tasks"] and parts[2] in TASK_LAYERS:
        return TASK_LAYERS.index(parts[2])
    return None


def test_kiln_tasks_imports_point_down_its_own_layers():
    modules = kiln_modules()
    wrong = []
    for source, target in import_graph(modules).edges:
        low, high = task_layer(target), task_layer(source)
        if low is not None and high is not None and low > high:
            wrong.append(f"{source} ({TASK_LAYERS[high]}) imports {target} ({TASK_LAYERS[low]})")
    assert not wrong, "\n".join(wrong)


def test_every_task_module_sits_in_a_layer():
    loose = [m for m in kiln_modules() if m.count(".") == 2 and m.startswith("kiln.tasks.")]
    loose = [m for m in loose if m.split(".")[2] not in TASK_LAYERS]
    assert not loose, f"modules of kiln.tasks outside its layers: {loose}"


def test_only_the_cli_imports_the_cli():
    modules = kiln_modules()
    users = {
        source
        for source, target in import_graph(modules).edges
        if target.startswith("kiln.cli") and not source.startswith("kiln.cli")
    }
    assert users <= {"kiln.__main__"}, users


def test_no_import_cycle_lazy_imports_included():
    """Outside kiln.lang (a Tensor's methods and the functions they call are one unit)."""
    modules = {m: p for m, p in kiln_modules().items() if not m.startswith("kiln.lang")}
    cycles = sorted(nx.simple_cycles(import_graph(modules)), key=len)
    assert not cycles, cycles[:10]


def test_the_checker_sees_a_cycle_and_an_upward_import(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("def f():\n    from kiln.tasks.commands.b import g\n")
    b.write_text(
        "from kiln.tasks.model.a import f\nif TYPE_CHECKING:\n    import kiln.cli.command\n"
    )
    modules = {"kiln.tasks.model.a": a, "kiln.tasks.commands.b": b}
    graph = import_graph(modules)
    assert list(nx.simple_cycles(graph))
    assert task_layer("kiln.tasks.commands.b") > task_layer("kiln.tasks.model.a")
    assert "kiln.cli" not in imports(b)  # a TYPE_CHECKING import is not an import
