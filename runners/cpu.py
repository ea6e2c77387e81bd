"""The cpu target: the @device function run eagerly on numpy. It is the oracle."""

from __future__ import annotations

import time

import numpy as np

from kiln.runners.base import KernelArtifacts, Runner, RunResult


class CpuRunner(Runner):
    kind = "cpu"
    host_only = True
    reproducible = True

    def prepare(self, artifacts: KernelArtifacts):
        if artifacts.function is not None:
            return artifacts.function
        from kiln.ir.interp import run_graph

        return lambda *inputs: run_graph(artifacts.graph, list(inputs))

    def run(self, prepared, inputs: list[np.ndarray]) -> RunResult:
        start = time.perf_counter()
        out = prepared(*inputs)
        elapsed = time.perf_counter() - start
        outputs = list(out) if isinstance(out, (tuple, list)) else [out]
        return RunResult([np.asarray(o) for o in outputs], {"seconds": elapsed})
