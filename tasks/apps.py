"""Apps: programs that call kernels. Build what they reach, then run or test them on a target.

``plan_app`` scans the app (``tasks.reach``) and picks the instances of the
kernels it reaches; those are built through the ordinary compile tasks.
While the app runs, a :class:`Dispatcher` receives every ``@device`` call
(``kiln.lang.device.dispatching``), picks the built instance whose shapes
and dtypes match the arguments and runs it on the target. A call the scan
did not see, or at shapes no shape set declares, is compiled on first use
(JIT) through the same tasks and reported as a warning naming the call site.
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.errors import KilnError, Location, TargetError
from kiln.pipeline import AppSpec
from tasks.project import KernelInstance, Project
from tasks.reach import Reachability, Reached, display_path, has_main

_KILN_DIRS = tuple(
    str(Path(__file__).resolve().parents[1] / pkg) + os.sep
    for pkg in ("kiln", "tasks", "stages", "runners")
)


@dataclass
class AppPlan:
    """What building one app means: the kernels it reaches and their instances."""

    app: AppSpec
    file: Path
    reached: list[Reached]
    instances: list[KernelInstance]
    undeclared: list[Reached]  # reached, but pipeline.yaml builds no such kernel


def app_names(project: Project) -> list[str]:
    return [a.name for a in project.pipeline.apps]


def plan_app(project: Project, name: str) -> AppPlan:
    """Scan app ``name``; a missing module, a syntax error or no ``main`` is a KilnError."""
    pipeline = project.pipeline
    try:
        app = pipeline.app(name)
    except KeyError:
        close = difflib.get_close_matches(name, app_names(project), n=1)
        raise KilnError(
            f"no app {name!r} in pipeline.yaml",
            expected="one of: " + (", ".join(app_names(project)) or "(no apps declared)"),
            found=name,
            hint=f"did you mean {close[0]!r}?" if close else None,
        ) from None
    reach = Reachability(project.root, project.discovery)
    file = reach.module_file(app.module)
    if file is None:
        rel = Path(*app.module.split("."))
        raise KilnError(
            f"app {name!r}: module {app.module!r} does not exist",
            location=pipeline.locate(f"apps.{name}.module", value=True),
            expected=f"a file {rel}.py or {rel}/__init__.py under {project.root}",
            found=app.module,
        )
    if not has_main(reach, app.module):
        scan = reach.scan(app.module)
        names = sorted(n for n in scan.bindings if not n.startswith("_"))
        raise KilnError(
            f"app {name!r} has no main() function",
            location=Location(display_path(file, project.root)),
            expected=f"a top-level `def main():` in {display_path(file, project.root)}, "
            "returning the outputs to print",
            found="top-level names: " + (", ".join(names) or "(none)"),
        )
    reached = reach.reach(app.module)
    paths = {r.kernel.path for r in reached}
    instances = [i for i in project.instances if i.source.path in paths]
    built = {i.source.path for i in instances}
    undeclared = [r for r in reached if r.kernel.path not in built]
    return AppPlan(app, file, reached, instances, undeclared)


def describe_plan(project: Project, plan: AppPlan) -> str:
    root = project.root
    lines = [
        f"kiln: app {plan.app.name!r} ({display_path(plan.file, root)}) reaches "
        f"{len(plan.reached)} kernel{'s' if len(plan.reached) != 1 else ''}"
        + (":" if plan.reached else "")
    ]
    for r in plan.reached:
        names = [i.name for i in plan.instances if i.source.path == r.kernel.path]
        builds = ", ".join(names) if names else "nothing yet: not in pipeline.yaml `kernels:`"
        lines.append(f"  {r.kernel.path} -> {builds}")
        lines.append(f"      {r.reason(root)}")
    return "\n".join(lines)


# -- dispatch ------------------------------------------------------------------


def call_site() -> tuple[str, int]:
    """File and line of the innermost frame outside Kiln: the app code making the call."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_KILN_DIRS) and not name.startswith("<"):
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
        from tasks.running import make_runner

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
            self._jit(inst, fn, site, bindings)
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

    def _jit(self, inst: KernelInstance, fn, site, bindings) -> None:
        from tasks.running import build

        sizes = ", ".join(f"{d}={v}" for d, v in bindings)
        seen = inst.source.path in self._reached
        why = (
            f"{fn.__name__} is called at {sizes}, which no shape set of pipeline.yaml declares"
            if seen
            else f"this call of {fn.__name__} ({sizes}) was not seen by the static scan of "
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
        from tasks.running import kernel_artifacts

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
        dtype = kd.EAGER_INPUTS.get(value.dtype) if isinstance(value, np.ndarray) else None
        if dtype is None:
            raise TraceError(
                f"argument {name!r} of kernel {fn.__name__!r} must be a numpy array of a kernel "
                f"dtype, got {getattr(value, 'dtype', type(value).__name__)}",
                expected="float32, float16, bfloat16, int32 (or float64/int64, converted)",
            )
        arrays[name] = np.ascontiguousarray(value, dtype=NUMPY_DTYPES[dtype])
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


# -- running ---------------------------------------------------------------------


def _check_target(project: Project, target: str):
    from tasks.running import make_runner

    runner = make_runner(project, target)  # an unknown target is an error before any build
    return runner


def _import_app(project: Project, plan: AppPlan):
    root = str(project.root)
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module(plan.app.module)


def _app_traceback(exc: BaseException) -> str:
    """The exception's traceback without Kiln's own frames above the app's code."""
    tb = traceback.TracebackException.from_exception(exc)
    frames = list(tb.stack)
    while frames and (
        frames[0].filename.startswith(_KILN_DIRS)
        or frames[0].filename.startswith("<frozen importlib")
        or frames[0].filename == importlib.__file__
    ):
        frames.pop(0)
    tb.stack = traceback.StackSummary.from_list(frames)
    return "".join(tb.format())


class AppFailed(Exception):
    """The app's own code raised: the traceback is printed, kiln exits 1."""


def call_app(project: Project, plan: AppPlan, dispatcher: Dispatcher | None) -> Any:
    """Import the app and run ``main()`` with kernel calls going to ``dispatcher``."""
    from kiln.lang.device import dispatching

    name = plan.app.name
    with dispatching(dispatcher):
        stage = "while importing it"
        try:
            module = _import_app(project, plan)
            main = getattr(module, "main", None)
            if not callable(main):
                raise KilnError(
                    f"app {name!r} has no main() function",
                    location=Location(display_path(plan.file, project.root)),
                    expected="a callable `main` at the top level of " + plan.app.module,
                )
            stage = "in main()"
            return main()
        except KilnError:
            raise
        except Exception as exc:
            sys.stderr.write(_app_traceback(exc))
            message = f"app {name!r} raised {type(exc).__name__}: {exc} ({stage})"
            print(f"error: {message}; its traceback is above", file=sys.stderr)
            raise AppFailed(message) from None


def flatten_outputs(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Named leaves of what main returned: dict keys and sequence indices, joined by '.'."""
    if isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(value)]
    elif value is None:
        return []
    else:
        return [(prefix or "out", value)]
    out = []
    for key, item in items:
        out.extend(flatten_outputs(item, f"{prefix}.{key}" if prefix else key))
    return out


def describe_output(name: str, value: Any) -> str:
    import numpy as np

    from kiln.inputs import describe

    array = np.asarray(value) if isinstance(value, (np.ndarray, np.generic, int, float)) else None
    if array is None or array.dtype.kind not in "biuf":
        return f"  out {name}: {value!r}"[:200]
    try:
        d = describe(array)
    except KeyError:  # a dtype Kiln does not name (e.g. float64 from the app's own numpy)
        d = describe(array.astype(np.float64))
        d["dtype"] = str(array.dtype)
    label = "  out" if name == "out" else f"  out {name}"
    if d["min"] is None:
        return f"{label}: {d['dtype']}{d['shape']}  (no finite values)"
    return (
        f"{label}: {d['dtype']}{d['shape']}  min {d['min']:.6g}  max {d['max']:.6g}"
        f"  mean {d['mean']:.6g}  std {d['std']:.6g}"
        + (f"  non-finite {d['nonfinite']}" if d["nonfinite"] else "")
    )


def save_outputs(outputs: list[tuple[str, Any]], directory: Path) -> list[Path]:
    import numpy as np

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, value in outputs:
        path = directory / (re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".npy")
        np.save(path, np.asarray(value))
        written.append(path)
    return written


def run_app(project: Project, name: str, target: str, save_dir: Path | None = None) -> int:
    """`kiln run APP`: build what the app reaches, run main() on ``target``, print its outputs."""
    from tasks.running import build

    plan = plan_app(project, name)
    runner = _check_target(project, target)
    reason = runner.unavailable()
    if reason:
        raise TargetError(f"target {target!r} cannot run here: {reason}")
    print(describe_plan(project, plan), flush=True)
    if plan.instances:
        build(project, plan.instances)
    dispatcher = Dispatcher(project, plan, target, runner)
    try:
        result = call_app(project, plan, dispatcher)
    except AppFailed:
        return 1
    outputs = flatten_outputs(result)
    print(f"app {name} on {target}: main() returned {len(outputs)} output(s)")
    for out_name, value in outputs:
        print(describe_output(out_name, value))
    for line in dispatcher.summary():
        print(line)
    if save_dir is not None:
        written = save_outputs(outputs, save_dir)
        print(f"  saved {len(written)} output(s) to {save_dir}")
    return 0


def test_app(project: Project, name: str, targets: list[str], junit: Path | None = None) -> int:
    """`kiln test APP`: the app's declared tests, in-process under pytest, once per target."""
    from tasks.running import build
    from tasks.testing import default_targets

    plan = plan_app(project, name)
    where = f"apps.{name}.tests"
    if not plan.app.tests:
        raise KilnError(
            f"app {name!r} declares no tests",
            location=project.pipeline.locate(f"apps.{name}"),
            hint=f"add `tests: [apps/tests/test_{name}.py]` to the app in pipeline.yaml",
        )
    tests = [project.root / t for t in plan.app.tests]
    missing = [t for t in plan.app.tests if not (project.root / t).exists()]
    if missing:
        raise KilnError(
            f"app {name!r}: test file {missing[0]!r} does not exist",
            location=project.pipeline.locate(where, value=True),
            expected=f"paths relative to {project.root}",
            found=", ".join(missing),
        )
    try:
        import pytest
    except ImportError:
        raise KilnError(
            "kiln test APP runs the app's tests with pytest, which is not installed",
            hint="pip install 'kiln[test]'",
        ) from None
    targets = targets or default_targets(project)
    runners = {t: _check_target(project, t) for t in targets}
    print(describe_plan(project, plan), flush=True)
    if plan.instances:
        build(project, plan.instances)
    root = str(project.root)
    if root not in sys.path:
        sys.path.insert(0, root)
    results = {}
    for target, runner in runners.items():
        reason = runner.unavailable()
        if reason:
            print(f"SKIPPED app {name} @ {target}: {reason}", flush=True)
            results[target] = "skipped"
            continue
        dispatcher = Dispatcher(project, plan, target, runner)
        argv = ["-q", "-p", "no:cacheprovider", "--rootdir", root, *map(str, tests)]
        if junit is not None:
            path = junit if len(runners) == 1 else junit.with_stem(f"{junit.stem}-{target}")
            argv.append(f"--junitxml={path}")
        print(f"kiln test {name} @ {target}: pytest {' '.join(plan.app.tests)}", flush=True)
        from kiln.lang.device import dispatching

        with dispatching(dispatcher):
            code = int(pytest.main(argv))
        for line in dispatcher.summary():
            print(line)
        results[target] = "pass" if code == 0 else f"fail (pytest exit code {code})"
        if code == 0 and not dispatcher.stats:
            print(f"  note: the tests made no kernel call, so nothing ran on {target}")
    print(f"kiln test {name}: " + ", ".join(f"{t} {r}" for t, r in results.items()))
    return 1 if any(r.startswith("fail") for r in results.values()) else 0


def status_app(project: Project, name: str, show_all: bool = False) -> int:
    """`kiln status APP`: the kernels the app reaches, and why each would rebuild."""
    from tasks.status import explain

    plan = plan_app(project, name)
    print(describe_plan(project, plan))
    results = explain(project, plan.instances) if plan.instances else []
    for task, reasons in results:
        if reasons:
            print(f"{task}: would run")
            for reason in reasons:
                print(f"    {reason}")
        elif show_all:
            print(f"{task}: up to date")
    pending = sum(1 for _, r in results if r)
    print(f"kiln: {pending} of {len(results)} tasks of app {name!r} would run")
    return 0
