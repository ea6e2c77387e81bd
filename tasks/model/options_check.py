"""Stage options checked when pipeline.yaml loads: one error at its line, before any build.

Checking needs the stage modules' ``Options`` types, and importing the
stages imports numpy: a no-op build must not pay that. What was checked
and found good is remembered in the state dir, by the digest of the
options and of the stage code, so a later load checks nothing new.
"""

from __future__ import annotations

import importlib
import json
import os

from kiln.errors import KilnError, PipelineError
from kiln.fsutil import write_bytes_atomic
from kiln.options import build_options
from kiln.tasks.model.digest import digest_json, stage_module_info
from kiln.tasks.model.importpath import add_project_root
from kiln.tasks.model.project import Project

CHECKED = "options-checked.json"


def check_stage_options(project: Project) -> None:
    """Raise PipelineError, at the YAML line, for the first stage option a stage refuses."""
    pipeline = project.pipeline
    path = os.path.join(project.state_dir, CHECKED)
    checked = _read(path)
    fresh: set[str] = set()
    # only the kernels with options of their own: a load of thousands visits a few
    overriding = [k for k in pipeline.kernels if k.options]
    for row, stage in enumerate(pipeline.stages):
        code = stage_module_info(stage.module)[0]
        for spec in [None, *overriding]:
            if spec is None:
                options, key_path = dict(stage.options), f"stages[{row}].options"
            else:
                if not any(name == stage.name for name, _ in spec.options):
                    continue
                kernel = spec.name
                options = pipeline.stage_options(kernel, stage.name)
                key_path = f"kernels.{kernel}.options.{stage.name}"
            digest = digest_json([stage.module, code, options])
            if digest in checked or digest in fresh:
                continue
            _check(project, stage, options, key_path)
            fresh.add(digest)
    if fresh:
        try:
            write_bytes_atomic(path, json.dumps(sorted(checked | fresh)).encode())
        except OSError:  # only a memo: the next load checks again
            pass


def _check(project: Project, stage, options: dict, key_path: str) -> None:
    add_project_root(project.root)
    try:
        module = importlib.import_module(stage.module)
        build_options(module.Options, options, stage.name)
    except KilnError as err:
        option = getattr(err, "option", None)  # a value out of its range: at the value
        bad = option or (err.found if isinstance(err.found, str) and err.found in options else None)
        where = project.pipeline.locate(
            f"{key_path}.{bad}" if bad else key_path, value=option is not None
        )
        raise PipelineError(
            err.message, where, expected=err.expected, found=err.found, hint=err.hint
        ) from None
    except Exception:  # a stage that does not import: its build says why
        return


def _read(path: str) -> set[str]:
    try:
        with open(path, "rb") as f:
            found = json.loads(f.read())
        return {d for d in found if isinstance(d, str)} if isinstance(found, list) else set()
    except Exception:  # unusable however damaged (deep nesting: RecursionError): checked again
        return set()
