"""Which @device kernels can an app reach? A static scan, by ``ast``, never by importing.

The scan starts at the app module's import-time code and its ``main``, and
follows every name a reached piece of code mentions: functions, classes and
module-level values of project modules (files under the project root),
through ``import x.y as z``, ``from x import y as z``, module attributes
(``la.gemm``), star imports and re-exports. A kernel mentioned anywhere on
that path is reached, whether called or passed as a value (``ops = [gemm]``,
``helper(fn=gemm)``). Kernel bodies are not followed: a kernel calling
another inlines it. What the scan cannot see (``getattr(mod, name)``) is
caught at run time by the app runner's JIT path.
"""

from __future__ import annotations

import ast
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from kiln.errors import KilnError, Location
from kiln.tasks.model.discovery import (
    Discovery,
    KernelSource,
    is_device_decorator,
    resolve_relative,
)

INIT = "<module>"  # the symbol name of a module's import-time code
# Kiln's own packages: when the project root is Kiln's checkout, they are not app code.
_KILN_ROOT = Path(__file__).resolve().parents[2]
_KILN_PACKAGES = ("kiln", "tasks", "stages", "runners")


@dataclass(frozen=True, slots=True)
class Ref:
    """A name chain (``la.gemm`` -> ("la", "gemm")) mentioned at a line."""

    chain: tuple[str, ...]
    line: int
    call: bool  # the chain is called, rather than used as a value


@dataclass(slots=True)
class Body:
    """What one piece of code (a top-level def, class, value, or import-time code) mentions."""

    refs: list[Ref] = field(default_factory=list)
    imports: list[tuple[str, int]] = field(default_factory=list)  # modules it imports, at line
    scope: dict[str, tuple] = field(default_factory=dict)  # names bound by its own imports


@dataclass(slots=True)
class ModuleScan:
    module: str
    file: Path
    bindings: dict[str, tuple] = field(default_factory=dict)  # top-level name -> binding
    symbols: dict[str, Body] = field(default_factory=dict)  # top-level name -> its code
    stars: list[str] = field(default_factory=list)  # star-imported modules
    kernels: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class Reached:
    """A kernel the app can reach, and the first path that reaches it."""

    kernel: KernelSource
    file: str  # where the path leaves the app's entry code
    line: int
    via: tuple[str, ...]  # qualified names of the helpers on the path
    site: tuple[str, int]  # where the kernel itself is named
    call: bool

    def reason(self, root: Path | None = None) -> str:
        """E.g. ``reached from apps/mlp.py:12 via models.layers.dense (models/layers.py:8)``."""
        where = f"{display_path(self.file, root)}:{self.line}"
        if not self.via:
            how = "called" if self.call else "used as a value"
            return f"{how} at {where}"
        site = f"{display_path(self.site[0], root)}:{self.site[1]}"
        how = "" if self.call else ", as a value"
        return f"reached from {where} via {' -> '.join(self.via)} ({site}{how})"


def display_path(file: str | Path, root: Path | None) -> str:
    path = Path(file)
    if root is not None:
        try:
            return str(path.relative_to(root))
        except ValueError:
            pass
    return str(path)


# -- reading one module ------------------------------------------------------


def _chain(node: ast.expr) -> tuple[str, ...] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return (node.id, *reversed(parts))
    return None


class _BodyVisitor(ast.NodeVisitor):
    """Collect name chains and imports of a piece of code (nested defs included)."""

    def __init__(self, scan: ModuleScan, body: Body, is_package: bool):
        self.scan, self.body, self.is_package = scan, body, is_package

    def visit_Call(self, node: ast.Call) -> None:
        chain = _chain(node.func)
        if chain is not None:
            self.body.refs.append(Ref(chain, node.lineno, True))  # a.b.c(): nothing inside
        else:
            self.visit(node.func)
        for arg in (*node.args, *node.keywords):
            self.visit(arg)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain = _chain(node)
        if chain is None:
            self.generic_visit(node)
        elif isinstance(node.ctx, ast.Load):
            self.body.refs.append(Ref(chain, node.lineno, False))

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.body.refs.append(Ref((node.id,), node.lineno, False))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.body.imports.append((alias.name, node.lineno))
            if alias.asname:
                self.body.scope[alias.asname] = ("module", alias.name)
            else:
                top = alias.name.split(".")[0]
                self.body.scope[top] = ("module", top)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _from_base(self.scan.module, self.is_package, node)
        self.body.imports.append((base, node.lineno))
        for alias in node.names:
            if alias.name == "*":
                self.scan.stars.append(base)
                continue
            self.body.imports.append((f"{base}.{alias.name}", node.lineno))
            self.body.scope[alias.asname or alias.name] = ("from", base, alias.name)


