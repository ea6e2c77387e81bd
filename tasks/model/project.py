"""A loaded project: the pipeline, its discovered kernels and their instances.

A kernel instance is one kernel at one shape set (``gemm.small``); every
task, artifact directory and report is per instance.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from kiln.errors import Location, PipelineError, printable, relative_path
from kiln.fsutil import remove_stale_tmp
from kiln.ir.graph import ITEMSIZE, MAX_TENSOR_BYTES
from kiln.kernel_checks import point_at_plain_function, unused_dims
from kiln.tasks.model.discovery import Discovery, KernelSource
from kiln.tasks.model.importpath import add_project_root

PIPELINE_FILE = "pipeline.yaml"
# The host oracle and the simulator hold every argument in memory: a tensor
# larger than this is a typo (a dim of 2**40), refused when the pipeline loads.


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
                f"no pipeline file at {relative_path(self.pipeline_path)}",
                hint="run kiln in a project directory (one with a pipeline.yaml), "
                "or set KILN_PIPELINE",
            )
        add_project_root(self.root)
        remove_stale_tmp(self.state_dir)  # left by a build that was killed mid-write
        self.pipeline = load_pipeline_cached(self.pipeline_path, self.state_dir)
        for warning in self.pipeline.warnings:
            print(f"kiln: warning: {printable(warning)}", file=sys.stderr)
        self.out_dir = self.pipeline.resolve_out_dir()
        if not self.out_dir.is_dir():
            self._check_out_dir()
        self.discovery = Discovery(self.root, self.state_dir / "discovery.json")
        self.kernels = self._resolve_kernels()
        for warning in unused_dims(self.pipeline, self.kernels):
            print(warning.render(), file=sys.stderr, flush=True)
        self.instances = [
            KernelInstance(
                spec.name,
                set_name,
                tuple(bindings),
                self.kernels[spec.name],
                self.out_dir.joinpath(spec.name, set_name),
            )
            for spec in self.pipeline.kernels
            for set_name, bindings in spec.shapes
        ]
        self.discovery.save()

    @property
    def dep_file(self) -> Path:
        """doit's record of what was built, one per out dir.

        The out dir written in pipeline.yaml keeps ``.kiln/doit.sqlite3``;
        another one (``KILN_OUT_DIR``) gets its own file, so switching to it
        and back rebuilds nothing in either.
        """
        import hashlib

        configured = Path(self.pipeline.out_dir).expanduser()
        if not configured.is_absolute():
            configured = self.root / configured
        if self.out_dir == configured:
            return self.state_dir / "doit.sqlite3"
        tag = hashlib.sha256(str(self.out_dir).encode()).hexdigest()[:12]
        return self.state_dir / f"doit-{tag}.sqlite3"

    def _check_out_dir(self) -> None:
        """An out dir that cannot be a directory is an error at ``out_dir``, before any build."""
        from kiln.pipeline.model import OUT_DIR_ENV

        where = (
            Location(f"${OUT_DIR_ENV}")
            if os.environ.get(OUT_DIR_ENV)
            else self.pipeline.locate("out_dir", value=True)
        )
        missing = None  # the outermost part of the out dir that does not exist yet
        for part in (self.out_dir, *self.out_dir.parents):
            if part.is_dir():
                problem = None
                if not os.access(part, os.W_OK | os.X_OK):
                    problem = "is not writable"
                elif missing is not None:
                    # access() says yes to root everywhere, /proc included: try it
                    try:
                        os.mkdir(missing)
                        os.rmdir(missing)
                    except FileExistsError:
                        pass
                    except OSError as exc:
                        problem = f"refuses a new directory ({exc.strerror or exc})"
                if problem is not None:
                    raise PipelineError(
                        f"the out dir {relative_path(self.out_dir, self.root)} cannot be "
                        f"created: {relative_path(part, self.root)} {problem}",
                        location=where,
                        expected="a writable directory for the build",
                        found=str(part),
                        hint="fix its permissions or set out_dir (or KILN_OUT_DIR) elsewhere",
                    )
                return
            missing = part
            if part.exists() or part.is_symlink():
                raise PipelineError(
                    f"the out dir {relative_path(self.out_dir, self.root)} cannot be a "
                    f"directory: {relative_path(part, self.root)} is a file",
                    location=where,
                    expected="a directory (or nothing) at each part of the out dir",
                    found=f"a file at {part}",
                    hint="move the file away or set out_dir (or KILN_OUT_DIR) elsewhere",
                )

    @staticmethod
    def find(start: Path | None = None) -> Project:
        """The project of ``-f FILE`` (``KILN_PIPELINE``), else the nearest pipeline.yaml up."""
        return Project(find_pipeline(start))

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
    def _missing_package(self, index: int, package: str) -> PipelineError:
        """A package that gave no module: most often a new directory without __init__.py."""
        rel = Path(*package.split("."))
        plain_dir = (self.root / rel).is_dir()
        init = (rel / "__init__.py").as_posix()
        return PipelineError(
            f"kernel package {package!r} is a directory without __init__.py"
            if plain_dir
            else f"kernel package {package!r} was not found",
            location=self.pipeline.locate(f"packages[{index}]", value=True),
            expected=f"a package directory or module under {self.root}",
            found=f"{rel.as_posix()}/, no {init}" if plain_dir else package,
            hint=f"add an empty {init}" if plain_dir else None,
        )

    def _resolve_kernels(self) -> dict[str, KernelSource]:
        modules = []
        for index, package in enumerate(self.pipeline.packages):
            infos = self.discovery.scan_packages((package,))
            if not infos:
                raise self._missing_package(index, package)
            modules.extend(infos)
        # a module that does not parse stops only the kernels it may hold: a scratch
        # file beside the kernels must not stop every build (the error says which)
        unparsed = [info for info in modules if info.syntax_error]
        found: dict[str, list[KernelSource]] = {}
        for info in modules:
            for k in info.kernels:
                found.setdefault(k.name, []).append(k)
                found.setdefault(k.path, []).append(k)
        resolved = {}
        twins: dict[tuple[str, ...], list] = {}  # the modules defining a name -> its entries
        for spec in self.pipeline.kernels:
            where = spec.key_path  # an entry with a list of dtypes: its own key
            wanted = spec.function or spec.name
            candidates = found.get(wanted, [])
            if not candidates and unparsed:  # most likely defined in the module that fails
                raise _syntax_error(unparsed[0])
            if not candidates:
                import difflib

                names = sorted({k for k in found if "." not in k})
                close = difflib.get_close_matches(wanted, names, n=1)
                err = PipelineError(
                    f"kernel {wanted!r} is not a @device function in any package",
                    location=self.pipeline.locate(f"{where}.function" if spec.function else where),
                    expected="a @device function in: " + ", ".join(self.pipeline.packages),
                    found=wanted,
                    hint=f"did you mean {close[0]!r}?" if close else None,
                    notes=[f"known kernels: {', '.join(names) or '(none)'}"],
                )
                point_at_plain_function(err, self.root, self.pipeline.packages, wanted)
                raise err
            if len(candidates) > 1:
                # A second module defining the same name must not break an entry that
                # built yesterday: keep the first in scan order (packages as listed,
                # modules sorted) and say how to pin it.
                modules = tuple(k.module for k in candidates)
                twins.setdefault(modules, []).append((spec, candidates))
            source = candidates[0]
            self._check_bindings(spec, source)
            resolved[spec.name] = source
        for modules, specs in twins.items():  # a copied module: one warning, not one per kernel
            self._warn_twins(modules, specs)
        for info in unparsed:
            error = _syntax_error(info)
            at = f"{error.location.header()}: " if error.location else ""
            print(
                f"{at}warning: {error.message}; no kernel this build needs is in it",
                file=sys.stderr,
            )
        return resolved

    def _warn_twins(self, modules: tuple[str, ...], entries: list) -> None:
        """Entries whose function several modules define: building the first module's."""
        spec, candidates = entries[0]
        loc = self.pipeline.locate(spec.key_path)
        at = f"{loc.header()}: " if loc else ""
        if len(entries) == 1:
            print(
                f"{at}warning: kernel {spec.name!r} is defined in several modules "
                f"({', '.join(k.path for k in candidates)}); building "
                f"{candidates[0].path}. Add `function: {candidates[0].path}` under "
                f"kernels.{spec.name} to pin it (or name the other one)",
                file=sys.stderr,
            )
            return
        names = ", ".join(repr(s.name) for s, _ in entries)
        print(
            f"{at}warning: kernels {names} are each defined in several modules "
            f"({', '.join(modules)}); building {modules[0]}'s. Add `function: "
            f"{modules[0]}.NAME` under each entry to pin it (or name the other module)",
            file=sys.stderr,
        )

    def _check_bindings(self, spec, source: KernelSource) -> None:
        args = [arg for arg, _ in source.params]
        for arg, _ in spec.dtypes:
            if arg not in args and arg != "*":
                from kiln.pipeline.yamlpos import did_you_mean

                raise PipelineError(
                    f"kernel {spec.name!r} has no argument {arg!r}",
                    location=self.pipeline.locate(f"{spec.key_path}.dtypes.{arg}"),
                    expected="an argument of " + f"{source.name}: " + (", ".join(args) or "(none)"),
                    found=repr(arg),
                    hint=did_you_mean(arg, args),
                    notes=[f"{defined_at(source)}: def {source.name}(...)"],
                )
        if spec.inputs or spec.set_inputs:
            from kiln.inputs import check_kernel_inputs

            check_kernel_inputs(self.pipeline, spec, source.params, self.root)
        for set_name, bindings in spec.shapes:
            self._check_sizes(spec, source, set_name, dict(bindings))
            bound = {k for k, _ in bindings}
            for arg, dims in source.params:
                for dim in dims or ():
                    if isinstance(dim, str) and dim not in bound:
                        raise PipelineError(
                            f"shape symbol {dim!r} of argument {arg!r} of kernel "
                            f"{spec.name!r} is not bound by shape set {set_name!r}",
                            location=self.pipeline.locate(f"{spec.key_path}.shapes.{set_name}"),
                            expected=f"a value for {dim}",
                            found="bound: " + (", ".join(sorted(bound)) or "nothing"),
                            hint=(
                                f"give its sizes: shapes: {{small: {{{dim}: 64}}}}"
                                if not bound
                                else None
                            ),
                            notes=[f"{defined_at(source)}: def {source.name}(...)"],
                        )

    def _check_sizes(self, spec, source: KernelSource, set_name: str, sizes: dict) -> None:
        """Refuse an argument too large to exist, here at its YAML line, not in a stage."""
        for arg, dims in source.params:
            elements = 1
            for dim in dims or ():
                elements *= sizes.get(dim, 1) if isinstance(dim, str) else dim
            itemsize = ITEMSIZE[spec.arg_dtype(arg)]
            if elements * itemsize > MAX_TENSOR_BYTES:
                shape = ", ".join(f"{d}={sizes.get(d, d)}" for d in dims or ())
                raise PipelineError(
                    f"argument {arg!r} of kernel {spec.name!r} is too large at shape set "
                    f"{set_name!r}",
                    location=self.pipeline.locate(f"{spec.key_path}.shapes.{set_name}", value=True),
                    expected=f"at most {MAX_TENSOR_BYTES // 2**30} GiB per argument",
                    found=f"{elements * itemsize:,} bytes ({shape})",
                    hint="check the dims of this shape set",
                )

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
        self._check_sizes(spec, source, shape_set, dict(bindings))  # no 2**40 dims via a call
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


