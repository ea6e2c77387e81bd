"""One check of every asked target, before a command builds anything.

``kiln test``, ``kiln bench``, ``kiln run`` and ``kiln watch --target`` all
resolve their targets here, against one list (pipeline.yaml's targets, then
the bare runner kinds): an unknown name is an error naming that list, a
target that cannot run on this machine (a missing extra, no GPU, no plugin)
is found now rather than after a build. A target named with ``--target``
that cannot run is an error (a CI job asking for it would test nothing);
one taken from pipeline.yaml is skipped with one line saying why and how
many checks that skips.
"""

from __future__ import annotations

from kiln.errors import KilnError

# what one target stands for, per command: `checks` counts these
UNIT = {"test": "check", "watch": "check", "bench": "timing"}
# what dropping an unusable --target leaves a command doing
DROP_HINT = {
    "test": "to test only the targets that can run here",
    "bench": "to time only the targets that can run here",
    "watch": "to rebuild without testing, or pick a target that can run here",
}


def ready_targets(
    project,
    targets: list[str],
    *,
    asked: bool,
    checks: int | None,
    command: str,
    device: int = 0,
    quiet: bool = False,
) -> dict[str, str]:
    """Each target that cannot run here -> why; raises for an unknown or asked-for one.

    ``checks``: how many checks (or timings, or runs) each target stands for,
    said in the skip line or the error (None: not known ahead). ``device``: ``kiln bench --device``,
    which decides whether a device target can run.
    """
    from kiln.tasks.checks.targets import make_runner

    unavailable: dict[str, str] = {}
    for target in dict.fromkeys(targets):
        runner = make_runner(project, target)  # an unknown target: its error, before any build
        if device and not runner.host_only:
            runner.options["device_index"] = device
        why = runner.unavailable()
        if why:
            unavailable[target] = why
    if unavailable and asked:
        raise _cannot_run(unavailable, checks, command)
    if not quiet:
        for target, why in unavailable.items():
            count = f" ({_count(checks, command)} not run)" if checks is not None else ""
            print(f"SKIPPED {target}{count}: {why}", flush=True)
    return unavailable


def _count(checks: int, command: str) -> str:
    unit = UNIT.get(command, "check")
    return f"{checks} {unit}{'s' * (checks != 1)}"


def _cannot_run(unavailable: dict[str, str], checks: int | None, command: str) -> KilnError:
    """The error of --target names that cannot run here: one line each, with the reason."""
    flags = " ".join(f"--target {t}" for t in unavailable)
    drop = DROP_HINT.get(command)
    hint = f"drop {flags} {drop}" if drop else "pick a target that can run here: --target sim"
    if len(unavailable) == 1:
        ((target, why),) = unavailable.items()
        message = f"--target {target} was asked for, but it cannot run here: {why}"
        notes = []
    else:
        message = f"{len(unavailable)} targets asked for with --target cannot run here"
        notes = [f"{target}: {why}" for target, why in unavailable.items()]
    if checks is not None:
        notes.append(f"nothing was built or run ({_count(checks, command)} per target)")
    return KilnError(message, hint=hint, notes=notes)
