"""`kiln config`: the pipeline Kiln builds, pipeline.yaml merged over the built-in defaults.

Each top-level entry (a scalar setting, a kernel, a stage, a machine, a
target, ...) says where it came from: ``pipeline.yaml:LINE`` or ``built-in
default``. The human form is YAML that loads back to the same data, with the
origins as comments, after the file, the directories Kiln uses (out dir,
state dir, cache dir, remote cache) and the project's schema copy; ``--json``
gives ``{"file", "directories", "schema", "pipeline", "origins", "environment"}``.
``--schema`` writes the project's copy of pipeline.yaml's JSON Schema.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from kiln.pipeline import KernelSpec, Pipeline
from kiln.pipeline.defaults import BUILTIN
from kiln.pipeline.yamlpos import child_path, display_name

# sections whose entries are listed one by one, each with its own origin
NAMED = ("kernels", "machines", "targets", "apps")
LISTED = ("stages", "dumps")
NESTED = ("cache", "tuning", "executor")  # small mappings of settings: one origin per key
COMMENT_COLUMN = 44
LINE_WIDTH = 100  # a value longer than this on one line is written as a block


# Environment variables that change what a build does, and the setting each one wins over.
ENVIRONMENT_OVERRIDES = {
    "KILN_OUT_DIR": "out_dir",
    "KILN_CACHE": "cache (0 turns the artifact cache off)",
    "KILN_CACHE_DIR": "the local store and IREE's vmfbs (default ~/.cache/kiln)",
    "KILN_REMOTE_CACHE": "cache.remote",
    "KILN_REMOTE_UPLOAD": "cache.upload",
    "KILN_EXECUTOR": "executor.kind",
    "KILN_SCHEDULER": "executor.address",
    "KILN_JOBS": "the number of Dask workers Kiln starts",
    "KILN_PIPELINE_FILE": "which pipeline.yaml is used",
    "KILN_PIPELINE": "which pipeline.yaml is used",
    "KILN_MP_START": "how -n starts its worker processes",
}


def cmd_config(args: Any) -> int:
    """Print the resolved pipeline of the current project with each entry's origin."""
    from kiln.tasks.model.project import Project

    if getattr(args, "schema", False):
        return write_schema()
    project = Project.find()
    pipeline = project.pipeline
    data = resolved_data(pipeline)
    origins = entry_origins(pipeline, data)
    environment = environment_overrides()
    places = directories(project)
    schema = schema_state(Path(pipeline.path).parent)
    if getattr(args, "json", False):
        record = {
            "file": str(pipeline.path),
            "directories": places,
            "schema": schema,
            "pipeline": data,
            "origins": origins,
            "environment": environment,
        }
        print(json.dumps(record, indent=2))
    else:
        text = render_yaml(pipeline, data, origins)
        head, _, body = text.partition("\n")
        sys.stdout.write(head + "\n" + render_places(str(pipeline.path), places, schema) + body)
        sys.stdout.write(render_environment(environment))
    return 0


def directories(project) -> dict[str, str | None]:
    """Where this project's build goes: out dir, Kiln's state, the local store, the remote."""
    from kiln.cache.config import resolve_cache_config
    from kiln.errors import KilnError

    try:
        cache = resolve_cache_config(project.pipeline.cache_settings)
        local, remote = cache.local_dir, cache.remote
        if not cache.enabled:
            local = f"{local} (off: KILN_CACHE)"
    except KilnError as err:  # a remote this machine cannot reach: say so, show the rest
        from kiln.cache.store import default_cache_dir

        local = str(default_cache_dir() / "store")
        remote = f"{project.pipeline.cache_settings.get('remote')} (unusable: {err.message})"
    return {
        "out_dir": str(project.out_dir),
        "state_dir": str(project.state_dir),
        "cache_dir": local,
        "remote": remote,
    }


PLACE_NAMES = {
    "out_dir": "out dir",
    "state_dir": "state dir",
    "cache_dir": "cache dir",
    "remote": "remote",
}