def find_pipeline(start: Path | None = None) -> Path:
    """Like git: the pipeline file in ``start`` (default: cwd) or the nearest parent."""
    for env in ("KILN_PIPELINE_FILE", "KILN_PIPELINE"):
        if os.environ.get(env):
            path = Path(os.environ[env])
            if path.is_dir() and (path / PIPELINE_FILE).is_file():  # as -f DIR reads it
                return path / PIPELINE_FILE
            if not path.is_file():  # -f checks its path, so a bad one came from the variable
                raise PipelineError(
                    f"{env} names no pipeline file: {printable(str(path))}",
                    expected=f"{env}=PATH/pipeline.yaml, an existing file",
                    found="a directory" if path.is_dir() else "nothing there",
                    hint=f"fix or unset {env} (kiln then looks for pipeline.yaml upwards)",
                )
            return path
    here = (start or Path.cwd()).absolute()
    for directory in (here, *here.parents):
        candidate = directory / PIPELINE_FILE
        if candidate.is_file():
            return candidate
        if candidate.is_dir():
            raise PipelineError(
                f"{printable(str(candidate))} is a directory, not a pipeline file",
                expected=f"{PIPELINE_FILE}, a YAML file",
                found="a directory",
                hint=f"rename the directory and write the pipeline into {PIPELINE_FILE}",
            )
        if os.path.lexists(candidate):  # there, but no file: never "no pipeline file"
            found = _not_a_file(candidate)
            raise PipelineError(
                f"{printable(str(candidate))} is {found}, not a pipeline file",
                expected=f"{PIPELINE_FILE}, a YAML file",
                found=found,
                hint="replace it with the pipeline file (or a link to one)",
            )
    raise PipelineError(
        f"no pipeline file ({PIPELINE_FILE}) in {printable(str(here))} or any directory above it",
        expected="a Kiln project: a directory holding pipeline.yaml",
        found=str(here),
        hint="run kiln inside a project, pass -f PATH/pipeline.yaml, or start one with `kiln init`",
    )


def _not_a_file(path: Path) -> str:
    """What stands at ``path`` in a pipeline file's place: a dangling link, a FIFO, ..."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "a symbolic link to nothing (or a loop of links)"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket" if stat.S_ISSOCK(mode) else "not a regular file"


def defined_at(source: KernelSource) -> str:
    """``file:line`` of a kernel's definition, relative to the working directory."""
    return f"{relative_path(source.file)}:{source.line}"


def _syntax_error(info) -> PipelineError:
    """A kernel module that does not parse: point at its own line."""
    from kiln.errors import Location

    line, column, text = info.syntax_error_at or (None, None, None)
    return PipelineError(
        f"kernel module {info.module} cannot be parsed: {info.syntax_error}",
        location=Location(info.file, line, column, source=text),
        hint="fix the syntax error; kernels are found by reading their source",
    )
