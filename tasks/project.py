"""A loaded project: the pipeline, its discovered kernels and their instances.

A kernel instance is one kernel at one shape set (``gemm.small``); every
task, artifact directory and report is per instance.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from kiln.tasks.discovery import Discovery, KernelSource
from kiln.tasks.importpath import add_project_root

from kiln.errors import PipelineError

PIPELINE_FILE = "pipeline.yaml"


@dataclass(frozen=True)
class KernelInstance:
    kernel: str  # the pipeline's kernel key (the function name)
    shape_set: str
    bindings: tuple[tuple[str, int], ...]
    source: KernelSource
    out_dir: Path

    @property
    def name(self) -> str:
        return f"{self.kernel}.{self.shape_set}"


class Project:
    """Everything the task generator and the CLI need about one pipeline.yaml."""

    def __init__(self, pipeline_path: Path):
        from kiln.pipeline import load_pipeline_cached

        self.pipeline_path = pipeline_path.resolve()
        self.root = self.pipeline_path.parent
        self.state_dir = self.root / ".kiln"
        if not self.pipeline_path.is_file():
            raise PipelineError(
                f"no pipeline file at {self.pipeline_path}",
                hint="run kiln in a project directory (one with a pipeline.yaml), "
                "or set KILN_PIPELINE",
            )
        add_project_root(self.root)
        self.pipeline = load_pipeline_cached(self.pipeline_path, self.state_dir)
        for warning in self.pipeline.warnings:
            print(f"kiln: warning: {warning}", file=sys.stderr)
        self.out_dir = self.pipeline.resolve_out_dir()
        self.discovery = Discovery(self.root, self.state_dir / "discovery.json")
        self.kernels = self._resolve_kernels()
        self.instances = [
            KernelInstance(
                spec.name,
                set_name,
                tuple(bindings),
                self.kernels[spec.name],
                self.out_dir / spec.name / set_name,
            )
            for spec in self.pipeline.kernels
            for set_name, bindings in spec.shapes
        ]
        self.discovery.save()

    @staticmethod
    def find(start: Path | None = None) -> Project:
        env = os.environ.get("KILN_PIPELINE")
        if env:
            return Project(Path(env))
        return Project((start or Path.cwd()) / PIPELINE_FILE)

    def machine(self, name: str | None = None) -> dict | None:
        """The named (or default) machine model, with its name added."""
        name = name or self.pipeline.machine
        if name is None:
            return None
        return {"name": name, **self.pipeline.machines[name]}

    def kernel_machine(self, kernel: str) -> dict | None:
        """The machine a kernel compiles for: its own ``machine:``, else the default."""
        return self.machine(self.pipeline.kernel(kernel).machine)

    # -- kernels --------------------------------------------------------
    def _resolve_kernels(self) -> dict[str, KernelSource]:
        modules = []
        for index, package in enumerate(self.pipeline.packages):
            infos = self.discovery.scan_packages((package,))
            if not infos:
                raise PipelineError(
                    f"kernel package {package!r} was not found",
                    location=self.pipeline.locate(f"packages[{index}]", value=True),
                    expected=f"a package directory or module under {self.root}",
                    found=package,
                )
            modules.extend(infos)
        for info in modules:
            if info.syntax_error:
                raise _syntax_error(info)
        found: dict[str, list[KernelSource]] = {}
        for info in modules:
            for k in info.kernels:
                found.setdefault(k.name, []).append(k)
                found.setdefault(k.path, []).append(k)
        resolved = {}
        for spec in self.pipeline.kernels:
            where = f"kernels.{spec.name}"
            wanted = spec.function or spec.name
            candidates = found.get(wanted, [])
            if not candidates:
                import difflib

                names = sorted({k for k in found if "." not in k})
                close = difflib.get_close_matches(wanted, names, n=1)
                raise PipelineError(
                    f"kernel {wanted!r} is not a @device function in any package",
                    location=self.pipeline.locate(where),
                    expected="a @device function in: " + ", ".join(self.pipeline.packages),
                    found=wanted,
                    hint=f"did you mean {close[0]!r}?" if close else None,
                    notes=[f"known kernels: {', '.join(names) or '(none)'}"],
                )
            if len(candidates) > 1:
                raise PipelineError(
                    f"kernel name {wanted!r} is defined in several modules",
                    location=self.pipeline.locate(where),
                    expected="one definition, or `function:` naming the full path",
                    found=", ".join(k.path for k in candidates),
                )
            source = candidates[0]
            self._check_bindings(spec, source)
            resolved[spec.name] = source
        return resolved

    def _check_bindings(self, spec, source: KernelSource) -> None:
        for set_name, bindings in spec.shapes:
            bound = {k for k, _ in bindings}
            for arg, dims in source.params:
                for dim in dims or ():
                    if isinstance(dim, str) and dim not in bound:
                        raise PipelineError(
                            f"shape symbol {dim!r} of argument {arg!r} of kernel "
                            f"{spec.name!r} is not bound by shape set {set_name!r}",
                            location=self.pipeline.locate(f"kernels.{spec.name}.shapes.{set_name}"),
                            expected=f"a value for {dim}",
                            found="bound: " + (", ".join(sorted(bound)) or "nothing"),
                            notes=[f"{source.file}:{source.line}: def {source.name}(...)"],
                        )

    def select(
        self,
        filters: list[str] | None = None,
        packages: list[str] | None = None,
        shape_set: str | None = None,
    ) -> list[KernelInstance]:
        """Instances whose ``package.module.function`` (or instance name) matches a filter."""
        chosen = []
        for inst in self.instances:
            path = inst.source.path
            if packages and not any(path.startswith(p + ".") for p in packages):
                continue
            if filters and not any(f in path or f in inst.name for f in filters):
                continue
            if shape_set and inst.shape_set != shape_set:
                continue
            chosen.append(inst)
        return chosen

    def add_instance(
        self,
        kernel: str,
        source: KernelSource,
        shape_set: str,
        bindings: tuple[tuple[str, int], ...],
        dtype: str = "f32",
        dtypes: tuple[tuple[str, str], ...] = (),
    ) -> KernelInstance:
        """Add an instance pipeline.yaml does not declare (an app's call compiled on first use).

        It joins ``instances`` and the in-memory pipeline (never the file), so the
        compile tasks, out dir and cache treat it like a declared one. A kernel
        the pipeline does not name gets a spec of its own (``dtype``/``dtypes``).
        """
        from dataclasses import replace

        from kiln.pipeline import KernelSpec

        for inst in self.instances:
            if inst.kernel == kernel and inst.shape_set == shape_set:
                return inst
        kernels = list(self.pipeline.kernels)
        names = [k.name for k in kernels]
        if kernel in names:
            spec = kernels[names.index(kernel)]
            kernels[names.index(kernel)] = replace(
                spec, shapes=spec.shapes + ((shape_set, tuple(bindings)),)
            )
        else:
            spec = KernelSpec(kernel, source.path, dtype, tuple(dtypes))
            kernels.append(replace(spec, shapes=((shape_set, tuple(bindings)),)))
        self.pipeline = replace(self.pipeline, kernels=tuple(kernels), _index=None)
        self.kernels[kernel] = source
        inst = KernelInstance(
            kernel, shape_set, tuple(bindings), source, self.out_dir / kernel / shape_set
        )
        self.instances.append(inst)
        return inst

    def trace_dtypes(self, kernel: str) -> tuple[str, dict[str, str]]:
        spec = self.pipeline.kernel(kernel)
        return spec.dtype, dict(spec.dtypes)


def _syntax_error(info) -> PipelineError:
    """A kernel module that does not parse: point at its own line."""
    from kiln.errors import Location

    line, column, text = info.syntax_error_at or (None, None, None)
    return PipelineError(
        f"kernel module {info.module} cannot be parsed: {info.syntax_error}",
        location=Location(info.file, line, column, source=text),
        hint="fix the syntax error; kernels are found by reading their source",
    )