def render_places(file: str, places: dict[str, str | None], schema: dict[str, str]) -> str:
    """YAML comments: the pipeline file, the directories and the schema copy."""
    rows = [("file", file)]
    rows += [(PLACE_NAMES[k], v if v is not None else "none") for k, v in places.items()]
    name = Path(schema["path"]).name
    rows.append(("schema", SCHEMA_STATES[schema["state"]].format(name=name)))
    width = max(len(name) for name, _ in rows) + 1
    return "".join(f"# {name + ':':<{width}} {value}\n" for name, value in rows)


SCHEMA_STATES = {
    "current": "{name}, as this Kiln checks",
    "stale": "{name} is not this Kiln's: `kiln config --schema` refreshes it",
    "missing": "no {name} (`kiln config --schema` writes one for editors)",
    "unreadable": "{name} cannot be read: `kiln config --schema` rewrites it",
}


def schema_state(root: Path) -> dict[str, str]:
    """Whether the project's pipeline.schema.json is this Kiln's (what editors check with)."""
    from kiln.cli.scaffold import SCHEMA_FILE, schema_text

    path = root / SCHEMA_FILE
    try:
        state = "current" if path.read_text(encoding="utf-8") == schema_text() else "stale"
    except FileNotFoundError:
        state = "missing"
    except (OSError, UnicodeDecodeError):
        state = "unreadable"
    return {"path": str(path), "state": state}


def write_schema() -> int:
    """`kiln config --schema`: this Kiln's JSON Schema into the project, next to pipeline.yaml.

    Needs only the pipeline file's place, not a valid pipeline: a file the
    editor flags is exactly when a fresh schema helps.
    """
    from kiln.cli.scaffold import SCHEMA_FILE, schema_text
    from kiln.errors import printable, relative_path
    from kiln.fsutil import write_bytes_atomic
    from kiln.tasks.model.project import find_pipeline

    pipeline_file = find_pipeline()
    path = pipeline_file.parent / SCHEMA_FILE
    text = schema_text()
    shown = printable(relative_path(path))
    try:
        same = path.read_text(encoding="utf-8") == text
    except (OSError, UnicodeDecodeError):
        same = False
    if same:
        print(f"kiln: {shown} is up to date")
    else:
        write_bytes_atomic(path, text.encode("utf-8"))
        print(f"kiln: wrote {shown}")
    try:
        first = pipeline_file.read_text(encoding="utf-8", errors="replace").split("\n", 1)[0]
    except OSError:
        first = ""
    if "$schema=" not in first:
        print(
            f"kiln: to let editors use it, make this the first line of {pipeline_file.name}:\n"
            f"# yaml-language-server: $schema={SCHEMA_FILE}"
        )
    return 0


def environment_overrides() -> dict[str, dict[str, str]]:
    """The set KILN_* variables that change the build: name -> {value, overrides}."""
    return {
        name: {"value": os.environ[name], "overrides": what}
        for name, what in ENVIRONMENT_OVERRIDES.items()
        if name in os.environ
    }


def render_environment(environment: dict[str, dict[str, str]]) -> str:
    """YAML comments: the values above that the environment replaces for this run."""
    if not environment:
        return "# no KILN_* environment variable overrides this file\n"
    lines = ["# the environment overrides (these win over the values above):"]
    for name, found in environment.items():
        lines.append(f"#   {name}={found['value']}  -> {found['overrides']}")
    return "\n".join(lines) + "\n"


def resolved_data(pipeline: Pipeline) -> dict[str, Any]:
    """The pipeline as plain data, in pipeline.yaml's own keys: what Kiln builds with."""
    data: dict[str, Any] = {
        "project": pipeline.project,
        "packages": list(pipeline.packages),
        "out_dir": pipeline.out_dir,
        "cache": {"check": pipeline.cache_check, **pipeline.cache_settings},
        "tuning": {"file": pipeline.tuning_file},
    }
    if pipeline.executor:
        data["executor"] = dict(pipeline.executor)
    data["machine"] = pipeline.machine
    data["kernels"] = {k.name: _kernel(k) for k in pipeline.kernels}
    data["stages"] = [
        {"name": s.name, "module": s.module, **({"options": dict(s.options)} if s.options else {})}
        for s in pipeline.stages
    ]
    if pipeline.dumps:
        data["dumps"] = [
            {"kernels": list(d.kernels), "kinds": list(d.kinds)} for d in pipeline.dumps
        ]
    data["machines"] = json.loads(json.dumps(pipeline.machines))  # a copy: the model is shared
    data["targets"] = {
        t.name: _without_none(
            runner=t.runner,
            machine=t.machine,
            options=dict(t.options) or None,
            tolerance=t.tolerance,
        )
        for t in pipeline.targets
    }
    if pipeline.apps:
        data["apps"] = {
            a.name: _without_none(module=a.module, tests=list(a.tests) or None, shapes=a.shapes)
            for a in pipeline.apps
        }
    return data


