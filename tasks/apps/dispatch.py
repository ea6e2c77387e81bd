"""Dispatch of an app's @device calls to a target, with JIT for calls the scan missed.

A :class:`Dispatcher` receives every ``@device`` call while an app runs
(``kiln.lang.device.dispatching``), picks the built instance whose shapes and
dtypes match the arguments and runs it on the target; a call the scan did not
see, or at shapes no shape set declares, is compiled on first use through the
same tasks and reported as a warning naming the call site.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.errors import KilnError
from kiln.tasks.model.project import KernelInstance, Project
from kiln.tasks.model.reach import Reachability, display_path

if TYPE_CHECKING:
    from kiln.tasks.apps.plan import AppPlan

# Frames inside these folders are Kiln's own: a call site is the first frame outside them.
KILN_DIRS = tuple(
    str(Path(__file__).resolve().parents[2] / pkg) + os.sep
    for pkg in ("kiln", "tasks", "stages", "runners")
)

# -- dispatch ------------------------------------------------------------------


def call_site() -> tuple[str, int]:
    """File and line of the innermost frame outside Kiln: the app code making the call."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(KILN_DIRS) and not name.startswith("<"):
            return name, frame.f_lineno
        frame = frame.f_back
    return "<unknown>", 0


@dataclass
class CallStats:
    calls: int = 0
    seconds: float = 0.0
    cycles: int = 0