def _from_base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level:
        return resolve_relative(module, is_package, node.level, node.module)
    return node.module or ""


def _has_call(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) for n in ast.walk(node))


def scan_module_refs(module: str, file: Path) -> ModuleScan:
    """Bindings and per-symbol references of one file; a syntax error is a KilnError."""
    source = file.read_bytes()
    try:
        tree = ast.parse(source, filename=str(file))
    except SyntaxError as exc:
        raise KilnError(
            f"cannot parse {module}: {exc.msg}",
            Location(str(file), exc.lineno, exc.offset, source=exc.text),
        ) from None
    scan = ModuleScan(module, file)
    is_package = file.name == "__init__.py"
    init = Body()
    scan.symbols[INIT] = init
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scan.bindings[stmt.name] = ("local", stmt.name)
            if isinstance(stmt, ast.FunctionDef) and any(
                is_device_decorator(d) for d in stmt.decorator_list
            ):
                scan.kernels.add(stmt.name)
                continue  # a kernel's body inlines what it calls: not followed
            body = Body()
            _BodyVisitor(scan, body, is_package).visit(stmt)
            # decorators and default values run at import time
            for expr in [*stmt.decorator_list, *_defaults(stmt)]:
                _BodyVisitor(scan, init, is_package).visit(expr)
            scan.symbols[stmt.name] = body
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            visitor = _BodyVisitor(scan, init, is_package)
            visitor.visit(stmt)
            for name, binding in visitor.body.scope.items():
                scan.bindings[name] = binding
            init.scope.clear()
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if names and len(names) == len(targets) and not _has_call(stmt.value):
                body = Body()  # a plain value: reached only when something names it
                _BodyVisitor(scan, body, is_package).visit(stmt.value)
                for name in names:
                    scan.bindings[name] = ("local", name)
                    scan.symbols[name] = body
                continue
            _BodyVisitor(scan, init, is_package).visit(stmt)
            _bind_targets(scan, targets)
        else:  # if/for/with/try/expressions: run at import time
            visitor = _BodyVisitor(scan, init, is_package)
            visitor.visit(stmt)
            for name, binding in visitor.body.scope.items():
                scan.bindings.setdefault(name, binding)
            init.scope.clear()
            for node in ast.walk(stmt):
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name not in (
                    scan.bindings
                ):
                    scan.bindings[node.name] = ("init", node.name)
    return scan


def _defaults(fn: ast.AST) -> list[ast.expr]:
    args = getattr(fn, "args", None)
    if args is None:
        return list(getattr(fn, "bases", [])) + [k.value for k in getattr(fn, "keywords", [])]
    return [*args.defaults, *(d for d in args.kw_defaults if d is not None)]


def _bind_targets(scan: ModuleScan, targets: list[ast.expr]) -> None:
    for target in targets:
        for node in ast.walk(target):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                scan.bindings[node.id] = ("init", node.id)


# -- following references ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Path:
    origin: tuple[str, int] | None  # first step out of the entry code
    via: tuple[str, ...]


