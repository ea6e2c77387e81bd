"""Stage modules and options checked when pipeline.yaml loads: one error at its line.

Each stage module must import and be a stage (ARTIFACT, Options, run, read,
serialize, verify), write a file of its own, and provide the dumps asked of
it; each stage's options must be what its ``Options`` accepts. Checking
imports the stage modules, and importing the stages imports numpy: a no-op
build must not pay that. What was checked and found good is remembered in
the state dir, by the digest of the options and of the stage code, so a
later load checks nothing new. The artifact names are read from the source
(as the build reads them) and checked on every load: a few string tests.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os

from kiln.errors import KilnError, PipelineError
from kiln.fsutil import write_bytes_atomic
from kiln.options import build_options
from kiln.tasks.model.artifacts import DUMP_FILES
from kiln.tasks.model.digest import digest_json, stage_module_info
from kiln.tasks.model.importpath import add_project_root
from kiln.tasks.model.project import Project

CHECKED = "options-checked.json"
FORMAT = 2  # what a memo entry vouches for: 2 adds the module's shape and its dumps
# what the instance dir holds beside the stage artifacts, and Kiln's temp files
RESERVED_PREFIXES = (".",)
RESERVED_NAMES = ("dumps",)
RESERVED_PATTERNS = (("test-", ".json"), ("bench-", ".json"))
STAGE_FUNCTIONS = ("run", "read", "serialize", "verify")
CAPABILITY_FUNCTIONS = {"side_artifacts": "run_with_side_artifacts", "decode": "decode"}


def check_stage_options(project: Project) -> None:
    """Raise PipelineError, at the YAML line, for the first stage module or option that
    cannot build: a module that is no stage, an artifact name, a dump, an option."""
    _check_artifacts(project)
    path = os.path.join(project.state_dir, CHECKED)
    checked = _read(path)
    fresh: set[str] = set()
    _check_rows(project, checked, fresh)
    _check_dumps(project, checked, fresh)
    if fresh:
        try:
            write_bytes_atomic(path, json.dumps(sorted(checked | fresh)).encode())
        except OSError:  # only a memo: the next load checks again
            pass


def _check_rows(project: Project, checked: set[str], fresh: set[str]) -> None:
    """Each row's module, with the row's options and every kernel's override."""
    pipeline = project.pipeline
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
            digest = digest_json([FORMAT, stage.module, code, options])
            if digest in checked or digest in fresh:
                continue
            _check(project, row, stage, options, key_path)
            fresh.add(digest)


def _check_dumps(project: Project, checked: set[str], fresh: set[str]) -> None:
    """Each dump kind under ``dumps:`` has a row whose module writes it."""
    pipeline = project.pipeline
    rows = {stage.name: stage for stage in pipeline.stages}
    for kind in dict.fromkeys(k for dump in pipeline.dumps for k in dump.kinds):
        stage = rows.get(DUMP_FILES[kind][0])
        code = stage_module_info(stage.module)[0] if stage is not None else None
        digest = digest_json([FORMAT, "dump", kind, stage and stage.module, code])
        if digest in checked or digest in fresh:
            continue
        problem = dump_problem(project, kind)
        if problem is not None:
            raise PipelineError(
                f"no stage of `stages:` writes a {kind!r} dump",
                pipeline.locate(_dump_key_path(project, kind), value=True),
                expected=problem.expected,
                found=problem.found,
                hint=problem.hint,
            )
        fresh.add(digest)


def dump_problem(project: Project, kind: str) -> KilnError | None:
    """Why no stage writes the dump ``kind`` (its row is missing, its module has no writer
    for it); None when the owning stage writes it."""
    owner = DUMP_FILES[kind][0]
    stages = project.pipeline.stages
    stage = next((s for s in stages if s.name == owner), None)
    if stage is None:
        return KilnError(
            f"the {kind!r} dump needs the {owner!r} stage, which this pipeline does not run",
            expected=f"a row named {owner!r} in stages:",
            found=", ".join(s.name for s in stages),
        )
    add_project_root(project.root)
    try:
        writers = getattr(importlib.import_module(stage.module), "DUMPS", None)
    except (SystemExit, Exception):  # the module's own check says why
        return None
    if isinstance(writers, dict) and kind in writers:
        return None
    return KilnError(
        f"stage {owner!r} ({stage.module}) writes no {kind!r} dump",
        expected=f"a {kind!r} entry in the DUMPS of {stage.module}",
        found="DUMPS with " + (", ".join(map(repr, writers)) or "no entry")
        if isinstance(writers, dict)
        else "no DUMPS",
        hint=f"add DUMPS = {{{kind!r}: writer}} to {stage.module}, or drop the dump",
    )


