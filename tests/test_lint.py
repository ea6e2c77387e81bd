"""The code base stays clean: ruff (configured in pyproject.toml) and module privacy."""

import ast
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def ruff() -> list[str]:
    exe = shutil.which("ruff")
    if exe is None:
        pytest.skip("ruff is not installed (it is part of the [test] extra)")
    return [exe]


def test_ruff_check_passes():
    proc = subprocess.run([*ruff(), "check", "."], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format_is_applied():
    proc = subprocess.run(
        [*ruff(), "format", "--check", "."], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------------------
# Module privacy: a ``_name`` belongs to the module that defines it. A name
# another module needs is part of its owner's API and is spelled without the
# underscore, so renaming or removing a private helper never breaks a
# different file.


def kiln_modules(root: Path = REPO) -> dict[str, Path]:
    """Dotted name -> source file of every module the wheel installs (pyproject's mapping)."""
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = config.get("package-dir", {})
    modules = {}
    for package in config["packages"]:
        # kiln.tasks.dag lives in tasks/dag: the longest mapped prefix names the folder
        mapped = max(
            (p for p in dirs if package == p or package.startswith(p + ".")), key=len, default=None
        )
        rest = package[len(mapped) + 1 :] if mapped and package != mapped else ""
        base = dirs[mapped] if mapped else package.replace(".", "/")
        folder = root / base / rest.replace(".", "/")
        for path in sorted(folder.glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            modules[name] = path
    return modules


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def private_uses(module: str, path: Path, modules: dict[str, Path]) -> list[str]:
    """``file:line: what`` for each private name of another Kiln module that ``path`` uses.

    Sees ``from M import _x`` (absolute or relative) and ``M._x`` where ``M``
    is a name bound to a Kiln module (``import kiln.a.b as m``,
    ``from kiln.a import b``, or the dotted ``kiln.a.b._x``).
    """
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    bound: dict[str, str] = {}  # local name -> the Kiln module it refers to
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in modules:
                    bound[alias.asname] = alias.name
                elif not alias.asname:
                    top = alias.name.split(".")[0]
                    if top in modules:
                        bound[top] = top
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(node, module, is_package)
            if source not in modules:
                continue
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    bound[alias.asname or alias.name] = f"{source}.{alias.name}"
                elif _is_private(alias.name) and source != module:
                    found.append((node.lineno, f"from {source} import {alias.name}"))
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
            continue
        chain, value = [], node.value
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in bound:
            owner = ".".join([bound[value.id], *reversed(chain)])
            if owner in modules and owner != module:
                found.append((node.lineno, f"{owner}.{node.attr}"))
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    return [f"{shown}:{line}: {what}" for line, what in sorted(found)]


def test_no_module_uses_another_modules_private_names():
    modules = kiln_modules()
    assert "kiln.stages.visa_plan" in modules and "kiln.runners.iree_mlir" in modules
    found = [hit for name, path in modules.items() for hit in private_uses(name, path, modules)]
    assert not found, (
        "private names used outside their module (make them public in their owner):\n"
        + "\n".join(found)
    )


@pytest.mark.parametrize(
    "source",
    [
        "from kiln.stages.plan import _tiles\n",
        "from .plan import _tiles\n",
        "from kiln.stages import plan\nplan._tiles()\n",
        "import kiln.stages.plan as p\np._tiles()\n",
        "import kiln.stages.plan\nkiln.stages.plan._tiles()\n",
    ],
)
def test_private_name_scan_sees_imports_and_attribute_uses(tmp_path, source):
    (tmp_path / "plan.py").write_text("def _tiles(): ...\n")
    (tmp_path / "emit.py").write_text(source)
    modules = {
        "kiln": tmp_path / "__init__.py",
        "kiln.stages": tmp_path / "__init__.py",
        "kiln.stages.plan": tmp_path / "plan.py",
        "kiln.stages.emit": tmp_path / "emit.py",
    }
    assert private_uses("kiln.stages.emit", tmp_path / "emit.py", modules)
    assert not private_uses("kiln.stages.plan", tmp_path / "plan.py", modules)


def test_private_name_scan_allows_dunders_and_public_names(tmp_path):
    (tmp_path / "emit.py").write_text(
        "import kiln\nfrom kiln.stages import plan\nfrom kiln.stages.plan import tiles\n"
        "print(kiln.__version__, plan.__file__, plan.tiles, tiles)\n"
    )
    modules = {
        "kiln": tmp_path / "__init__.py",
        "kiln.stages.plan": tmp_path / "plan.py",
        "kiln.stages.emit": tmp_path / "emit.py",
    }
    assert private_uses("kiln.stages.emit", tmp_path / "emit.py", modules) == []