class Reachability:
    """Reachability over the project modules under ``root``."""

    def __init__(self, root: Path, discovery: Discovery | None = None):
        self.root = root.resolve()
        self.discovery = discovery or Discovery(self.root)
        self._scans: dict[str, ModuleScan | None] = {}
        self._names: dict[tuple[str, str], tuple | None] = {}

    # modules
    def module_file(self, module: str) -> Path | None:
        """The file of a project module, or None (not under the root, or Kiln's own code)."""
        if not module or module.split(".")[0] in _KILN_PACKAGES and self._is_kiln(module):
            return None
        rel = Path(*module.split("."))
        for candidate in (self.root / rel.with_suffix(".py"), self.root / rel / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    def _is_kiln(self, module: str) -> bool:
        top = self.root / module.split(".")[0]
        return top.resolve() == _KILN_ROOT / module.split(".")[0]

    def scan(self, module: str) -> ModuleScan | None:
        if module not in self._scans:
            file = self.module_file(module)
            self._scans[module] = scan_module_refs(module, file) if file else None
        return self._scans[module]

    def kernel_source(self, module: str, name: str) -> KernelSource:
        scan = self.scan(module)
        assert scan is not None
        info = self.discovery.module(module, scan.file)
        for k in info.kernels:
            if k.name == name:
                return k
        raise KeyError(f"{module}.{name}")

    # names
    def resolve_name(self, module: str, name: str, seen: frozenset = frozenset()):
        """What ``module.name`` is: ("kernel", module, name), ("symbol", module, name),
        ("module", module) or None (not project code, or not known)."""
        key = (module, name)
        if key in seen:
            return None
        if not seen and key in self._names:
            return self._names[key]
        found = self._resolve_name(module, name, seen | {key})
        if not seen:
            self._names[key] = found
        return found

    def _resolve_name(self, module: str, name: str, seen: frozenset):
        scan = self.scan(module)
        if scan is None:
            return None
        binding = scan.bindings.get(name)
        if binding is None:
            for star in scan.stars:
                found = self.resolve_name(star, name, seen)
                if found is not None:
                    return found
            sub = f"{module}.{name}"
            return ("module", sub) if self.module_file(sub) else None
        return self._binding(module, binding, seen)

    def _binding(self, module: str, binding: tuple, seen: frozenset = frozenset()):
        kind = binding[0]
        if kind == "module":
            return ("module", binding[1]) if self.module_file(binding[1]) else None
        if kind == "from":
            _, base, attr = binding
            found = self.resolve_name(base, attr, seen)
            if found is None and self.module_file(f"{base}.{attr}"):
                found = ("module", f"{base}.{attr}")
            return found
        scan = self.scan(module)
        name = binding[1]
        if kind == "local" and name in scan.kernels:
            return ("kernel", module, name)
        if kind == "local" and name in scan.symbols:
            return ("symbol", module, name)
        return ("symbol", module, INIT)  # bound by import-time code

    def resolve(self, module: str, ref: Ref, scope: dict[str, tuple]):
        head, *rest = ref.chain
        if head in scope:
            target = self._binding(module, scope[head])
        else:
            target = self.resolve_name(module, head)
        for attr in rest:
            if target is None or target[0] != "module":
                break
            target = self.resolve_name(target[1], attr)
        return target

    # the walk
    def reach(self, app_module: str) -> list[Reached]:
        """Kernels reachable from ``app_module`` (its import-time code and ``main``)."""
        if self.scan(app_module) is None:
            raise KeyError(app_module)
        paths: dict[tuple[str, str], _Path] = {}
        queue: deque[tuple[str, str]] = deque()
        found: dict[tuple[str, str], Reached] = {}

        def visit(node: tuple[str, str], path: _Path) -> None:
            if node not in paths and self.scan(node[0]) is not None:
                paths[node] = path
                queue.append(node)

        entry = _Path(None, ())
        visit((app_module, INIT), entry)
        main = self.resolve_name(app_module, "main")  # defined here, or imported
        if main is not None and main[0] == "symbol":
            visit((main[1], main[2]), entry)
        while queue:
            module, name = queue.popleft()
            scan = self.scan(module)
            body = scan.symbols.get(name)
            if body is None:
                continue
            here = paths[(module, name)]
            for imported, line in body.imports:
                for parent in _parents(imported):
                    step = here.origin or (str(scan.file), line)
                    visit((parent, INIT), _Path(step, here.via + (parent,)))
            for ref in body.refs:
                target = self.resolve(module, ref, body.scope)
                if target is None or target[0] == "module":
                    continue
                step = here.origin or (str(scan.file), ref.line)
                if target[0] == "kernel":
                    key = (target[1], target[2])
                    if key not in found:
                        found[key] = Reached(
                            self.kernel_source(*key),
                            step[0],
                            step[1],
                            here.via,
                            (str(scan.file), ref.line),
                            ref.call,
                        )
                    continue
                _, mod, sym = target
                label = mod if sym == INIT else f"{mod}.{sym}"
                visit((mod, sym), _Path(step, here.via + (label,)))
                if sym != INIT:
                    visit((mod, INIT), _Path(step, here.via + (mod,)))
        return list(found.values())


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def has_main(reach: Reachability, module: str) -> bool:
    """Whether the app module defines (or imports) a top-level ``main``."""
    scan = reach.scan(module)
    return scan is not None and "main" in scan.bindings
