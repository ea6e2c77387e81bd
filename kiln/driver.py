"""The compiler driver: a kernel instance's stage chain, run by one function.

``run_chain`` is the only place that runs stages. A build action, a pool or
Dask worker, a ``kiln tune`` trial, ``kiln bench problem:`` and the
benchmarks all call it with a ``ChainSpec``: plain, frozen data that says
which kernel to trace at which sizes, which stages to run with which
resolved options, on which machine. It returns every file the chain makes
(artifacts, side artifacts, dumps) as bytes, keyed by their path inside the
instance's out dir; writing them is the caller's business.

Early cutoff lives here: each stage has a content key (its input's digest,
options, machine, code digest, toolchain). Given the keys and output
digests of the last run (``known``) and a way to read the files that run
left (``load``), a stage whose key is unchanged is not run again, and the
next stage reads its input from that file only if it has to run.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from types import ModuleType
from typing import Any

from kiln.cache.action import action_key
from kiln.errors import KilnError, environment_error
from kiln.options import build_options

# What a stage module may declare in CAPABILITIES (instead of being probed):
SIDE_ARTIFACTS = (
    "side_artifacts"  # run_with_side_artifacts(ir, options, machine) -> (ir, {name: bytes})
)
METADATA = "metadata"  # its IR has with_metadata(dict): the binary records its own making
DECODE = "decode"  # decode(bytes) -> IR, without a file
EXACT_ROUND_TRIP = "exact_round_trip"  # decode(serialize(ir)) is ``ir``: hand ``ir`` on as it is


def canonical_json(value: Any) -> str:
    """The one JSON text of ``value`` (sorted keys, no spaces): what keys are made of."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True, slots=True)
class TraceSpec:
    """Which @device function to trace, at which sizes and dtypes."""

    module: str
    function: str
    bindings: tuple[tuple[str, int], ...]
    dtypes: tuple[tuple[str, str], ...] = ()
    default_dtype: str = "f32"


@dataclass(frozen=True, slots=True)
class StageSpec:
    """One row of ``stages:`` for one instance: options resolved, code fingerprinted."""

    name: str
    module: str
    options: str  # canonical JSON of the stage's options (pipeline.yaml's, kernel overrides)
    code: str  # digest of the stage module and the Kiln code it imports
    artifact: str  # the file it writes, inside the instance's out dir
    dumps: tuple[tuple[str, str], ...] = ()  # (dump kind, path inside the instance's out dir)


@dataclass(frozen=True, slots=True)
class BuildInfo:
    """What the binary records about its own making (the last stage's metadata)."""

    kernel: str  # the kernel's source file, as the project names it
    shapes: str
    compiler: str  # digest of every stage's code


@dataclass(frozen=True, slots=True)
class Tuning:
    """A tuning record for this instance: its knobs apply when the traced graph matches."""

    graph: str  # sha256 of the graph the record was found for
    knobs: str  # canonical JSON: stage name -> {option: value}


@dataclass(frozen=True, slots=True)
class ChainSpec:
    """A kernel instance's whole compile: the unit a build task, worker or tuner runs."""

    instance: str
    trace: TraceSpec
    stages: tuple[StageSpec, ...]
    machine: str  # canonical JSON of the machine model
    build: BuildInfo
    tuning: Tuning | None = None
    tools: str = ""  # canonical JSON of the toolchain versions that can change bytes

    def key(self, sources: Mapping[str, str]) -> str:
        """The key of the whole chain's outputs, known before anything runs."""
        return hashlib.sha256(
            canonical_json(
                {"sources": dict(sources), "chain": chain_dict(self), "kind": "chain"}
            ).encode()
        ).hexdigest()

    def files(self) -> list[str]:
        """Every artifact and dump path the chain writes (side artifacts come with their stage)."""
        return self.files_of(self.stages)

    @staticmethod
    def files_of(stages: tuple[StageSpec, ...]) -> list[str]:
        """What a chain of ``stages`` writes, for a caller that shares them among chains."""
        out = []
        for stage in stages:
            out.append(stage.artifact)
            out.extend(path for _, path in stage.dumps)
        return out


