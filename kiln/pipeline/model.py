"""The normalized pipeline: frozen dataclasses built by ``load_pipeline``.

Everything is in file order, with defaults filled in. Free-form data the
schema leaves open (stage options, machine models) is plain JSON data and
must be treated as read-only: it is shared by every caller.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from kiln.errors import Location, PipelineError

if TYPE_CHECKING:
    from kiln.pipeline.defaults import LayeredSourceMap
    from kiln.pipeline.yamlpos import SourceMap

DEFAULT_OUT_DIR = "build/kiln/kernel"
DEFAULT_TUNING_FILE = "tuning.jsonl"
OUT_DIR_ENV = "KILN_OUT_DIR"

Options = tuple[tuple[str, Any], ...]
Dims = tuple[tuple[str, int], ...]
_TRANSIENT = frozenset({"_source", "_index"})


@dataclass(frozen=True, slots=True)
class KernelSpec:
    """One entry of ``kernels:``: which @device function, at which shapes and dtypes."""

    name: str
    function: str | None = None  # dotted pkg.module.func, when the name alone is ambiguous
    dtype: str = "f32"
    dtypes: tuple[tuple[str, str], ...] = ()  # (argument, dtype) overrides
    shapes: tuple[tuple[str, Dims], ...] = ()  # (set name, ((dim, size), ...)), file order
    options: tuple[tuple[str, Options], ...] = ()  # (stage name, option overrides)
    tolerance: dict[str, float] | None = field(default=None, hash=False)
    machine: str | None = None
    # (argument, input spec) of ``inputs:``, and per shape set its own overrides
    inputs: tuple[tuple[str, Any], ...] = field(default=(), hash=False)
    set_inputs: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = field(default=(), hash=False)
    # (dim, (low, high)) of ``fuzz:``: the sizes `kiln test --fuzz` draws for that dim
    fuzz: tuple[tuple[str, tuple[int, int]], ...] = field(default=(), hash=False)
    # the key in pipeline.yaml, when it is not ``name``: an entry with a list of
    # dtypes makes one kernel per dtype, ``gemm_f16`` from ``gemm: {dtype: [f32, f16]}``
    entry: str | None = None

    @property
    def key_path(self) -> str:
        """Where this kernel is written in pipeline.yaml: ``kernels.<its entry>``."""
        return f"kernels.{self.entry or self.name}"

    def input_specs(self, shape_set: str | None = None) -> dict[str, Any]:
        """Argument -> input spec: ``inputs:``, with ``shape_set``'s own ``inputs`` over it."""
        merged = dict(self.inputs)
        merged.update(dict(self.set_inputs).get(shape_set, ()))
        return merged

    def input_key_path(self, shape_set: str | None, arg: str) -> str:
        """The key path of argument ``arg``'s input spec for ``shape_set``."""
        if any(arg == a for a, _ in dict(self.set_inputs).get(shape_set, ())):
            return f"{self.key_path}.shapes.{shape_set}.inputs.{arg}"
        return f"{self.key_path}.inputs.{arg}"

    def arg_dtype(self, arg: str) -> str:
        """The dtype of argument ``arg``: its override, else the kernel's dtype."""
        return dict(self.dtypes).get(arg, self.dtype)

    def shape_set(self, name: str) -> dict[str, int]:
        """The dims bound by shape set ``name`` (KeyError if there is none)."""
        for set_name, dims in self.shapes:
            if set_name == name:
                return dict(dims)
        raise KeyError(f"kernel {self.name!r} has no shape set {name!r}")

    @property
    def shape_set_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.shapes)


@dataclass(frozen=True, slots=True)
class StageSpec:
    """One row of ``stages:``: a stage name, its module and its options."""

    name: str
    module: str
    options: Options = ()


@dataclass(frozen=True, slots=True)
class DumpSpec:
    """One entry of ``dumps:``: which dump kinds to write for which kernels."""

    kernels: tuple[str, ...]
    kinds: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TargetSpec:
    """One entry of ``targets:``: a runner, the machine it models, its options."""

    name: str
    runner: str
    machine: str | None = None
    options: Options = ()
    tolerance: dict[str, float] | None = field(default=None, hash=False)


@dataclass(frozen=True, slots=True)
class AppSpec:
    """One entry of ``apps:``: a program that calls kernels, and its tests."""

    name: str
    module: str
    tests: tuple[str, ...] = ()
    shapes: str | None = None  # the shape set to build for the kernels it reaches


