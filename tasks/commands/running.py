"""Building and running selected instances: `kiln compile`'s and `kiln run`'s work."""

from __future__ import annotations

from kiln.errors import BuildFailed
from kiln.tasks.checks.targets import (
    instance_inputs,
    kernel_artifacts,
    make_runner,
    runner_errors,
)
from kiln.tasks.model.project import KernelInstance, Project


def build(project: Project, instances: list[KernelInstance]) -> None:
    """Build ``instances``; BuildFailed (exit 1) when any did not build."""
    problems = build_each(project, instances)
    if problems:
        from kiln.logconfig import verbosity
        from kiln.tasks.chain.failure_groups import affected

        raise BuildFailed(f"did not build: {affected(list(problems), verbosity() >= 2)}")


def build_each(
    project: Project, instances: list[KernelInstance], *, fail_fast: bool = False
) -> dict[str, str]:
    """Build every instance that can be built: instance name -> why it did not build.

    Each failure was reported by the build; with ``fail_fast`` the build
    stops at the first, and BuildFailed is raised instead.
    """
    from kiln.tasks.dag.build import compile_instances
    from kiln.tasks.dag.loader import fail_fast_requested
    from kiln.tasks.dag.reporter import last_run_failures, render_diagnostic

    fail_fast = fail_fast or fail_fast_requested()
    rc = compile_instances(project, instances, fail_fast=fail_fast)
    if rc == 0:
        return {}
    if fail_fast:
        raise BuildFailed("the build stopped at the first failure (--fail-fast)")
    failed, blocked = last_run_failures()
    problems: dict[str, str] = {}
    for inst in instances:
        task = f"compile:{inst.name}"  # one task per instance: its whole stage chain
        if task in failed:
            why = failed[task]
            text = render_diagnostic(why) if isinstance(why, dict) else why
            problems[inst.name] = f"{task} failed:\n{text}"
        elif task in blocked:
            problems[inst.name] = f"{inst.name} was not built: an input of it failed to build"
    if not problems:  # a failure outside any instance's tasks: nothing can be trusted
        raise BuildFailed(f"the build failed (doit exit code {rc}); see the messages above")
    return problems


def run_kernel(project: Project, instances: list[KernelInstance], args) -> int:
    """Run one selected instance; a kernel with several shape sets runs its first, saying so."""

    from kiln.inputs import describe
    from kiln.tasks.model.selection import Selection, first_shape_set

    inst = first_shape_set(Selection(instances), "run", "the run")
    build(project, [inst])
    runner = make_runner(project, args.target)
    artifacts = kernel_artifacts(project, inst)
    inputs = instance_inputs(project, inst, artifacts.graph, args.seed)
    with runner_errors(args.target, runner):  # a plugin's crash: one message, no traceback
        result = runner.run(runner.prepare(artifacts), inputs)
    print(f"{inst.name} on {args.target} ({inst.source.path}, seed {args.seed})")
    for arg, array in zip(artifacts.graph.args, inputs, strict=True):
        d = describe(array)
        print(f"  in  {arg.attr('name')}: {d['dtype']}{d['shape']}")
    from kiln.outputs import describe_output  # an app's outputs read the same

    for index, array in enumerate(result.outputs):
        print(describe_output(str(index), array))
    from kiln.figures import figure

    for key, value in sorted(result.metrics.items()):
        print(f"  {key}: {figure(value)}")  # rounded for reading, as every text output
    if args.save_outputs:
        from kiln.outputs import save_outputs

        outputs = [(f"out{index}", array) for index, array in enumerate(result.outputs)]
        save_outputs(outputs, args.save_outputs)
        print(
            f"  saved {len(outputs)} output(s) to {args.save_outputs} (outN.npy and "
            "outputs.json: read them with np.load, or kiln.load_outputs for their own dtypes)"
        )
    return 0
