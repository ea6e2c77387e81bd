"""The compile DAG: one doit task per kernel instance, running its whole stage chain.

Task ``compile:<kernel>.<shapes>`` depends on the kernel's source files
and on one config stamp (every stage's resolved options and code digest,
the machine model, Kiln's version, the trace request, the dumps asked for,
the instance's own tuning record: see tasks/model/digest.py); its targets are
every artifact and dump the chain writes. Early cutoff happens inside the
chain (kiln/driver.py): an edit that leaves the traced graph unchanged
stops after the trace and rewrites nothing.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os

import kiln
from kiln.cache.action import toolchain
from kiln.cache.config import CacheConfig, resolve_cache_config
from kiln.driver import BuildInfo, ChainSpec, StageSpec, TraceSpec, Tuning, canonical_json
from kiln.tasks.chain.chain_record import RECORD
from kiln.tasks.chain.instance_spec import InstanceSpec
from kiln.tasks.chain.manifest import clean_targets, drop_damaged
from kiln.tasks.dag.chain_action import build_instance
from kiln.tasks.dag.checkers import note_checked
from kiln.tasks.execution import ahead
from kiln.tasks.execution.workers import guard_worker
from kiln.tasks.model.artifacts import instance_dumps
from kiln.tasks.model.digest import ConfigStamps, digest_json, stage_module_info
from kiln.tasks.model.options_check import check_stage_options
from kiln.tasks.model.project import KernelInstance, Project
from kiln.tasks.model.tuning_key import TuningKeys


def compile_tasks(
    project: Project, instances: list[KernelInstance] | None = None, *, cleaning: bool = True
):
    """Yield the doit task dicts of the compile DAG: one per kernel instance.

    Runs on every build, no-op ones included: everything that does not
    depend on the instance is computed once per stage or kernel, not per task.
    ``cleaning`` False leaves out the clean actions, which only doit's
    `clean` runs: doit makes an action object of each, on every load.
    """
    pipeline = project.pipeline
    check_stage_options(project)  # one error at its line, before anything builds
    root, pipeline_path = str(project.root), str(project.pipeline_path)
    rows = [(i, s, *stage_module_info(s.module)) for i, s in enumerate(pipeline.stages)]
    compiler = digest_json([kiln.__version__, *(code for *_, code, _ in rows)])
    tools = canonical_json(toolchain())
    stamps = ConfigStamps(project.state_dir / "config")
    settings = resolve_cache_config(pipeline.cache_settings)
    cache = CacheConfig(**settings.to_dict()) if settings.enabled else None
    tuning_file = str(project.root / pipeline.tuning_file)
    tuning = _TuningLookup(project, tuning_file)
    chosen = list(instances if instances is not None else project.instances)
    # one pass over what earlier builds wrote: a damaged artifact is removed, so it rebuilds
    intact: set[str] = set()
    drop_damaged([str(inst.out_dir) for inst in chosen], str(project.state_dir), intact)
    sources: set[str] = set()
    out_root, state = str(project.out_dir), str(project.state_dir)
    per_kernel: dict[tuple, tuple] = {}
    stage_specs: dict[tuple, tuple[StageSpec, ...]] = {}  # shared by most instances
    stage_files: dict[tuple, list[str]] = {}  # what those stages write, per instance dir
    specs: dict[str, InstanceSpec] = {}
    module_sources: dict[str, tuple[str, ...]] = {}  # kernel module -> the files it reads
    stage_indexes = tuple(i for i, *_ in rows)
    for inst in chosen:
        kernel_spec = pipeline.kernel(inst.kernel)
        # kernels without overrides of their own share everything here: work once per kind
        shared = (
            (kernel_spec.machine, repr(kernel_spec.options))
            if kernel_spec.options
            else (kernel_spec.machine,)
        )
        if shared not in per_kernel:
            per_kernel[shared] = _kernel_parts(project, inst.kernel, rows)
        stage_rows, machine, parts = per_kernel[shared]
        dumps = instance_dumps(project, inst) if pipeline.dumps else {}
        stages_key = (shared, repr(dumps))
        stages = stage_specs.get(stages_key)
        if stages is None:
            stages = stage_specs[stages_key] = tuple(
                StageSpec(
                    name=stage.name,
                    module=stage.module,
                    options=options,
                    code=code,
                    artifact=artifact,
                    dumps=tuple(dumps.get(stage.name, ())),
                )
                for (stage, options, code, artifact) in stage_rows
            )
            stage_files[stages_key] = ChainSpec.files_of(stages)
        source = inst.source
        dtype, dtypes = project.trace_dtypes(inst.kernel)
        trace = TraceSpec(
            module=source.module,
            function=source.name,
            bindings=tuple((k, int(v)) for k, v in inst.bindings),
            dtypes=tuple(sorted(dtypes.items())),
            default_dtype=dtype,
        )
        tuned = tuning.record(inst)
        inst_name = inst.name
        chain = ChainSpec(
            instance=inst_name,
            trace=trace,
            stages=stages,
            machine=machine,
            build=BuildInfo(kernel=source.path, shapes=inst.shape_set, compiler=compiler),
            tuning=tuned,
            tools=tools,
        )
        # repr of str/int tuples is canonical: cheaper than JSON for every instance
        kernel = hashlib.sha256(repr(trace_fields(trace)).encode()).hexdigest()[:16]
        inst_parts = dict(parts, kernel=kernel)
        if dumps:
            inst_parts["dumps"] = digest_json(sorted(dumps.items()))
        if tuned is not None:
            inst_parts["tuning"] = digest_json([tuned.graph, tuned.knobs])
        out_dir = str(inst.out_dir)
        files = module_sources.get(source.module)
        if files is None:
            files = module_sources[source.module] = tuple(
                project.discovery.source_files(source.module)
            )
            sources.update(files)
        spec = InstanceSpec(
            chain=chain,
            root=root,
            pipeline=pipeline_path,
            out_dir=out_dir,
            state_dir=state,
            sources=files,
            cache=cache,
            stage_rows=stage_indexes,
        )
        name = f"compile:{inst_name}"
        specs[name] = spec
        targets = [f"{out_dir}/{path}" for path in stage_files[stages_key]]
        task = {
            "basename": "compile",
            "name": inst_name,
            "actions": [(_build, [spec])],
            "file_dep": [*files, stamps.path("chain", inst_parts)],
            "targets": targets,
        }
        if cleaning:  # the chain's record goes with its artifacts (the dir is then pruned)
            record = f"{out_dir}/{RECORD}"
            task["clean"] = [(_clean, [out_dir, [*targets, record], out_root, state])]
        yield task
    ahead.register(specs)
    note_checked(intact, sources)


def instance_specs(project: Project, instances: list[KernelInstance]) -> list[InstanceSpec]:
    """Each instance's compile spec, as its compile task runs it: for a build outside doit
    (`kiln test --fuzz`), through the same chain, cache and early cutoff."""
    return [task["actions"][0][1][0] for task in compile_tasks(project, instances)]


def trace_fields(trace: TraceSpec) -> list:
    return [trace.module, trace.function, trace.bindings, trace.dtypes, trace.default_dtype]


def _kernel_parts(project: Project, kernel: str, rows) -> tuple:
    """A kernel's stages with resolved options, its machine, and its stamp parts."""
    pipeline = project.pipeline
    machine = canonical_json(project.kernel_machine(kernel))
    parts = {"version": kiln.__version__, "machine": digest_json(json.loads(machine))}
    stage_rows = []
    for _, stage, code, artifact in rows:
        options = canonical_json(pipeline.stage_options(kernel, stage.name))
        stage_rows.append((stage, options, code, artifact))
        parts[f"options.{stage.name}"] = digest_json(options)
        parts[f"stage_source.{stage.name}"] = code
    return stage_rows, machine, parts