def entry_origins(pipeline: Pipeline, data: dict[str, Any]) -> dict[str, str]:
    """Key path of each top-level entry -> ``FILE:LINE`` or ``built-in default``."""
    paths: list[str] = []
    for key, value in data.items():
        if key in NAMED or key in NESTED:
            paths.extend(child_path(key, name) for name in value)
        elif key in LISTED:
            paths.extend(child_path(key, i) for i in range(len(value)))
        else:
            paths.append(key)
    return {path: pipeline.origin(path) for path in paths}


def render_yaml(pipeline: Pipeline, data: dict[str, Any], origins: dict[str, str]) -> str:
    """``data`` as YAML, each entry's origin in a trailing comment."""
    lines = [f"# kiln config: {display_name(pipeline.path)} over Kiln's built-in defaults"]
    for key, value in data.items():
        if key in NAMED or key in NESTED:
            lines.append(f"{key}:")
            for name, entry in value.items():
                where = origins[child_path(key, name)]
                if key in NESTED or not isinstance(entry, dict):
                    lines.append(_commented(f"  {_flow(name)}: {_flow(entry)}", where))
                    continue
                inline = f"  {_flow(name)}: {_flow(entry)}"
                if len(inline) <= LINE_WIDTH - len(" # built-in"):
                    lines.append(_commented(inline, where))
                    continue
                lines.append(_commented(f"  {_flow(name)}:", where))
                lines.extend(_block(entry, "    "))
        elif key in LISTED:
            lines.append(f"{key}:")
            for i, entry in enumerate(value):
                lines.append(_commented(f"  - {_flow(entry)}", origins[child_path(key, i)]))
        else:
            lines.append(_commented(f"{key}: {_flow(value)}", origins[key]))
    return "\n".join(lines) + "\n"


def _kernel(spec: KernelSpec) -> dict[str, Any]:
    set_inputs = dict(spec.set_inputs)
    shapes = {
        name: {**dict(dims), **({"inputs": dict(set_inputs[name])} if name in set_inputs else {})}
        for name, dims in spec.shapes
    }
    return _without_none(
        function=spec.function,
        dtype=spec.dtype,
        dtypes=dict(spec.dtypes) or None,
        inputs=dict(spec.inputs) or None,
        shapes=shapes,
        fuzz={d: low if low == high else [low, high] for d, (low, high) in spec.fuzz} or None,
        options={stage: dict(opts) for stage, opts in spec.options} or None,
        tolerance=spec.tolerance,
        machine=spec.machine,
    )


def _without_none(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def _commented(line: str, origin: str) -> str:
    comment = "# built-in" if origin == BUILTIN else f"# from {origin}"
    return f"{line.ljust(COMMENT_COLUMN - 2)}  {comment}"


def _flow(value: Any) -> str:
    """``value`` as one line of YAML (a flow collection or a plain scalar)."""
    import yaml

    text = yaml.safe_dump(
        value, default_flow_style=True, sort_keys=False, width=2**31, allow_unicode=True
    )
    return text.removesuffix("\n").removesuffix("\n...").strip()


def _block(value: dict[str, Any], indent: str) -> list[str]:
    """``value`` as block YAML lines; a value that fits on its line, or holds only
    scalars, stays in flow style."""
    lines = []
    for key, item in value.items():
        line = f"{indent}{_flow(key)}: {_flow(item)}"
        nested = isinstance(item, dict) and any(isinstance(v, dict | list) for v in item.values())
        if nested and len(line) > LINE_WIDTH:
            lines.append(f"{indent}{_flow(key)}:")
            lines.extend(_block(item, indent + "  "))
        else:
            lines.append(line)
    return lines
