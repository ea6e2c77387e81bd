"""The compile DAG: one doit task per kernel instance and row of ``stages:``.

Task ``compile:<kernel>.<shapes>.<stage>`` reads the previous stage's
artifact (the trace stage reads the kernel's source files), writes its own
artifact only when the bytes change (early cutoff), and re-runs when its
config changes (options, machine, Kiln version, stage source): the config
is a stamp file among its file_deps (see tasks/digest.py).
"""

from __future__ import annotations

import inspect
import os

from kiln.tasks.digest import ConfigStamps, digest_json, stage_module_info
from kiln.tasks.executor import resolve_executor
from kiln.tasks.manifest import clean_targets, drop_damaged
from kiln.tasks.prefetch import ChainPlan
from kiln.tasks.project import KernelInstance, Project
from kiln.tasks.tuning_key import TuningKeys

import kiln
from kiln.cache.config import resolve_cache_config
from kiln.tune.apply import TUNED_STAGES

# dump kind -> (stage name that owns it, path inside the instance's out dir)
DUMP_FILES = {
    "dfg": ("trace", "dumps/dfg.json"),
    "visa": ("visa", "dumps/kernel.visa"),
    "ir": ("lir", "dumps/lir.msgpack"),
    "graph": ("lir", "dumps/lir_graph.json"),
    "schedule": ("schedule", "dumps/schedule.json"),
    "summary": ("edf", "dumps/summary"),
}


def artifact_name(stage_module: str) -> str:
    """The artifact file a stage module writes (its ``ARTIFACT``)."""
    return stage_module_info(stage_module)[1]


def instance_dumps(project: Project, inst: KernelInstance) -> dict[str, list[tuple[str, str]]]:
    """stage name -> [(dump kind, path)] asked for by the pipeline's ``dumps:``."""
    wanted: dict[str, list[tuple[str, str]]] = {}
    for dump in project.pipeline.dumps:
        if dump.kernels and inst.kernel not in dump.kernels:
            continue
        for kind in dump.kinds:
            stage, rel = DUMP_FILES[kind]
            wanted.setdefault(stage, []).append((kind, f"{inst.out_dir}/{rel}"))
    return wanted


def stage_artifact(inst: KernelInstance, stage_module: str) -> str:
    return f"{inst.out_dir}/{artifact_name(stage_module)}"


