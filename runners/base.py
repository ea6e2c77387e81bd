"""The runner protocol: prepare a compiled kernel once, then run it on inputs.

A runner is found by name: first among Kiln's own (``cpu``, ``sim``,
``iree``, ``npu``), then in the ``kiln.runners`` entry-point group, so a
hardware vendor ships a plugin package without touching Kiln.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import TargetError
from kiln.ir.graph import Graph

BUILTIN_RUNNERS = {
    "cpu": "kiln.runners.cpu:CpuRunner",
    "sim": "kiln.runners.sim:SimRunner",
    "iree": "kiln.runners.iree:IreeRunner",
    "npu": "kiln.runners.npu:NpuRunner",
}


@dataclass(frozen=True)
class KernelArtifacts:
    """What the compile stages produced for one kernel at one shape set."""

    name: str  # instance name, e.g. "gemm.small"
    graph: Graph
    out_dir: Path
    edf: Path | None = None  # absent when the pipeline stops before the EDF stage
    function: Any = None  # the @device function itself (the cpu runner calls it)


@dataclass
class RunResult:
    outputs: list[np.ndarray]
    metrics: dict[str, Any] = field(default_factory=dict)


class Runner:
    """Base class. Subclasses set ``kind`` and implement prepare/run."""

    kind = "base"
    # the project's artifact cache (kiln.cache.config.CacheConfig), set by the task
    # layer: a runner that compiles (iree) shares its outputs through the same store
    artifact_cache = None
    # True when a report depends only on the artifacts' bytes and the runner's
    # code and settings (never on a device or another compiler): such reports
    # are kept in the artifact cache
    reproducible = False
    # True when the runner runs on the host alone, with no device to choose
    # (`kiln bench --device N` leaves it alone)
    host_only = False

    def __init__(self, options: dict[str, Any] | None = None, machine: dict | None = None):
        self.options = dict(options or {})
        self.machine = machine

    def check_options(self) -> None:
        """TargetError for a bad ``options:`` value, raised before anything is built."""

    def unavailable(self) -> str | None:
        """Why this runner cannot run here (missing extra, no device), or None."""
        return None

    def prepare(self, artifacts: KernelArtifacts) -> Any:
        """Load/compile what ``run`` needs; called once per kernel instance."""
        raise NotImplementedError

    def run(self, prepared: Any, inputs: list[np.ndarray]) -> RunResult:
        raise NotImplementedError


def load_runner_class(name: str) -> type[Runner]:
    """The runner class for a target's ``runner:`` value."""
    spec = BUILTIN_RUNNERS.get(name)
    if spec is None:
        found = [ep for ep in entry_points(group="kiln.runners") if ep.name == name]
        if not found:
            raise TargetError(
                f"unknown runner {name!r}",
                expected="one of: " + ", ".join(sorted(BUILTIN_RUNNERS)) + " or a plugin "
                "registered in the 'kiln.runners' entry-point group",
                found=name,
            )
        try:
            return found[0].load()
        except Exception as exc:  # a broken plugin is the plugin's problem, said plainly
            raise TargetError(
                f"the runner plugin {name!r} ({found[0].value}) cannot be loaded: "
                f"{type(exc).__name__}: {exc}",
                hint="reinstall the plugin, or run on the simulator instead: --target sim",
            ) from None
    module_name, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module_name), attr)
