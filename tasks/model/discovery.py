"""Find @device kernels by reading source, not by importing it.

A no-op build must not import or trace every kernel, so kernel packages
are scanned with ``ast``: the decorated functions, their ``Tensor[...]``
parameter dims, and the project modules each file imports. Results are
cached per file, keyed by (mtime_ns, size), in the project's state dir.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ast

CACHE_FORMAT = 4  # 4: params of *args and keyword-only parameters too; no invalid dims


@dataclass(frozen=True, slots=True)
class KernelSource:
    """One @device function as seen in its source file."""

    name: str
    module: str  # dotted module name
    file: str  # absolute path
    line: int
    params: tuple[tuple[str, tuple[str | int, ...] | None], ...]  # (arg, dims); None: no annotation

    @property
    def path(self) -> str:
        """The full kernel path filters match against: ``package.module.function``."""
        return f"{self.module}.{self.name}"


@dataclass(frozen=True, slots=True)
class ModuleInfo:
    module: str
    file: str
    kernels: tuple[KernelSource, ...]
    imports: tuple[str, ...]  # dotted names this module imports (absolute)
    syntax_error: str | None = None
    syntax_error_at: tuple[int | None, int | None, str | None] | None = None


def is_device_decorator(node: ast.expr) -> bool:
    import ast

    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id == "device"
    return isinstance(node, ast.Attribute) and node.attr == "device"


def _dims(annotation: ast.expr | None) -> tuple[str | int, ...] | None:
    """``Tensor["M", "K"]`` -> ("M", "K"); anything else -> None."""
    import ast

    if not isinstance(annotation, ast.Subscript):
        return None
    base = annotation.value
    name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
    if name != "Tensor":
        return None
    items = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
    dims: list[str | int] = []
    for item in items:  # a bad dim ('', 'n m', 0) is left to the import's annotation error
        value = item.value if isinstance(item, ast.Constant) else None
        if (isinstance(value, str) and value.isidentifier()) or (type(value) is int and value > 0):
            dims.append(value)
    return tuple(dims)


def resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def scan_module(module: str, file: Path) -> ModuleInfo:
    """Parse one file: its @device functions and its imports."""
    import ast

    try:
        tree = ast.parse(file.read_bytes(), filename=str(file))
    except SyntaxError as exc:
        where = (exc.lineno, exc.offset, (exc.text or "").rstrip("\n") or None)
        return ModuleInfo(module, str(file), (), (), f"{exc.msg} (line {exc.lineno})", where)
    kernels = []
    imports: list[str] = []
    is_package = file.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = (
                resolve_relative(module, is_package, node.level, node.module)
                if node.level
                else (node.module or "")
            )
            imports.append(base)
            imports.extend(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any(
            is_device_decorator(d) for d in node.decorator_list
        ):
            # every parameter, *args and keyword-only ones too: their dims count as used
            # (no "unused dim" warning), and the trace refuses the parameter at its line
            a = node.args
            args = [*a.posonlyargs, *a.args, a.vararg, *a.kwonlyargs, a.kwarg]
            params = tuple((p.arg, _dims(p.annotation)) for p in args if p is not None)
            kernels.append(KernelSource(node.name, module, str(file), node.lineno, params))
    return ModuleInfo(module, str(file), tuple(kernels), tuple(sorted(set(imports))))


def package_files(root: Path, package: str) -> list[tuple[str, Path]]:
    """(module name, file) for a dotted package or module, looked up under ``root``."""
    rel = Path(*package.split("."))
    pkg_dir = root / rel
    if (pkg_dir / "__init__.py").is_file():
        found = []
        for dirpath, dirnames, filenames in os.walk(pkg_dir):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__pycache__")))
            here = Path(dirpath)
            for name in sorted(filenames):
                if not name.endswith(".py"):
                    continue
                parts = list(here.relative_to(root).parts)
                if name != "__init__.py":
                    parts.append(name[:-3])
                found.append((".".join(parts), here / name))
        return found
    module_file = root / rel.with_suffix(".py")
    if module_file.is_file():
        return [(package, module_file)]
    return []


class Discovery:
    """Kernel discovery over a project, with a per-file stamp cache."""

    def __init__(self, root: Path, cache_file: Path | None = None):
        self.root = root
        self.cache_file = cache_file
        self._cache: dict[str, dict] = {}
        self._dirty = False
        self.modules: dict[str, ModuleInfo] = {}
        self._sources: dict[str, list[str]] = {}
        if cache_file is not None and cache_file.exists() and not cache_file.is_file():
            from kiln.statefiles import quarantine  # a directory in the way: only a cache

            quarantine(cache_file, "a directory, not a file")
            self._dirty = True
        if cache_file is not None and cache_file.is_file():
            try:
                data = json.loads(cache_file.read_text())
                if data.get("format") == CACHE_FORMAT:
                    self._cache = data["files"]
                    if not isinstance(self._cache, dict):
                        raise TypeError("'files' is not a mapping")
            except Exception as exc:  # any failure (a nesting deeper than the stack too)
                from kiln.statefiles import quarantine

                quarantine(cache_file, f"{type(exc).__name__}: {exc}")
                self._cache = {}
                self._dirty = True

    def module(self, module: str, file: Path) -> ModuleInfo:
        if module in self.modules:
            return self.modules[module]
        st = file.stat()
        # a file replaced by rename (an editor's save, git checkout) keeps neither its
        # inode nor its ctime, even when its size and a restored mtime match
        stamp = [st.st_mtime_ns, st.st_size, st.st_ino, st.st_ctime_ns]
        entry = self._cache.get(str(file))
        info = None
        fresh = isinstance(entry, dict) and entry.get("stamp") == stamp
        if fresh and entry.get("module") == module:
            try:
                info = _info_from_json(entry["info"])
            except Exception:  # a damaged entry, however damaged: scan the file again
                info = None
        if info is None:
            info = scan_module(module, file)
            self._cache[str(file)] = {"stamp": stamp, "module": module, "info": _info_to_json(info)}
            self._dirty = True
        self.modules[module] = info
        return info

    def scan_packages(self, packages: tuple[str, ...]) -> list[ModuleInfo]:
        infos = []
        for package in packages:
            for module, file in package_files(self.root, package):
                infos.append(self.module(module, file))
        return infos

    def source_files(self, module: str) -> list[str]:
        """The module's file, every project module it imports and their packages, transitively."""
        if module not in self._sources:
            self._sources[module] = self._closure(module)
        return self._sources[module]

    def _closure(self, module: str) -> list[str]:
        seen: dict[str, str] = {}
        stack = [module]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            file = self._project_file(name)
            if file is None:
                continue
            info = self.module(name, file)
            seen[name] = info.file
            stack.extend(info.imports)
            # importing a.b.c runs a/__init__.py and a/b/__init__.py first
            parts = name.split(".")
            stack.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        return sorted(set(seen.values()))

    def _project_file(self, module: str) -> Path | None:
        if module.split(".")[0] == "kiln":
            # Kiln itself (a checkout of it may be the project's root): the compiler, tracked
            # by the stage code digest, never a kernel source to ship to a worker
            return None
        rel = Path(*module.split("."))
        for candidate in (self.root / rel.with_suffix(".py"), self.root / rel / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    def save(self) -> None:
        if not self._dirty or self.cache_file is None:
            return
        from kiln.fsutil import write_bytes_atomic

        data = json.dumps({"format": CACHE_FORMAT, "files": self._cache}, sort_keys=True)
        try:
            write_bytes_atomic(self.cache_file, data.encode())
        except OSError:  # only a cache: the next run scans again; the build says what is wrong
            return
        self._dirty = False


def _info_to_json(info: ModuleInfo) -> dict:
    return {
        "module": info.module,
        "file": info.file,
        "kernels": [
            [k.name, k.line, [[a, list(d) if d is not None else None] for a, d in k.params]]
            for k in info.kernels
        ],
        "imports": list(info.imports),
        "syntax_error": info.syntax_error,
        "syntax_error_at": list(info.syntax_error_at) if info.syntax_error_at else None,
    }


def _info_from_json(data: dict) -> ModuleInfo:
    kernels = tuple(
        KernelSource(
            name,
            data["module"],
            data["file"],
            line,
            tuple((a, tuple(d) if d is not None else None) for a, d in params),
        )
        for name, line, params in data["kernels"]
    )
    at = data.get("syntax_error_at")
    return ModuleInfo(
        data["module"],
        data["file"],
        kernels,
        tuple(data["imports"]),
        data.get("syntax_error"),
        tuple(at) if at else None,
    )
