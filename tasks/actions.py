"""What a compile task does when it runs: one stage, verified, written atomically.

Errors come back to doit as ``TaskFailed`` carrying the diagnostic as JSON,
so the reporter can print it in the user's chosen format with no traceback.
"""

from __future__ import annotations

import importlib
import json
import os
import traceback
from pathlib import Path

from doit.exceptions import TaskFailed
from kiln.tasks.cached import fetch_or_run
from kiln.tasks.importpath import add_project_root

from kiln.errors import KilnError, Location, StageError
from kiln.logconfig import get_logger

DIAGNOSTIC_MARK = "KILN-DIAGNOSTIC "
log = get_logger("stage")


def failure(err: KilnError) -> TaskFailed:
    return TaskFailed(DIAGNOSTIC_MARK + json.dumps(err.to_dict(), sort_keys=True))


def run_stage(spec: dict):
    """Run (or fetch) one stage of one kernel instance; a failure comes back as TaskFailed.

    On success the task's values say where the artifact came from
    (``{"cache": "hit"|"fetched"|"compiled"}``): the reporter counts them.
    """
    try:
        how = fetch_or_run(spec, _run)
    except OptionsError as wrapped:
        err = wrapped.error
        if err.location is None:
            err.location = _pipeline_location(spec, _options_key_paths(spec))
        err.notes.append(f"while running stage {spec['stage']!r} of {spec['instance']}")
        return failure(err)
    except KilnError as err:
        if err.location is None and isinstance(err, StageError):
            # the kernel whose compile failed: its shapes and options live there
            kernel = spec["instance"].split(".")[0]
            err.location = _pipeline_location(spec, [f"kernels.{kernel}"])
        err.notes.append(
            f"while running stage {spec['stage']!r} of {spec['instance']}{_bindings(spec)}"
        )
        return failure(err)
    except OSError as exc:  # full disk, permissions, a file where a directory belongs
        from kiln.errors import environment_error

        err = environment_error(exc)
        err.notes.append(f"while running stage {spec['stage']!r} of {spec['instance']}")
        return failure(err)
    except Exception as exc:  # a bug in a stage: say where, keep the trace out of the way
        detail = traceback.format_exc() if os.environ.get("KILN_DEBUG") else None
        err = KilnError(
            f"internal error in stage {spec['stage']!r} for {spec['instance']}: "
            f"{type(exc).__name__}: {exc}",
            hint="set KILN_DEBUG=1 for the full traceback" if detail is None else None,
            notes=[detail] if detail else [],
        )
        return failure(err)
    return {"cache": how}


def _bindings(spec: dict) -> str:
    """' (M=4, N=5)': the shape set's sizes, beside a trace error they may have caused."""
    bindings = spec.get("trace", {}).get("bindings") or ()
    return " (" + ", ".join(f"{k}={v}" for k, v in bindings) + ")" if bindings else ""


def _run(spec: dict) -> list[str]:
    from kiln.tasks import manifest
    from kiln.tasks.manifest import real_dir

    from kiln.fsutil import remove_stale_tmp, write_bytes_atomic
    from kiln.options import build_options

    add_project_root(spec["root"])
    module = importlib.import_module(spec["module"])
    raw_options = spec["options"]
    if "tuning" in spec:
        from kiln.tune.apply import tuned_options

        raw_options = tuned_options(spec["tuning"], spec["stage"], raw_options)
    try:
        options = build_options(module.Options, raw_options, spec["stage"])
    except KilnError as err:
        raise OptionsError(err) from None
    machine = spec["machine"]
    if "trace" in spec:
        from kiln.stages.trace import TraceRequest

        t = spec["trace"]
        ir_in = TraceRequest(
            module=t["module"],
            function=t["function"],
            bindings=tuple((k, int(v)) for k, v in t["bindings"]),
            dtypes=tuple((k, v) for k, v in t["dtypes"]),
            default_dtype=t["default_dtype"],
        )
    else:
        ir_in = importlib.import_module(spec["input_module"]).read(Path(spec["input"]))
    # a stage may also write side artifacts (source maps for the report) next to
    # its artifact; they are no task target, so they never decide what reruns
    if hasattr(module, "run_with_side_artifacts"):
        ir_out, side = module.run_with_side_artifacts(ir_in, options, machine)
    else:
        ir_out, side = module.run(ir_in, options, machine), {}
    if "build" in spec and hasattr(ir_out, "with_metadata"):
        ir_out = ir_out.with_metadata(_build_metadata(spec["build"]))
    module.verify(ir_out, machine)
    artifact = Path(spec["artifact"])
    instance_dir = artifact.parent
    remove_stale_tmp(instance_dir)
    changed = write_bytes_atomic(artifact, module.serialize(ir_out))
    log.info(
        "%s %s: %s %s",
        spec["instance"],
        spec["stage"],
        "wrote" if changed else "unchanged (early cutoff)",
        artifact,
    )
    for name, data in side.items():
        write_bytes_atomic(artifact.parent / name, data)
    for kind, path in spec["dumps"]:
        dump = Path(path)
        real_dir(dump.parent, instance_dir)  # never write through a symlink in the out dir
        if dump.is_symlink():
            dump.unlink()
        module.DUMPS[kind](ir_out, dump, machine)
    manifest.forget_index(os.path.join(spec["root"], ".kiln"))
    manifest.record(
        str(instance_dir),
        [str(artifact), *(p for _, p in spec["dumps"])],
        sides=[str(artifact.parent / name) for name in side],
    )
    return list(side)  # the side artifacts' names: the cache stores them with the artifact


def _build_metadata(build: dict) -> dict:
    """Source and compiler fingerprints for the binary's metadata.

    The source is fingerprinted by its traced graph, not its text: a
    comment edit does not change what the binary was built from.
    """
    import hashlib

    graph = Path(build["graph"])
    source = hashlib.sha256(graph.read_bytes()).hexdigest() if graph.is_file() else None
    return {
        "source": {"kernel": build["kernel"], "shapes": build["shapes"]},
        "hashes": {"source_graph_sha256": source, "compiler_sha256": build["compiler"]},
    }


class OptionsError(Exception):
    """A stage option from pipeline.yaml was rejected (carries the user-facing error)."""

    def __init__(self, error: KilnError):
        super().__init__(error.message)
        self.error = error


def _options_key_paths(spec: dict) -> list[str]:
    """Where the failing stage's options are written: the kernel's override, then the row."""
    kernel = spec["instance"].split(".")[0]
    return [f"kernels.{kernel}.options.{spec['stage']}", f"stages[{spec['stage_index']}].options"]


def _pipeline_location(spec: dict, key_paths: list[str]) -> Location | None:
    """The first of ``key_paths`` written in pipeline.yaml (the last one as a fallback)."""
    try:
        from kiln.pipeline import load_pipeline

        pipeline = load_pipeline(Path(spec["pipeline"]))
        for key in key_paths:
            loc = pipeline.locate(key)
            if loc.key_path == key and _written(pipeline, key):
                return loc
        return pipeline.locate(key_paths[-1])
    except Exception:
        return Location(spec["pipeline"], key_path=key_paths[-1])


def _written(pipeline, key: str) -> bool:
    """Whether ``key`` itself (not only a parent) appears in the file."""
    try:
        exact = pipeline.locate(key)
        parent = pipeline.locate(key.rsplit(".", 1)[0])
        return (exact.line, exact.column) != (parent.line, parent.column)
    except Exception:
        return False