def compile_tasks(project: Project, instances: list[KernelInstance] | None = None):
    """Yield the doit task dicts of the compile DAG.

    Runs on every build, no-op ones included: everything that does not
    depend on the instance is computed once per stage, not once per task.
    """
    pipeline = project.pipeline
    root, pipeline_path = str(project.root), str(project.pipeline_path)
    stages = []
    for index, stage in enumerate(pipeline.stages):
        digest, artifact = stage_module_info(stage.module)
        stages.append(
            (index, stage, artifact, {"version": kiln.__version__, "stage_source": digest})
        )
    machines: dict[str | None, tuple[dict | None, str]] = {}
    compiler_digest = digest_json([kiln.__version__, *(p["stage_source"] for *_, p in stages)])
    first_artifact = stages[0][2]
    options_memo: dict[tuple[str | None, str], tuple[dict, str]] = {}
    stamps = ConfigStamps(project.state_dir / "config")
    cache = resolve_cache_config(pipeline.cache_settings).to_dict()
    executor = resolve_executor(pipeline.executor, project.root)
    tuning_file = str(project.root / pipeline.tuning_file)
    tuning_keys = TuningKeys(project) if os.path.isfile(tuning_file) else None
    if tuning_keys is None and os.path.lexists(tuning_file):
        # a directory (or a dangling link) where the records go: kiln tune reports it,
        # and a build must not quietly drop the tuned options either
        from kiln.tune.records import read_records

        read_records(tuning_file)  # raises the error naming the file
    chosen = list(instances if instances is not None else project.instances)
    fetch_ahead = cache.get("enabled") and cache.get("remote") and cache.get("prefetch_threads")
    plan = ChainPlan() if fetch_ahead else None
    # one pass over what earlier builds wrote: a damaged artifact is removed, so it rebuilds
    drop_damaged([str(inst.out_dir) for inst in chosen], str(project.state_dir))
    out_root, state = str(project.out_dir), str(project.state_dir)
    for inst in chosen:
        sources = project.discovery.source_files(inst.source.module)
        dumps = instance_dumps(project, inst) if pipeline.dumps else {}
        kernel_spec = pipeline.kernel(inst.kernel)
        own = inst.kernel if kernel_spec.options else None
        if kernel_spec.machine not in machines:
            model = project.kernel_machine(inst.kernel)
            machines[kernel_spec.machine] = (model, digest_json(model))
        machine, machine_digest = machines[kernel_spec.machine]
        out_dir = str(inst.out_dir)
        previous: str | None = None
        previous_module: str | None = None
        chain: list[dict] = []
        tuning = None
        if tuning_keys is not None:
            graph = f"{out_dir}/{first_artifact}"
            tuning = {"file": tuning_file, "graph": graph, "key": tuning_keys.parts(inst)}
        for index, stage, artifact_file, base_parts in stages:
            memo_key = (own, stage.name)
            if memo_key not in options_memo:
                options = pipeline.stage_options(inst.kernel, stage.name)
                options_memo[memo_key] = (options, digest_json(options))
            options, options_digest = options_memo[memo_key]
            artifact = f"{out_dir}/{artifact_file}"
            stage_dumps = dumps.get(stage.name, [])
            spec = {
                "root": root,
                "pipeline": pipeline_path,
                "instance": inst.name,
                "stage": stage.name,
                "stage_index": index,
                "module": stage.module,
                "options": options,
                "machine": machine,
                "artifact": artifact,
                "dumps": stage_dumps,
                "cache": cache,
            }
            if executor is not None:
                spec["executor"] = executor
            if index == len(stages) - 1:
                # what the binary records about its own making (see tasks/actions.py)
                spec["build"] = {
                    "graph": f"{out_dir}/{first_artifact}",
                    "kernel": inst.source.path,
                    "shapes": inst.shape_set,
                    "compiler": compiler_digest,
                }
            parts = dict(base_parts, options=options_digest, machine=machine_digest)
            if stage_dumps:
                parts["dumps"] = digest_json(stage_dumps)
            if previous is None:
                dtype, dtypes = project.trace_dtypes(inst.kernel)
                spec["trace"] = {
                    "module": inst.source.module,
                    "function": inst.source.name,
                    "bindings": list(inst.bindings),
                    "dtypes": sorted(dtypes.items()),
                    "default_dtype": dtype,
                }
                parts["kernel"] = digest_json(spec["trace"])
                spec["sources"] = list(sources)
                if plan is not None:
                    spec["prefetch"] = plan  # see tasks/prefetch.py
                    plan.chains.append(chain)
                file_dep = [*sources, stamps.path(stage.name, parts)]
            else:
                spec["input"] = previous
                spec["input_module"] = previous_module
                file_dep = [previous, stamps.path(stage.name, parts)]
            chain.append(spec)
            # the stages from this one on: one remote task on Dask, and one walk through
            # the cache when this stage's outputs are fetched (tasks/cached.py)
            spec["chain"] = chain
            if tuning is not None and stage.name in TUNED_STAGES:
                spec["tuning"] = tuning  # looked up in the action: see kiln/tune/apply.py
                file_dep.append(tuning_file)
            yield {
                "basename": "compile",
                "name": f"{inst.name}.{stage.name}",
                "actions": [(_run_stage, [spec])],
                "file_dep": file_dep,
                "targets": [artifact, *(path for _, path in stage_dumps)],
                "clean": [
                    (_clean, [out_dir, [artifact, *(p for _, p in stage_dumps)], out_root, state])
                ],
            }
            previous, previous_module = artifact, stage.module


def _clean(
    directory: str, targets: list[str], out_root: str, state_dir: str, dryrun: bool = False
) -> None:
    # doit runs a clean action under `clean -n` only when it takes `dryrun`: then it lists
    clean_targets(directory, targets, out_root, state_dir, dryrun=dryrun)


def _run_stage(spec: dict):
    # Imported here so that loading tasks never imports numpy or the stages.
    from kiln.tasks.actions import run_stage
    from kiln.tasks.workers import guard_worker

    guard_worker()  # an -n worker exits when its build dies

    return run_stage(spec)


def stage_spec(task) -> dict | None:
    """The spec a compile task's stage action runs with; None for any other task."""
    actions = task.actions
    if len(actions) == 1 and getattr(actions[0], "py_callable", None) is _run_stage:
        return actions[0].args[0]
    return None


# doit reads an action's signature on every call (to offer it targets, changed, ...):
# given once, it is not worked out again for each of a build's thousands of tasks
_run_stage.__signature__ = inspect.signature(_run_stage)