def chain_dict(chain: ChainSpec) -> dict:
    """``chain`` as plain data (for keys and the one conversion to a worker's bytes)."""
    return {
        "instance": chain.instance,
        "trace": trace_dict(chain.trace),
        "stages": [
            {
                "name": s.name,
                "module": s.module,
                "options": s.options,
                "code": s.code,
                "artifact": s.artifact,
                "dumps": [list(d) for d in s.dumps],
            }
            for s in chain.stages
        ],
        "machine": chain.machine,
        "build": {
            "kernel": chain.build.kernel,
            "shapes": chain.build.shapes,
            "compiler": chain.build.compiler,
        },
        "tuning": None
        if chain.tuning is None
        else {"graph": chain.tuning.graph, "knobs": chain.tuning.knobs},
        "tools": chain.tools,
    }


def trace_dict(trace: TraceSpec) -> dict:
    """The trace request as plain data (a part of the chain's, and of the trace stage's key)."""
    return {
        "module": trace.module,
        "function": trace.function,
        "bindings": [list(b) for b in trace.bindings],
        "dtypes": [list(d) for d in trace.dtypes],
        "default_dtype": trace.default_dtype,
    }


def chain_from_dict(d: dict) -> ChainSpec:
    t = d["trace"]
    return ChainSpec(
        instance=d["instance"],
        trace=TraceSpec(
            module=t["module"],
            function=t["function"],
            bindings=tuple((str(k), int(v)) for k, v in t["bindings"]),
            dtypes=tuple((str(k), str(v)) for k, v in t["dtypes"]),
            default_dtype=t["default_dtype"],
        ),
        stages=tuple(
            StageSpec(
                name=s["name"],
                module=s["module"],
                options=s["options"],
                code=s["code"],
                artifact=s["artifact"],
                dumps=tuple((str(k), str(p)) for k, p in s["dumps"]),
            )
            for s in d["stages"]
        ),
        machine=d["machine"],
        build=BuildInfo(**d["build"]),
        tuning=None if d["tuning"] is None else Tuning(**d["tuning"]),
        tools=d["tools"],
    )


@dataclass(frozen=True, slots=True)
class StageRecord:
    """What one stage run (or kept) left: its key and its artifact's digest."""

    name: str
    key: str
    digest: str
    files: tuple[str, ...] = ()  # its side artifacts and dump files, beside the artifact


@dataclass
class ChainResult:
    """Every file the chain made this time (path -> bytes), and each stage's record.

    A stage kept by early cutoff has a record but no files here: its files
    are the ones the last run left. ``ran``: the stages that ran, in order;
    ``spans``: (stage, start, end) wall times, for the build profile.
    """

    records: list[StageRecord] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)
    artifacts: set[str] = field(default_factory=set)  # which of ``files`` are stage artifacts
    ran: list[str] = field(default_factory=list)
    spans: list[tuple[str, float, float]] = field(default_factory=list)
    graph_digest: str | None = None


class StageFailed(Exception):
    """A stage refused its input or options, or its code broke: ``error`` is the
    user-facing diagnostic."""

    def __init__(
        self,
        stage: StageSpec,
        error: KilnError,
        *,
        options: bool = False,
        crash: BaseException | None = None,
    ):
        super().__init__(error.message)
        self.stage = stage
        self.error = error
        self.options = options  # the stage's options themselves were rejected
        self.crash = crash  # what the stage's code raised that is not a KilnError


def stage_code_error(name: str, module: str, doing: str, exc: BaseException) -> KilnError:
    """What a stage module's own code raised, as a diagnostic naming the stage and module:
    a ``sys.exit()`` (which would end the whole build, often with status 0) or a bug."""
    from kiln.lang.errors import frame_location, is_library_file

    where = frame_location(exc.__traceback__)  # the stage's own line, when it is user code
    if where is not None and is_library_file(where.file):
        where = None
    if isinstance(exc, SystemExit):
        return KilnError(
            f"stage {name!r} ({module}) called sys.exit({exc.code!r}) {doing}",
            where,
            hint="a stage must not exit; raise kiln.errors.StageError to report a problem",
        )
    return KilnError(
        f"stage {name!r} ({module}) failed {doing}: {type(exc).__name__}: {exc}",
        where,
        hint="set KILN_DEBUG=1 for the full traceback",
    )