def _dump_key_path(project: Project, kind: str) -> str:
    """Where pipeline.yaml first asks for ``kind``: ``dumps[i].kinds[j]``."""
    from kiln.pipeline.yamlpos import load_yaml

    try:
        data, _ = load_yaml(project.pipeline.path)
        for i, dump in enumerate(data.get("dumps") or []):
            for j, asked in enumerate(dump.get("kinds") or []):
                if asked == kind:
                    return f"dumps[{i}].kinds[{j}]"
    except Exception:  # edited since it loaded: the list itself
        pass
    return "dumps"


def _check_artifacts(project: Project) -> None:
    """Each stage writes one plain file of its own in the instance's out dir."""
    seen: dict[str, int] = {}
    for row, stage in enumerate(project.pipeline.stages):
        artifact = stage_module_info(stage.module)[1]
        problem = artifact_problem(artifact)
        if problem is None and artifact in seen:
            first = seen[artifact]
            problem = f"stages[{first}] ({project.pipeline.stages[first].name}) writes it too"
        if problem is not None:
            raise _artifact_error(project, row, stage, artifact, problem)
        seen.setdefault(artifact, row)


def _artifact_error(project: Project, row: int, stage, artifact: str, problem: str):
    return PipelineError(
        f"stage {stage.name!r} cannot write the artifact {artifact!r}: {problem}",
        project.pipeline.locate(f"stages[{row}].module", value=True),
        expected="ARTIFACT = 'a file name' of its own, such as 'kernel.sig', "
        "unique among the stages",
        found=f"ARTIFACT = {artifact!r} in {stage.module}",
        hint="the artifact is written in each instance's out dir, beside the "
        "other stages' files and Kiln's own",
    )


def artifact_problem(name: str) -> str | None:
    """Why ``name`` cannot be a stage's artifact; None for a plain file name of its own."""
    if not name.strip():
        return "it is empty"
    if "/" in name or "\\" in name or "\0" in name:
        return "it is a path: an artifact is a plain file name, without '/'"
    if name.startswith(RESERVED_PREFIXES):
        return "names starting with '.' are Kiln's own files (its records, temp files)"
    if name in RESERVED_NAMES or any(
        name.startswith(head) and name.endswith(tail) for head, tail in RESERVED_PATTERNS
    ):
        return "Kiln keeps files of its own by that name there (dumps/, test-*.json, bench-*.json)"
    return None


def _check(project: Project, row: int, stage, options: dict, key_path: str) -> None:
    module = _stage_module(project, row, stage)
    try:
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


def _stage_module(project: Project, row: int, stage):
    """The imported stage module of ``stages[row]``; PipelineError at its ``module:`` if
    it does not import or lacks what a stage defines."""
    where = project.pipeline.locate(f"stages[{row}].module", value=True)
    add_project_root(project.root)
    try:
        module = importlib.import_module(stage.module)
    except (SystemExit, Exception) as exc:  # its own code runs: anything, exit included
        found = (
            f"it calls sys.exit({exc.code!r}) when imported"
            if isinstance(exc, SystemExit)
            else f"{type(exc).__name__}: {exc}"
        )
        raise PipelineError(
            f"stage {stage.name!r}: its module {stage.module} fails to import",
            where,
            expected="a module that imports",
            found=found,
            hint="run `python -c 'import " + stage.module + "'` in the project to see why",
        ) from None
    artifact = getattr(module, "ARTIFACT", None)
    # the build writes the file the source's literal names (checked above, on every
    # load); a value the source does not spell as one, such as "", is refused here
    problem = artifact_problem(artifact) if isinstance(artifact, str) else None
    if problem is not None:
        raise _artifact_error(project, row, stage, artifact, problem)
    options = getattr(module, "Options", None)
    missing = [
        *([] if isinstance(artifact, str) else ["ARTIFACT"]),
        *(
            []
            if isinstance(options, type) and dataclasses.is_dataclass(options)
            else ["Options dataclass"]
        ),
        *(name for name in _required(module) if not callable(getattr(module, name, None))),
    ]
    if missing:
        raise PipelineError(
            f"stage {stage.name!r} names a module that is not a Kiln stage",
            where,
            expected="a stage module: ARTIFACT = 'file name', Options, run(), read(), "
            "serialize(), verify()",
            found=f"{stage.module}, which has no " + ", ".join(missing),
            hint="see docs/stages.md for what a stage module defines",
        )
    return module


def _required(module) -> list[str]:
    """The functions a stage module must define: the protocol, and what it declares."""
    declared = getattr(module, "CAPABILITIES", ())
    extra = [f for cap, f in CAPABILITY_FUNCTIONS.items() if cap in declared]
    return [*STAGE_FUNCTIONS, *extra]


def _read(path: str) -> set[str]:
    try:
        with open(path, "rb") as f:
            found = json.loads(f.read())
        return {d for d in found if isinstance(d, str)} if isinstance(found, list) else set()
    except Exception:  # unusable however damaged (deep nesting: RecursionError): checked again
        return set()