@dataclass(frozen=True, slots=True)
class Pipeline:
    """A loaded, validated pipeline.yaml."""

    path: Path  # absolute path of pipeline.yaml
    root: Path  # its directory: relative paths and module lookups start here
    project: str
    out_dir: str = DEFAULT_OUT_DIR
    cache_check: Literal["timestamp", "md5"] = "timestamp"
    tuning_file: str = DEFAULT_TUNING_FILE  # `kiln tune` records, relative to root
    packages: tuple[str, ...] = ()
    machine: str | None = None
    kernels: tuple[KernelSpec, ...] = ()
    stages: tuple[StageSpec, ...] = ()
    dumps: tuple[DumpSpec, ...] = ()
    machines: dict[str, dict[str, Any]] = field(default_factory=dict, hash=False)
    targets: tuple[TargetSpec, ...] = ()
    apps: tuple[AppSpec, ...] = ()
    # Things the file asks for that still work but will not for long (old names):
    # printed as warnings on every run, so they stay visible while cached.
    warnings: tuple[str, ...] = ()
    # cache: {remote, upload, timeout} (the shared store) and executor: {kind, address}
    cache_settings: dict[str, Any] = field(default_factory=dict, hash=False)
    executor: dict[str, Any] = field(default_factory=dict, hash=False)
    # Key paths of the entries taken from Kiln's built-in defaults (``stages``,
    # ``machines.npu-tiny``, ``machine``, ...): everything else the file wrote.
    builtin: frozenset[str] = frozenset()
    # Private: key path -> position, rebuilt from the file on demand when None
    # (the cached pickle leaves it out), and a name -> kernel index.
    _source: SourceMap | LayeredSourceMap | None = field(
        default=None, compare=False, hash=False, repr=False
    )
    _index: dict[str, KernelSpec] | None = field(
        default=None, compare=False, hash=False, repr=False
    )

    def __reduce__(self):
        """Pickle without the private source map and index (rebuilt on demand).

        ``__reduce__``, not ``__getstate__``: before Python 3.11.5 a slotted
        dataclass replaced a class's own ``__getstate__`` with one that kept
        every field, and the cached pipeline carried its whole source map.
        """
        state = [None if f.name in _TRANSIENT else getattr(self, f.name) for f in fields(self)]
        return (_pipeline_from_state, (state,))

    @classmethod
    def from_data(
        cls,
        data: dict[str, Any],
        path: Path,
        source: SourceMap | LayeredSourceMap | None = None,
        builtin: frozenset[str] = frozenset(),
    ) -> Pipeline:
        """Normalize validated pipeline data (defaults filled in, file order kept).

        ``builtin`` names the key paths that came from Kiln's defaults file.
        """
        get = data.get
        return cls(
            path=path,
            root=path.parent,
            project=data["project"],
            out_dir=get("out_dir", DEFAULT_OUT_DIR),
            cache_check=(get("cache") or {}).get("check", "timestamp"),
            tuning_file=(get("tuning") or {}).get("file", DEFAULT_TUNING_FILE),
            packages=tuple(data["packages"]),
            machine=get("machine"),
            kernels=tuple(
                k for name, spec in data["kernels"].items() for k in _kernels(name, spec)
            ),
            stages=tuple(
                StageSpec(s["name"], s["module"], _items(s.get("options"))) for s in data["stages"]
            ),
            dumps=_merged_dumps(get("dumps") or (), data["kernels"]),
            machines=dict(get("machines") or {}),
            targets=tuple(
                TargetSpec(
                    n, t["runner"], t.get("machine"), _items(t.get("options")), t.get("tolerance")
                )
                for n, t in (get("targets") or {}).items()
            ),
            apps=tuple(
                AppSpec(n, a["module"], tuple(a.get("tests") or ()), a.get("shapes"))
                for n, a in (get("apps") or {}).items()
            ),
            warnings=tuple(data.get("_warnings", ())),
            cache_settings={k: v for k, v in (get("cache") or {}).items() if k != "check"},
            executor=dict(get("executor") or {}),
            builtin=frozenset(builtin),
            _source=source,
        )

    # -- lookups -----------------------------------------------------------

    def kernel(self, name: str) -> KernelSpec:
        """The kernel called ``name`` (KeyError if there is none)."""
        index = self._index
        if index is None:
            index = {k.name: k for k in self.kernels}
            object.__setattr__(self, "_index", index)
        try:
            return index[name]
        except KeyError:
            raise KeyError(f"no kernel {name!r} in {self.path}") from None

    def stage(self, name: str) -> StageSpec:
        """The stage called ``name`` (KeyError if there is none)."""
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(f"no stage {name!r} in {self.path}")

    def target(self, name: str) -> TargetSpec:
        """The target called ``name`` (KeyError if there is none)."""
        for target in self.targets:
            if target.name == name:
                return target
        raise KeyError(f"no target {name!r} in {self.path}")

    def app(self, name: str) -> AppSpec:
        """The app called ``name`` (KeyError if there is none)."""
        for app in self.apps:
            if app.name == name:
                return app
        raise KeyError(f"no app {name!r} in {self.path}")

    def machine_model(self, name: str | None = None) -> dict[str, Any]:
        """The machine model ``name``, else the default one (read-only, shared).

        The default is the top-level ``machine:``, which loading always sets
        (the built-in ``npu-v1`` when the file names none); a Pipeline made
        by hand without one uses the only entry of ``machines:``. Raises
        PipelineError when there is no such machine.
        """
        if name is None:
            name = self.machine
            if name is None:
                if len(self.machines) == 1:
                    return next(iter(self.machines.values()))
                raise PipelineError(
                    "no default machine: set the top-level `machine:` key",
                    self.locate("machines" if self.machines else ""),
                    expected="`machine:` naming one of: "
                    + (", ".join(self.machines) or "(no machines)"),
                    found=f"{len(self.machines)} machines and no `machine:`",
                )
        try:
            return self.machines[name]
        except KeyError:
            raise PipelineError(
                f"unknown machine '{name}'",
                self.locate("machines"),
                expected="one of: " + (", ".join(self.machines) or "(no machines declared)"),
                found=repr(name),
            ) from None

    def stage_options(self, kernel: str | KernelSpec, stage: str) -> dict[str, Any]:
        """Stage ``stage``'s options with ``kernel``'s per-stage overrides on top."""
        spec = self.kernel(kernel) if isinstance(kernel, str) else kernel
        merged = dict(self.stage(stage).options)
        for stage_name, overrides in spec.options:
            if stage_name == stage:
                merged.update(overrides)
        return merged

    def kernel_machine(self, kernel: str | KernelSpec) -> dict[str, Any]:
        """The machine model a kernel compiles for: its own ``machine:``, else the default."""
        spec = self.kernel(kernel) if isinstance(kernel, str) else kernel
        return self.machine_model(spec.machine)

    def resolve_out_dir(self) -> Path:
        """Artifact root: $KILN_OUT_DIR, else ``out_dir``, else build/kiln/kernel; absolute."""
        value = os.environ.get(OUT_DIR_ENV) or self.out_dir or DEFAULT_OUT_DIR
        path = Path(value).expanduser()
        return path if path.is_absolute() else self.root / path

    # -- diagnostics -------------------------------------------------------

    def locate(self, key_path: str, *, value: bool = False) -> Location:
        """Where ``key_path`` (e.g. ``kernels.gemm.shapes.small``) is written.

        Points at the key (or at its value with ``value=True``); a path that is
        not in the file falls back to its nearest written parent. Used to raise
        PipelineError from code that checks the pipeline later (discovery).
        """
        source = self._source
        if source is None:
            from kiln.pipeline.defaults import layered_source
            from kiln.pipeline.yamlpos import display_name

            try:
                source = layered_source(self.path, self.builtin)
            except PipelineError:  # edited into something unreadable since
                return Location(display_name(self.path), key_path=key_path or None)
            object.__setattr__(self, "_source", source)
        return source.locate(key_path, value=value)

    def origin(self, key_path: str) -> str:
        """Where ``key_path``'s value comes from: ``pipeline.yaml:LINE`` or ``built-in default``.

        A ``machine:`` the file leaves out but gets from the one machine it
        adds points at that machine.
        """
        from kiln.pipeline.defaults import BUILTIN

        if self.is_builtin(key_path):
            return BUILTIN
        self.locate("")  # reads the source map again after a cache hit
        source = self._source
        if key_path == "machine" and source is not None and not source.written(key_path):
            key_path = f"machines.{self.machine}"
        loc = self.locate(key_path)
        return f"{loc.file}:{loc.line}" if loc.line is not None else loc.file

    def is_builtin(self, key_path: str) -> bool:
        """Whether ``key_path`` (``targets.sim``, ``stages[0].module``) is a built-in default.

        False for what pipeline.yaml writes, and for a project's machine picked
        as the default because it is the only one it declares.
        """
        from kiln.pipeline.defaults import is_builtin

        return is_builtin(self.builtin, key_path)

    def error(
        self, message: str, key_path: str, *, value: bool = False, **detail: Any
    ) -> PipelineError:
        """A PipelineError at ``key_path``; ``detail`` is expected=/found=/hint=/notes=."""
        return PipelineError(message, self.locate(key_path, value=value), **detail)