@contextmanager
def _stage_code(spec: StageSpec, doing: str) -> Iterator[None]:
    """Whatever the stage module's code raises fails that stage (StageFailed), by name.

    KeyboardInterrupt goes on: the user stops the build, not the stage.
    """
    try:
        yield
    except StageFailed:
        raise
    except KilnError as err:
        raise StageFailed(spec, err) from None
    except OSError as exc:  # a full disk, a permission: what to do about it, and where
        raise StageFailed(spec, environment_error(exc)) from None
    except (SystemExit, Exception) as exc:
        error = stage_code_error(spec.name, spec.module, doing, exc)
        raise StageFailed(spec, error, crash=exc) from None


@dataclass(frozen=True, slots=True)
class Stage:
    """A stage module, with what it declares it can do."""

    module: ModuleType
    capabilities: frozenset[str]

    @staticmethod
    def load(name: str) -> Stage:
        module = importlib.import_module(name)
        return Stage(module, frozenset(getattr(module, "CAPABILITIES", ())))

    def run(self, ir, options, machine) -> tuple[Any, dict[str, bytes]]:
        if SIDE_ARTIFACTS in self.capabilities:
            return self.module.run_with_side_artifacts(ir, options, machine)
        return self.module.run(ir, options, machine), {}

    def decode(self, data: bytes, path_hint: str):
        if DECODE in self.capabilities:
            return self.module.decode(data)
        import os
        import tempfile

        # read(path) is the protocol every stage has; decode is the fast way
        fd, tmp = tempfile.mkstemp(prefix="kiln-ir-", suffix=os.path.basename(path_hint))
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return self.module.read(tmp)
        finally:
            os.unlink(tmp)


def stage_key(
    stage: StageSpec, chain: ChainSpec, inputs: Mapping[str, str], options: str, graph: str | None
) -> str:
    """The content key of one stage: what decides its output bytes, never a path."""
    extra: dict[str, Any] = {"stage": stage.name}
    if stage is chain.stages[0]:
        extra["trace"] = trace_dict(chain.trace)
    if stage is chain.stages[-1]:
        extra["build"] = {
            "kernel": chain.build.kernel,
            "shapes": chain.build.shapes,
            "compiler": chain.build.compiler,
            "graph_sha256": graph,
        }
    if stage.dumps:
        extra["dumps"] = [list(d) for d in stage.dumps]
    return action_key(
        inputs=dict(inputs),
        options=options,
        machine=_digest(chain.machine),
        code=stage.code,
        extra=extra,
        tools=_parsed(chain.tools) if chain.tools else None,
    )


@lru_cache(maxsize=64)
def _digest(text: str) -> str:
    """A machine model's digest: the same few models recur in every chain of a build."""
    return hashlib.sha256(text.encode()).hexdigest()


@lru_cache(maxsize=64)
def _parsed(text: str) -> dict:
    return json.loads(text)


def stage_options(stage: StageSpec, chain: ChainSpec, graph: str | None) -> str:
    """The stage's options as JSON, with a matching tuning record's knobs on top."""
    tuning = chain.tuning
    if tuning is None or graph != tuning.graph:
        return stage.options
    knobs = json.loads(tuning.knobs).get(stage.name)
    if not knobs:
        return stage.options
    return canonical_json({**json.loads(stage.options), **knobs})


