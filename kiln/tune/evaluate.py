"""Pricing one candidate: compile through the schedule stage and read the makespan.

Runs in worker processes too, so it takes plain data and returns plain
data. A candidate the stages refuse (a tile that does not fit SRAM, an
option out of range) comes back as a rejection with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kiln.errors import KilnError


@dataclass(frozen=True, slots=True)
class Trial:
    candidate: tuple[int, ...]
    makespan: int | None  # None: rejected
    reason: str | None = None


@dataclass(frozen=True)
class Context:
    """What every trial of one kernel instance shares."""

    graph: Any
    machine: dict
    stages: tuple[tuple[str, str, dict], ...]  # (name, module, base options) from visa on


def compile_to_schedule(context: Context, chosen: dict[str, dict[str, Any]], verify: bool):
    """The ScheduledProgram of ``context.graph`` with ``chosen`` options over the base ones."""
    from kiln.driver import lower

    steps = []
    for name, module_name, base in context.stages:
        steps.append((module_name, {**base, **chosen.get(name, {})}))
        if name == "schedule":
            return lower(context.graph, steps, context.machine, verify=verify)
    raise KilnError("the pipeline has no schedule stage, so there is no makespan to tune")


def run_trial(context: Context, candidate: tuple[int, ...], chosen: dict) -> Trial:
    try:
        scheduled = compile_to_schedule(context, chosen, verify=False)
    except KilnError as err:
        return Trial(candidate, None, err.message)
    except (MemoryError, RecursionError) as exc:
        return Trial(candidate, None, f"{type(exc).__name__}")
    return Trial(candidate, int(scheduled.makespan))


# A worker process prices many candidates of one context: ship it once.
_WORKER_CONTEXT: Context | None = None


def init_worker(context: Context) -> None:
    global _WORKER_CONTEXT
    _WORKER_CONTEXT = context


def run_worker_trial(candidate: tuple[int, ...], chosen: dict) -> Trial:
    assert _WORKER_CONTEXT is not None, "init_worker was not called in this process"
    return run_trial(_WORKER_CONTEXT, candidate, chosen)