def _items(mapping: dict[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    return tuple((mapping or {}).items())


INPUTS_KEY = "inputs"  # in a named shape set: that set's own inputs, not a dim


def dtype_list_name(name: str, dtype: str) -> str:
    """The kernel made for ``dtype`` by an entry with a list of dtypes: ``gemm_f16``."""
    return f"{name}_{dtype}"


def _kernels(name: str, spec: dict[str, Any]) -> list[KernelSpec]:
    """The kernels of one entry of ``kernels:``: one, or one per dtype of a dtype list."""
    shapes = spec.get("shapes")  # none: a kernel of fixed sizes only, one set named default
    set_inputs: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()
    if shapes is None or all(isinstance(size, int) for size in shapes.values()):  # one flat set
        sets: tuple[tuple[str, Dims], ...] = (("default", _items(shapes)),)  # no shapes: {}
    else:
        sets = tuple(
            (set_name, tuple((d, v) for d, v in dims.items() if d != INPUTS_KEY))
            for set_name, dims in shapes.items()
        )
        set_inputs = tuple(
            (set_name, _items(dims[INPUTS_KEY]))
            for set_name, dims in shapes.items()
            if dims.get(INPUTS_KEY)
        )
    options = spec.get("options") or {}
    kernel = KernelSpec(
        name=name,
        function=spec.get("function"),
        dtypes=_items(spec.get("dtypes")),
        shapes=sets,
        options=tuple((stage, _items(overrides)) for stage, overrides in options.items()),
        tolerance=spec.get("tolerance"),
        machine=spec.get("machine"),
        inputs=_items(spec.get(INPUTS_KEY)),
        set_inputs=set_inputs,
        fuzz=tuple(
            (dim, (size, size) if isinstance(size, int) else (size[0], size[1]))
            for dim, size in (spec.get("fuzz") or {}).items()
        ),
    )
    dtype = spec.get("dtype", "f32")
    if not isinstance(dtype, list):
        return [replace(kernel, dtype=dtype)]
    return [
        replace(
            kernel,
            name=dtype_list_name(name, one),
            function=kernel.function or name,
            dtype=one,
            entry=name,
        )
        for one in dtype
    ]


def _expanded(names: list[str], kernels: dict[str, Any]) -> tuple[str, ...]:
    """Kernel names of ``dumps:``, an entry with a list of dtypes standing for each kernel."""
    found: list[str] = []
    for name in names:
        dtype = (kernels.get(name) or {}).get("dtype")
        found += [dtype_list_name(name, d) for d in dtype] if isinstance(dtype, list) else [name]
    return tuple(found)


def _merged_dumps(entries: Any, kernels: dict[str, Any]) -> tuple[DumpSpec, ...]:
    """``dumps:`` with each (kernel, kind) once: overlapping entries ask for the same file.

    A kind an earlier entry already asks for a kernel is dropped from a later
    entry; an entry whose kernels are left with different kinds splits in
    file order. Entries that do not overlap come out as written.
    """
    done: set[tuple[str, str]] = set()
    merged: list[DumpSpec] = []
    for entry in entries:
        groups: dict[tuple[str, ...], list[str]] = {}
        for kernel in dict.fromkeys(_expanded(entry["kernels"], kernels)):
            kinds = tuple(k for k in dict.fromkeys(entry["kinds"]) if (kernel, k) not in done)
            done.update((kernel, k) for k in kinds)
            if kinds:
                groups.setdefault(kinds, []).append(kernel)
        merged += [DumpSpec(tuple(names), kinds) for kinds, names in groups.items()]
    return tuple(merged)


def _pipeline_from_state(state: list[Any]) -> Pipeline:
    """A pickled Pipeline back (``Pipeline.__reduce__``)."""
    pipeline = object.__new__(Pipeline)
    # Not strict: a pickle from an older Kiln has another layout, and its
    # cache key (Kiln version, loader stamp) never matches, so it is dropped.
    for f, value in zip(fields(Pipeline), state, strict=False):
        object.__setattr__(pipeline, f.name, value)
    return pipeline