def run_chain(
    chain: ChainSpec,
    sources: Mapping[str, str],
    *,
    known: Mapping[str, StageRecord] | None = None,
    load: Callable[[str], bytes | None] | None = None,
) -> ChainResult:
    """Run ``chain``'s stages, keeping each whose key and output are what ``known`` says.

    ``sources``: the kernel's source files (path relative to the project)
    -> sha256, the trace's inputs. ``load(path)``: the bytes of a file the
    last run left (None if gone or changed), for a kept stage's output that a
    later stage needs, or a kept stage's dump. Raises StageFailed.
    """
    known = known or {}
    machine = json.loads(chain.machine)
    result = ChainResult()
    ir = None  # the previous stage's output IR, when it is in memory
    previous: StageSpec | None = None
    inputs: dict[str, str] = dict(sources)
    graph: str | None = None
    for spec in chain.stages:
        options_json = stage_options(spec, chain, graph)
        key = stage_key(spec, chain, inputs, options_json, graph)
        old = known.get(spec.name)
        digest = _kept(old, key, spec, load)
        if digest is not None:
            result.records.append(old)
            ir = None
        else:
            with _stage_code(spec, "when imported"):
                stage = Stage.load(spec.module)
            if ir is None:
                ir = _input_ir(chain, previous, result, load)
            started = time.time()
            ir, data, files = _run_stage(
                stage, spec, chain, ir, machine, options_json, graph, result
            )
            result.spans.append((spec.name, started, time.time()))
            result.ran.append(spec.name)
            digest = hashlib.sha256(data).hexdigest()
            result.records.append(StageRecord(spec.name, key, digest, files))
            if EXACT_ROUND_TRIP not in stage.capabilities:
                ir = None  # the next stage decodes the bytes, as it would from the file
        if graph is None:
            graph = result.graph_digest = digest
        inputs = {"input": digest}
        previous = spec
    return result


def records_match(
    chain: ChainSpec,
    sources: Mapping[str, str],
    records: Sequence[StageRecord],
    files: Mapping[str, bytes],
) -> bool:
    """Whether a cached chain's ``records`` are this chain's, stage by stage (each key as
    ``run_chain`` would compute it), and ``files`` hold the artifacts they name.

    A cache entry is found by the chain's key, but its contents come from whoever
    can write the cache: an entry filed under another chain's key, or one whose
    files disagree with its own records, is never used.
    """
    if len(records) != len(chain.stages):
        return False
    inputs: dict[str, str] = dict(sources)
    graph: str | None = None
    for spec, record in zip(chain.stages, records, strict=True):
        key = stage_key(spec, chain, inputs, stage_options(spec, chain, graph), graph)
        data = files.get(spec.artifact)
        if record.name != spec.name or record.key != key or data is None:
            return False
        if hashlib.sha256(data).hexdigest() != record.digest:
            return False
        if graph is None:
            graph = record.digest
        inputs = {"input": record.digest}
    return True


def _kept(
    old: StageRecord | None, key: str, spec: StageSpec, load: Callable[[str], bytes | None] | None
) -> str | None:
    """The artifact digest of a stage early cutoff keeps: same key, its files all still there."""
    if old is None or old.key != key or load is None:
        return None
    if any(load(path) is None for path in old.files):
        return None
    data = load(spec.artifact)
    if data is None or hashlib.sha256(data).hexdigest() != old.digest:
        return None
    return old.digest


def _input_ir(
    chain: ChainSpec,
    previous: StageSpec | None,
    result: ChainResult,
    load: Callable[[str], bytes | None] | None,
):
    """What the next stage to run reads: the trace request, or the previous artifact's IR."""
    from kiln.stages.trace import TraceRequest

    if previous is None:
        return TraceRequest(
            module=chain.trace.module,
            function=chain.trace.function,
            bindings=chain.trace.bindings,
            dtypes=chain.trace.dtypes,
            default_dtype=chain.trace.default_dtype,
        )
    data = result.files.get(previous.artifact)
    if data is None and load is not None:
        data = load(previous.artifact)
    if data is None:
        raise KilnError(
            f"the {previous.name} artifact of {chain.instance} disappeared during the build",
            hint="run the build again",
        )
    with _stage_code(previous, "reading its artifact back"):
        return Stage.load(previous.module).decode(data, previous.artifact)