class _TuningLookup:
    """The tuning record of each instance that still matches everything but the graph."""

    def __init__(self, project: Project, path: str):
        self.records = None
        if os.path.isfile(path):
            from kiln.tune.records import cached_records

            self.records = cached_records(path)
            self.keys = TuningKeys(project)
        elif os.path.lexists(path):
            # a directory (or a dangling link) where the records go: kiln tune reports it,
            # and a build must not quietly drop the tuned options either
            from kiln.tune.records import read_records

            read_records(path)  # raises the error naming the file

    def record(self, inst: KernelInstance) -> Tuning | None:
        if not self.records:
            return None
        record = self.records.get(inst.name)
        if record is None:
            return None
        from kiln.tune.records import TuningKey

        key = TuningKey(graph=record.graph, **self.keys.parts(inst))
        if not key.matches(record):
            return None  # stale: `kiln status` says so; never applied
        return Tuning(graph=record.graph, knobs=canonical_json(record.knobs))


def _clean(
    directory: str, targets: list[str], out_root: str, state_dir: str, dryrun: bool = False
) -> None:
    # doit runs a clean action under `clean -n` only when it takes `dryrun`: then it lists
    clean_targets(directory, targets, out_root, state_dir, dryrun=dryrun)


def _build(spec: InstanceSpec):
    guard_worker()  # a plain `doit -n` worker exits when its build dies
    return build_instance(spec)


def instance_spec(task) -> InstanceSpec | None:
    """The spec a compile task's action runs with; None for any other task."""
    actions = task.actions
    if len(actions) == 1 and getattr(actions[0], "py_callable", None) is _build:
        return actions[0].args[0]
    return None


# doit reads an action's signature on every call (to offer it targets, changed, ...):
# given once, it is not worked out again for each of a build's thousands of tasks
_build.__signature__ = inspect.signature(_build)