@dataclass
class Dispatcher:
    """The ``dispatching`` handler: run each kernel call on ``target``'s artifact."""

    project: Project
    plan: AppPlan
    target: str
    runner: Any = None
    stats: dict[str, CallStats] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    _built: set[str] = field(default_factory=set)
    _prepared: dict[str, Any] = field(default_factory=dict)
    _graphs: dict[str, Any] = field(default_factory=dict)
    _memo: dict[tuple, KernelInstance | None] = field(default_factory=dict)
    _warned: set[tuple] = field(default_factory=set)

    def __post_init__(self) -> None:
        from kiln.tasks.checks.targets import make_runner

        if self.runner is None:
            self.runner = make_runner(self.project, self.target)
        self._planned = {i.name for i in self.plan.instances}
        self._built = set(self._planned)
        self._reached = {r.kernel.path for r in self.plan.reached}

    @property
    def eager(self) -> bool:
        return self.runner.kind == "cpu"

    def __call__(self, fn, args: tuple, kwargs: dict) -> Any:
        import time

        site = call_site()
        try:
            arrays, dtypes = _arguments(fn, args, kwargs)
            inst = self.instance_for(fn, arrays, dtypes, site)
            metrics: dict = {}
            if inst is None or self.eager:
                start = time.perf_counter()
                result = fn.eager(*args, **kwargs)
            else:
                prepared = self._prepare(inst)  # once per instance: not timed
                inputs = [arrays[a.attr("name")] for a in self._graphs[inst.name].args]
                start = time.perf_counter()
                run = self.runner.run(prepared, inputs)
                metrics = run.metrics
                result = run.outputs[0] if len(run.outputs) == 1 else tuple(run.outputs)
        except KilnError as err:
            err.notes.append(
                f"kernel {fn.__name__!r} called at {self._where(site)} "
                f"by app {self.plan.app.name!r} on target {self.target!r}"
            )
            raise
        stats = self.stats.setdefault(inst.name if inst else f"{fn.__name__} (eager)", CallStats())
        stats.calls += 1
        stats.seconds += time.perf_counter() - start
        stats.cycles += int(metrics.get("cycles", 0) or 0)
        return result

    def instance_for(self, fn, arrays: dict, dtypes: dict, site) -> KernelInstance | None:
        """The instance matching the call; one outside the app's build is compiled now, and
        each call site reaching it is a warning. None: not compilable, run eagerly."""
        from kiln.lang.device import check_dims

        check_dims(fn, {n: a.shape for n, a in arrays.items()})
        bindings = _bindings(fn, arrays)
        path = f"{fn.__module__}.{fn.__name__}"
        key = (path, bindings, tuple(sorted(dtypes.items())))
        if key not in self._memo:
            self._memo[key] = self._match(path, bindings, dtypes) or self._new(
                fn, path, bindings, dtypes
            )
        inst = self._memo[key]
        if inst is None:
            self._warn(
                (path, site),
                f"{self._where(site)}: kernel {path} is not a top-level @device function of a "
                "project module, so it cannot be compiled; it ran eagerly on the host",
            )
        elif inst.name not in self._planned:
            self._jit(inst, fn, site, bindings, dtypes)
        return inst

    def _match(self, path: str, bindings, dtypes: dict) -> KernelInstance | None:
        for inst in self.project.instances:
            if inst.source.path != path:
                continue
            spec = self.project.pipeline.kernel(inst.kernel)
            sizes = dict(inst.bindings)
            if all(sizes.get(d) == v for d, v in bindings) and all(
                spec.arg_dtype(a) == t for a, t in dtypes.items()
            ):
                return inst
        return None

    def _jit(self, inst: KernelInstance, fn, site, bindings, dtypes: dict) -> None:
        from kiln.tasks.commands.running import build

        sizes = ", ".join(f"{d}={v}" for d, v in bindings)
        seen = inst.source.path in self._reached
        same_sizes = self._declared_at(inst.source.path, bindings)
        if seen and same_sizes is not None:  # the sizes are declared: the dtypes are not
            spec = self.project.pipeline.kernel(same_sizes.kernel)
            given = ", ".join(f"{a}: {t}" for a, t in dtypes.items())
            built = ", ".join(f"{a}: {spec.arg_dtype(a)}" for a in dtypes)
            why = (
                f"{fn.__name__} is called with {given}, but pipeline.yaml builds it at "
                f"{sizes} for {built} ({same_sizes.name})"
            )
        elif seen:
            why = f"{fn.__name__} is called at {sizes}, which no shape set of pipeline.yaml "
            why += "declares"
        else:
            why = (
                f"this call of {fn.__name__} ({sizes}) was not seen by the static scan of "
                f"app {self.plan.app.name!r}"
            )
        how = (
            "the cpu target runs it eagerly"
            if self.eager
            else f"compiled on first use as {inst.name}"
        )
        if not seen and not inst.shape_set.startswith("jit_"):
            how += " (a shape set pipeline.yaml declares, outside the app's build)"
        self._warn((inst.name, site), f"{self._where(site)}: {why}; {how}")
        if inst.name not in self._built and not self.eager:
            build(self.project, [inst])
        self._built.add(inst.name)

    def _declared_at(self, path: str, bindings) -> KernelInstance | None:
        """A declared instance of the kernel at exactly these sizes, whatever its dtypes."""
        for inst in self.project.instances:
            if (
                inst.source.path == path
                and not inst.shape_set.startswith("jit_")
                and all(dict(inst.bindings).get(d) == v for d, v in bindings)
            ):
                return inst
        return None

    def _warn(self, key: tuple, message: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        self.warnings.append(message)
        print(f"kiln: warning: {message}", file=sys.stderr, flush=True)

    def _where(self, site: tuple[str, int]) -> str:
        return f"{display_path(site[0], self.project.root)}:{site[1]}"

    def _source(self, fn, path: str):
        for inst in self.project.instances:
            if inst.source.path == path:
                return inst.source
        for r in self.plan.reached:
            if r.kernel.path == path:
                return r.kernel
        module_file = Reachability(self.project.root).module_file(fn.__module__)
        if module_file is None:
            return None
        info = self.project.discovery.module(fn.__module__, module_file)
        return next((k for k in info.kernels if k.name == fn.__name__), None)

    def _new(self, fn, path: str, bindings, dtypes: dict) -> KernelInstance | None:
        """A JIT instance named after its bindings (``gemm.jit_M8_K32_N4``)."""
        source = self._source(fn, path)
        if source is None:
            return None
        pipeline = self.project.pipeline
        specs = [s for s in pipeline.kernels if self.project.kernels.get(s.name) == source]
        shape_set = "jit_" + "_".join(f"{d}{v}" for d, v in bindings)
        for spec in specs:
            if all(spec.arg_dtype(a) == t for a, t in dtypes.items()):
                return self.project.add_instance(spec.name, source, shape_set, bindings)
        names = {s.name for s in pipeline.kernels}
        kernel = source.name if source.name not in names else source.path.replace(".", "_")
        values = list(dtypes.values())
        dtype = max(sorted(set(values)), key=values.count) if values else "f32"
        if specs or kernel in names:
            kernel += "_" + "_".join(sorted(set(values)))
        overrides = tuple((a, t) for a, t in dtypes.items() if t != dtype)
        return self.project.add_instance(kernel, source, shape_set, bindings, dtype, overrides)

    def _prepare(self, inst: KernelInstance):
        from kiln.tasks.checks.targets import kernel_artifacts

        if inst.name not in self._prepared:
            artifacts = kernel_artifacts(self.project, inst)
            self._graphs[inst.name] = artifacts.graph
            self._prepared[inst.name] = self.runner.prepare(artifacts)
        return self._prepared[inst.name]

    def summary(self) -> list[str]:
        lines = []
        for name, s in sorted(self.stats.items()):
            text = f"  call {name}: {s.calls}x, {s.seconds * 1000:.1f} ms"
            if s.cycles:
                text += f", {s.cycles} cycles"
            lines.append(text)
        if self.warnings:
            lines.append(f"  {len(self.warnings)} warning(s) above: calls outside the app's build")
        return lines


def _arguments(fn, args: tuple, kwargs: dict) -> tuple[dict, dict]:
    """Arguments by name as contiguous arrays of a kernel dtype, and those dtypes."""
    import numpy as np

    from kiln.errors import TraceError
    from kiln.ir.interp import NUMPY_DTYPES
    from kiln.lang import dtypes as kd

    try:
        bound = fn.signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise TraceError(f"kernel {fn.__name__!r}: {exc}") from None
    arrays, types = {}, {}
    for name, value in bound.arguments.items():
        kind = kd.scalar_kind(value)
        if isinstance(value, np.generic):
            value = np.asarray(value)
        elif kind is not None:
            value = np.asarray(value, dtype=NUMPY_DTYPES[kd.SCALAR_DEFAULT[kind]])
        dtype = kd.eager_input_dtype(value.dtype) if isinstance(value, np.ndarray) else None
        if dtype is None:
            raise TraceError(
                f"argument {name!r} of kernel {fn.__name__!r} must be a numpy array of a kernel "
                f"dtype, got {getattr(value, 'dtype', type(value).__name__)}",
                expected="float32, float16, bfloat16, int32 (or float64/int64, converted)",
            )
        # order="C", not ascontiguousarray: that one turns a 0-d scalar into shape (1,)
        arrays[name] = np.asarray(value, dtype=NUMPY_DTYPES[dtype], order="C")
        types[name] = dtype
    return arrays, types


def _bindings(fn, arrays: dict) -> tuple[tuple[str, int], ...]:
    """(dim, size) in the order the kernel's parameters first name each dim."""
    out: dict[str, int] = {}
    for name, dims in fn.params:
        if name in arrays:
            for dim, size in zip(dims, arrays[name].shape, strict=True):
                if isinstance(dim, str):
                    out.setdefault(dim, int(size))
    return tuple(out.items())