def _run_stage(
    stage: Stage,
    spec: StageSpec,
    chain: ChainSpec,
    ir,
    machine: dict,
    options_json: str,
    graph: str | None,
    result: ChainResult,
) -> tuple[Any, bytes, tuple[str, ...]]:
    """Run, verify and serialize one stage; its files go into ``result``.

    Returns its IR, its artifact's bytes and the paths of its other files.
    """
    module = stage.module
    with _stage_code(spec, "building its Options"):
        try:
            options = build_options(module.Options, json.loads(options_json), spec.name)
        except KilnError as err:
            raise StageFailed(spec, err, options=True) from None
    with _stage_code(spec, "in run()"):
        out, side = stage.run(ir, options, machine)
    if out is None:
        raise StageFailed(spec, _returned_none(stage, spec))
    if spec is chain.stages[-1] and METADATA in stage.capabilities:
        with _stage_code(spec, "recording the binary's metadata"):
            out = out.with_metadata(
                {
                    "source": {"kernel": chain.build.kernel, "shapes": chain.build.shapes},
                    "hashes": {
                        "source_graph_sha256": graph,
                        "compiler_sha256": chain.build.compiler,
                    },
                }
            )
    with _stage_code(spec, "in verify()"):
        module.verify(out, machine)
    with _stage_code(spec, "in serialize()"):
        data = module.serialize(out)
    with _stage_code(spec, "writing its dumps"):
        files = dict(_dumps(module, spec, out, machine))
    directory = spec.artifact.rpartition("/")[0]
    for name, side_data in side.items():
        files[f"{directory}/{name}" if directory else name] = side_data
    result.files[spec.artifact] = data
    result.artifacts.add(spec.artifact)
    result.files.update(files)
    return out, data, tuple(sorted(files))


def _returned_none(stage: Stage, spec: StageSpec) -> KilnError:
    """A stage's entry function that returned nothing: an error at its ``def`` line."""
    from kiln.lang.errors import def_location

    name = "run_with_side_artifacts" if SIDE_ARTIFACTS in stage.capabilities else "run"
    entry = getattr(stage.module, name)
    return KilnError(
        f"stage {spec.name!r} ({spec.module}) returned None from {name}()",
        def_location(entry) if hasattr(entry, "__code__") else None,
        expected="the stage's output IR, which its verify() and serialize() take",
        hint="return the result at the end of run()",
    )


def _dumps(module, spec: StageSpec, out, machine: dict) -> dict[str, bytes]:
    """The stage's dumps as bytes by path, written through its writers in a scratch dir."""
    if not spec.dumps:
        return {}
    import tempfile
    from pathlib import Path

    found: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory(prefix="kiln-dumps-") as scratch:
        for kind, path in spec.dumps:
            writer = getattr(module, "DUMPS", {}).get(kind)
            if writer is None:  # the loader checks this; the stage module changed since
                raise KilnError(
                    f"stage {spec.name!r} ({spec.module}) writes no {kind!r} dump",
                    expected=f"a {kind!r} entry in its DUMPS",
                )
            target = Path(scratch) / path
            target.parent.mkdir(parents=True, exist_ok=True)
            writer(out, target, machine)
            if target.is_dir():  # a dump may be a directory (the summary)
                for file in sorted(target.rglob("*")):
                    if file.is_file():
                        found[file.relative_to(scratch).as_posix()] = file.read_bytes()
            elif target.is_file():
                found[path] = target.read_bytes()
    return found


def lower(
    ir,
    steps: Sequence[tuple[str, Mapping[str, Any]]],
    machine: dict,
    *,
    verify: bool = True,
) -> Any:
    """Run stages (module, options) on an IR in memory: the tuner's trials, problems,
    benchmarks. The stages of a build go through ``run_chain``; both run a stage here
    (``Stage.run``), and options are checked the same way. Raises KilnError."""
    for module_name, options in steps:
        name = module_name.rsplit(".", 1)[-1]
        try:
            stage = Stage.load(module_name)
            ir, _ = stage.run(ir, build_options(stage.module.Options, dict(options), name), machine)
            if verify:
                stage.module.verify(ir, machine)
        except SystemExit as exc:  # would end the tuner or the benchmark, often with status 0
            raise stage_code_error(name, module_name, "while lowering", exc) from None
    return ir
