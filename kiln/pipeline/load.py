"""Load pipeline.yaml: parse with positions, validate, normalize, check references.

``load_pipeline`` does the full job; ``load_pipeline_cached`` keeps a pickle
of the result so that a no-op build neither parses YAML nor imports
jsonschema. Every problem is a PipelineError at the offending key.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import sys
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.pipeline.defaults import LayeredSourceMap, defaults_digest, load_defaults, merge
from kiln.pipeline.model import Pipeline
from kiln.pipeline.schema import check_finite, validate_schema
from kiln.pipeline.yamlpos import describe, did_you_mean, load_yaml

if TYPE_CHECKING:
    from kiln.pipeline.yamlpos import SourceMap

    Positions = SourceMap | LayeredSourceMap  # a file's positions, or pipeline.yaml's + Kiln's

BUILTIN_RUNNERS = ("cpu", "sim", "iree", "npu")
_CACHE_FORMAT = 3  # bump when the pickled model changes shape
# Any failure to read the cache means it is unusable: a length prefix no memory can hold
# (MemoryError, OverflowError), nesting deeper than the stack (RecursionError), a class
# that moved (AttributeError, ImportError), garbage (UnpicklingError, ValueError, ...).
# The cache only saves work, so none of them is the user's error.
_UNUSABLE_CACHE = Exception


def load_pipeline(path: str | os.PathLike[str]) -> Pipeline:
    """Read pipeline.yaml, merge it over Kiln's defaults, validate and normalize the result.

    Raises PipelineError on any problem, at its line in pipeline.yaml (or in
    Kiln's defaults file, for a built-in value).
    """
    path = Path(os.path.abspath(path))
    data, smap = load_yaml(path)
    if data is None:
        smap.values[""] = (1, 1)
        raise smap.error(
            "pipeline file is empty",
            "",
            expected="a mapping with keys project, packages and kernels",
            found="an empty document",
        )
    if not isinstance(data, dict):
        raise smap.error(
            "the top level of the pipeline must be a mapping",
            "",
            value=True,
            expected="a mapping (`project: ...`, `kernels: ...`)",
            found=describe(data),
        )
    defaults, defaults_map = load_defaults()
    data, builtin = merge(data, defaults)
    layered = LayeredSourceMap(smap, defaults_map, builtin)
    validate_schema(data, layered)
    _check_references(data, layered, path.parent)
    check_finite(data, layered)  # after the references: cache.timeout says it its own way
    return Pipeline.from_data(data, path, layered, builtin)


def load_pipeline_cached(
    path: str | os.PathLike[str], cache_dir: str | os.PathLike[str]
) -> Pipeline:
    """``load_pipeline`` with a pickle in ``cache_dir`` keyed by the file's stat.

    The key is ``cache_key(path)``; a hit returns without reading YAML. A
    miss loads, validates and writes the pickle atomically. Stage module
    lookups are not redone on a hit.
    """
    path = Path(os.path.abspath(path))
    try:
        key = cache_key(path)
    except OSError:
        return load_pipeline(path)  # raises the proper "not found" error
    cache_file = Path(cache_dir) / f"pipeline-{zlib.crc32(str(path).encode()):08x}.pickle"
    try:
        with open(cache_file, "rb") as handle:
            cached_key, pipeline = pickle.load(handle)
    except FileNotFoundError:  # never written (or removed): not damage
        cached_key = pipeline = None
    except _UNUSABLE_CACHE as exc:  # corrupt, truncated or foreign: never used, rebuilt
        from kiln.statefiles import quarantine

        quarantine(cache_file, f"{type(exc).__name__}: {exc}")
        cached_key = pipeline = None
    if cached_key == key and isinstance(pipeline, Pipeline):
        return pipeline
    pipeline = load_pipeline(path)
    _write_atomic(cache_file, pickle.dumps((key, pipeline), protocol=pickle.HIGHEST_PROTOCOL))
    return pipeline


def cache_key(path: Path) -> tuple[Any, ...]:
    """What a cached parse of ``path`` is valid for: the file, and the code that parsed it.

    (absolute path, mtime_ns, ctime_ns, inode, size, kiln version, loader
    stamp, sha256 of the defaults file): the built-in defaults are part of
    every resolved pipeline, so changing one must not reuse an old parse.
    Raises OSError when the file cannot be stat'ed.
    """
    stat = os.stat(path)
    return (
        str(path),
        stat.st_mtime_ns,
        stat.st_ctime_ns,
        stat.st_ino,
        stat.st_size,
        _kiln_version(),
        _loader_stamp(),
        defaults_digest(),
    )


def _kiln_version() -> str:
    return str(getattr(sys.modules.get("kiln"), "__version__", "0"))


def _loader_stamp() -> tuple[int, ...]:
    here = Path(__file__).parent
    names = (
        "load.py",
        "model.py",
        "yamlpos.py",
        "defaults.py",
        "schema.py",
        "pipeline.schema.json",
    )
    return (_CACHE_FORMAT, *(os.stat(here / name).st_mtime_ns for name in names))


def _write_atomic(target: Path, payload: bytes) -> None:
    import tempfile

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(  # the pid in the name lets a later run clean up after a kill
            dir=target.parent, prefix=f"{target.name}.{os.getpid()}.", suffix=".tmp"
        )
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(payload)
            os.replace(tmp, target)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:  # a cache that cannot be written only costs speed
        pass


# -- schema validation -----------------------------------------------------------


# -- references and other checks the schema cannot express ---------------------------


def _plugin_runner_name(runner: str) -> bool:
    """Whether ``runner`` may name a runner plugin: a dotted or ``:`` name (checked when
    the target runs), or a plain name some installed package registers. Only a plain
    name that is not Kiln's reads the installed packages' entry points: a typo of a
    built-in runner is caught here, at its line, while the pipeline loads."""
    if "." in runner or ":" in runner:
        return True
    from importlib.metadata import entry_points

    return any(ep.name == runner for ep in entry_points(group="kiln.runners"))


def _unknown(smap: Positions, what: str, name: str, key_path: str, choices: Any, **kw: Any) -> Any:
    """A "names something that does not exist" error with a did-you-mean hint."""
    kw.setdefault("value", True)
    kw.setdefault("expected", "one of: " + (", ".join(choices) or "(none declared)"))
    kw.setdefault("hint", did_you_mean(name, choices))
    message = f"unknown {what} '{name}'" + kw.pop("context", "")
    return smap.error(message, key_path, found=repr(name), **kw)


def _check_references(data: dict[str, Any], smap: Positions, root: Path) -> None:
    if not data["kernels"] and not data.get("apps"):  # an app's calls compile on first use
        raise smap.error(
            "'kernels' declares no kernel, so there is nothing to build",
            "kernels",
            value=True,
            expected="at least one kernel, such as `gemm: {shapes: {M: 64}}`",
            found="an empty mapping",
            hint="name a @device function of your packages under `kernels:`",
        )
    machines = data.get("machines") or {}
    stages: dict[str, int] = {}
    for i, stage in enumerate(data["stages"]):
        if stage["name"] in stages:
            first = stages[stage["name"]]
            raise smap.error(
                f"duplicate stage name '{stage['name']}'",
                f"stages[{i}].name",
                value=True,
                expected="each stage name once in `stages:`",
                found=f"'{stage['name']}' again (first at stages[{first}])",
            )
        stages[stage["name"]] = i
    named = [("machine", data.get("machine"))]
    for name, spec in data["kernels"].items():
        _check_shapes(name, spec.get("shapes") or {}, smap)
        _check_inputs(name, spec, smap)
        _check_fuzz(name, spec.get("fuzz") or {}, smap)
        _check_dtype_list(name, spec, data["kernels"], smap)
        named.append((f"kernels.{name}.machine", spec.get("machine")))
        for stage in spec.get("options") or {}:
            if stage not in stages:
                key_path, context = f"kernels.{name}.options.{stage}", f" in options of '{name}'"
                raise _unknown(smap, "stage", stage, key_path, stages, value=False, context=context)
    for i, dump in enumerate(data.get("dumps") or []):
        for j, kernel in enumerate(dump["kernels"]):
            if kernel not in data["kernels"]:
                raise _unknown(
                    smap,
                    "kernel",
                    kernel,
                    f"dumps[{i}].kernels[{j}]",
                    data["kernels"],
                    expected="a kernel declared under `kernels:`",
                    context=" in dumps",
                )
    for name, target in (data.get("targets") or {}).items():
        runner = target["runner"]
        if runner not in BUILTIN_RUNNERS and not _plugin_runner_name(runner):
            raise _unknown(
                smap,
                "runner",
                runner,
                f"targets.{name}.runner",
                BUILTIN_RUNNERS,
                expected="one of: "
                + ", ".join(BUILTIN_RUNNERS)
                + ", or the name of a plugin registered in the 'kiln.runners' entry-point group",
                context=f" for target '{name}'",
            )
        named.append((f"targets.{name}.machine", target.get("machine")))
    for key_path, machine in named:
        if machine is not None and machine not in machines:
            raise _unknown(
                smap,
                "machine",
                machine,
                key_path,
                machines,
                expected="a machine declared under `machines:` or built in: " + ", ".join(machines),
                hint=did_you_mean(machine, machines) or "declare it under a `machines:` section",
            )
    for i, stage in enumerate(data["stages"]):
        legacy = LEGACY_STAGE_MODULES.get(stage["module"])
        if legacy is not None and not _project_has_module(root, stage["module"]):
            line = (smap.position(f"stages[{i}].module", value=True) or (0, 0))[0]
            data.setdefault("_warnings", []).append(
                f"{Path(smap.file).name}:{line}: stages[{i}].module: "
                f"'{stage['module']}' is the old name of a built-in stage; write "
                f"'{legacy}' (the old name stops working in the next release)"
            )
            stage["module"] = legacy
        problem = _find_module(stage["module"], root)
        if problem is not None:
            raise smap.error(
                f"stage '{stage['name']}' names a module that cannot be found",
                f"stages[{i}].module",
                value=True,
                found=f"'{stage['module']}': {problem}",
                expected=f"an importable module (searched sys.path and {root})",
            )
    _check_stage_kinds(data["stages"], smap, root)
    _check_cache(data.get("cache") or {}, smap)
    _check_paths(data, smap)


def _path_fields(data: dict[str, Any]) -> list[tuple[str, Any]]:
    """(key path, value) of every file or directory path the file writes (modules aside)."""
    fields = [
        ("out_dir", data.get("out_dir")),
        ("tuning.file", (data.get("tuning") or {}).get("file")),
    ]
    for name, app in (data.get("apps") or {}).items():
        fields += [
            (f"apps.{name}.tests[{i}]", test) for i, test in enumerate(app.get("tests") or [])
        ]
    return fields


def _check_paths(data: dict[str, Any], smap: Positions) -> None:
    """A path holds no NUL: the operating system refuses one (a ValueError, deep in a build)."""
    for key_path, value in _path_fields(data):
        if isinstance(value, str) and "\0" in value:
            raise smap.error(
                f"'{key_path}' is not a usable path: it contains a NUL character",
                key_path,
                value=True,
                expected="a path without NUL characters",
                found=repr(value),
                hint="remove the \\x00 (or \\0) escape from the string",
            )


def _check_cache(cache: dict[str, Any], smap: Positions) -> None:
    """What the schema cannot say about ``cache:``: a usable URL, a finite timeout."""
    import math

    timeout = cache.get("timeout")
    if isinstance(timeout, float) and not math.isfinite(timeout):
        raise smap.error(
            "the remote cache timeout is not a number of seconds",
            "cache.timeout",
            value=True,
            expected="a number of seconds above 0, at most 3600",
            found=str(timeout),
        )
    remote = cache.get("remote")
    if isinstance(remote, str):
        from kiln.cache.config import remote_url_problem

        problem = remote_url_problem(remote)
        if problem is not None:
            raise smap.error(
                f"the remote cache URL cannot be used: {problem[0]}",
                "cache.remote",
                value=True,
                expected="file:///shared/dir, /shared/dir or s3://bucket/prefix",
                found=repr(remote),
                hint=problem[1],
            )


_STAGE_CONSTANT = r"""^{name}\s*=\s*["']([^"']+)["']"""
FIRST_STAGE_INPUT = "kernel source"


def _check_stage_kinds(stages: list[dict[str, Any]], smap: Positions, root: Path) -> None:
    """Each stage is a Kiln stage module, and reads what the row before it writes.

    Read from the module's source (``ARTIFACT``, ``INPUT``, ``def run``)
    without running it: `module: os` or two swapped rows are errors at
    their line here, not an AttributeError inside a build.
    """
    import re

    previous: str | None = None
    for i, stage in enumerate(stages):
        origin, source = _module_source(stage["module"], root)
        stdlib = stage["module"].split(".")[0] in sys.stdlib_module_names
        if source is None and not stdlib:  # a compiled module: nothing to read
            previous = None
            continue
        source = source or ""
        artifact = re.search(_STAGE_CONSTANT.format(name="ARTIFACT"), source, re.M)
        # A library module that is no stage is a mistake; a module of the project
        # without ARTIFACT may be a stage in the making: the stage check that imports
        # it (tasks/model/options_check.py, cached by its code) says what is missing.
        library = stdlib or any(d in (origin or "") for d in ("site-packages", "dist-packages"))
        if library and artifact is None:
            raise smap.error(
                f"stage '{stage['name']}' names a module that is not a Kiln stage",
                f"stages[{i}].module",
                value=True,
                expected="a stage module: ARTIFACT = 'file name', Options, run(), read(), "
                "serialize(), verify()",
                found=f"'{stage['module']}', "
                + ("a Python standard library module" if stdlib else "which defines no ARTIFACT"),
                hint="see docs/stages.md for what a stage module defines",
            )
        wanted = re.search(_STAGE_CONSTANT.format(name="INPUT"), source, re.M)
        given = FIRST_STAGE_INPUT if i == 0 else previous
        if wanted is not None and given is not None and wanted.group(1) != given:
            before = "the kernel source" if i == 0 else f"stage '{stages[i - 1]['name']}'"
            raise smap.error(
                f"stage '{stage['name']}' cannot follow {before}",
                f"stages[{i}].module",
                value=True,
                expected=f"a stage that reads {given}",
                found=f"'{stage['module']}', which reads {wanted.group(1)}",
                hint="stages run in the order listed: trace, visa, lir, schedule, edf",
            )
        previous = artifact.group(1) if artifact else None


def _module_source(module: str, root: Path) -> tuple[str | None, str | None]:
    """(file, source text) of ``module``, found without running it; None for what is not."""
    root_text = str(root)
    added = root_text not in sys.path
    if added:
        sys.path.insert(0, root_text)
    try:
        spec = importlib.util.find_spec(module)
        origin = spec.origin if spec is not None else None
        if not origin or not origin.endswith(".py"):
            return origin, None
        return origin, Path(origin).read_text(encoding="utf-8", errors="replace")
    except (ImportError, ValueError, OSError):
        return None, None
    finally:
        if added:
            sys.path.remove(root_text)


def _check_shapes(kernel: str, shapes: dict[str, Any], smap: Positions) -> None:
    base = f"kernels.{kernel}.shapes"
    flat = [isinstance(v, int) for v in shapes.values()]
    if any(flat) and not all(flat):
        odd = next(k for k, f in zip(shapes, flat, strict=True) if f != flat[0])
        raise smap.error(
            f"kernel '{kernel}' mixes flat dims and named shape sets",
            f"{base}.{odd}",
            value=True,
            expected="either `{dim: size, ...}` or `{set: {dim: size, ...}, ...}`",
            found=describe(shapes[odd]),
        )
    if all(flat):
        for dim in shapes:
            if not dim.isidentifier():
                raise smap.error(
                    f"invalid dim name '{dim}'",
                    f"{base}.{dim}",
                    expected="a Python identifier such as M or K",
                    found=repr(dim),
                )


def _check_inputs(kernel: str, spec: dict[str, Any], smap: Positions) -> None:
    """Each input spec holds a value to draw (low < high, ...): an error at its line.

    What needs the kernel's signature (an unknown argument, a float
    distribution for an i32 argument, a .npy file's shape) is checked when
    the kernel packages are scanned (tasks/model/project.py).
    """
    base = f"kernels.{kernel}"
    written = [(f"{base}.inputs", spec.get("inputs") or {})]
    for set_name, dims in (spec.get("shapes") or {}).items():
        if isinstance(dims, dict) and isinstance(dims.get("inputs"), dict):
            written.append((f"{base}.shapes.{set_name}.inputs", dims["inputs"]))
    if not any(specs for _, specs in written):
        return
    from kiln.inputs import spec_problem

    for key_path, specs in written:
        for arg, input_spec in specs.items():
            problem = spec_problem(input_spec)
            if problem is not None:
                where = f"{key_path}.{arg}" + (f".{problem.key}" if problem.key else "")
                raise smap.error(
                    f"argument '{arg}' of kernel '{kernel}': {problem.message}",
                    where,
                    value=True,
                    expected=problem.expected,
                    found=problem.found,
                    hint=problem.hint,
                )


def _check_fuzz(kernel: str, ranges: dict[str, Any], smap: Positions) -> None:
    """Each ``fuzz:`` range is ``[low, high]`` with low <= high: an error at its line."""
    for dim, size in ranges.items():
        if isinstance(size, list) and size[0] > size[1]:
            raise smap.error(
                f"fuzz range of dim '{dim}' of kernel '{kernel}' is empty: low {size[0]} "
                f"is above high {size[1]}",
                f"kernels.{kernel}.fuzz.{dim}",
                value=True,
                expected="[low, high] with 1 <= low <= high (both included), or one size",
                found=f"[{size[0]}, {size[1]}]",
                hint=f"write [{size[1]}, {size[0]}]",
            )


def _check_dtype_list(kernel: str, spec: dict[str, Any], kernels: dict, smap: Positions) -> None:
    """A list of dtypes makes ``<kernel>_<dtype>`` kernels: none may clash with an entry."""
    from kiln.pipeline.model import dtype_list_name

    dtypes = spec.get("dtype")
    if not isinstance(dtypes, list):
        return
    for i, dtype in enumerate(dtypes):
        name = dtype_list_name(kernel, dtype)
        if name in kernels:
            raise smap.error(
                f"kernel '{kernel}' with dtype {dtype} is named '{name}', like another entry",
                f"kernels.{kernel}.dtype[{i}]",
                value=True,
                expected=f"no entry named '{name}' beside a dtype list on '{kernel}'",
                found=f"kernels.{name}",
                hint=f"rename the entry '{name}' (and give it `function:` if it is an alias)",
            )


# Built-in stages moved under Kiln's own namespace: the old top-level names
# keep working for one release, with a warning.
LEGACY_STAGE_MODULES = {
    f"stages.{name}": f"kiln.stages.{name}" for name in ("trace", "visa", "lir", "schedule", "edf")
}


def _project_has_module(root: Path, module: str) -> bool:
    """True when the project itself defines ``module`` (a user's own ``stages/trace.py``).

    Kiln's own repository is a project too: its ``stages/`` *is* the
    built-in package, which does not count as the user's.
    """
    candidate = root.joinpath(*module.split(".")).with_suffix(".py")
    if not candidate.is_file():
        return False
    spec = importlib.util.find_spec(LEGACY_STAGE_MODULES[module])
    return spec is None or Path(spec.origin).resolve() != candidate.resolve()


def _find_module(module: str, root: Path) -> str | None:
    """Why ``module`` cannot be imported from sys.path plus ``root``; None if it can.

    Uses find_spec, so the module itself is not executed (its parent
    packages are imported, as Python must to find it).
    """
    root_text = str(root)
    added = root_text not in sys.path
    if added:
        sys.path.insert(0, root_text)
    try:
        for attempt in range(2):
            try:
                spec = importlib.util.find_spec(module)
            except ModuleNotFoundError as exc:
                spec, missing = None, f"package '{exc.name}' not found"
            except Exception as exc:  # noqa: BLE001 - a parent package's __init__ can raise anything
                return f"{type(exc).__name__} while importing its package: {exc}"
            else:
                missing = "no such module"
            if spec is not None:
                return None
            if attempt == 0:  # a module created a moment ago may hide behind stale finder caches
                importlib.invalidate_caches()
        return missing
    finally:
        if added:
            sys.path.remove(root_text)
