"""Run one kernel body on every target: cpu (eager), sim (npu-v1 and npu-tiny), iree-cpu.

The property tests of the op families build a kernel from a body and concrete
input arrays, and compare what each target returns with a float64 numpy
reference. IREE compiles are cached in one directory for the whole session
(see tests/lang/conftest.py), so a shape seen before costs a file read.
"""

from __future__ import annotations

import importlib.util

import numpy as np

from kiln import Tensor, device
from kiln.compare import compare
from kiln.ir.interp import kiln_dtype
from kiln.lang import trace
from kiln.runners.base import KernelArtifacts
from kiln.runners.sim import SimRunner
from tests.runners.test_sim import compile_graph, machine

HAS_IREE = importlib.util.find_spec("iree") is not None and (
    importlib.util.find_spec("iree.compiler") is not None
)
SIM_MACHINES = ("npu-v1", "npu-tiny")


def kernel(body, arrays: list[np.ndarray], name: str = "prop"):
    """A @device kernel over arguments shaped like ``arrays`` that returns ``body(*args)``."""
    names = [f"a{i}" for i in range(len(arrays))]

    def fn(*args):
        return body(*args)

    params = ", ".join(names)
    namespace = {"fn": fn}
    exec(f"def {name}({params}):\n    return fn({params})\n", namespace)  # noqa: S102
    kern = namespace[name]
    kern.__annotations__ = {n: Tensor[tuple(a.shape)] for n, a in zip(names, arrays, strict=True)}
    return device(kern)


def run_all(body, arrays: list[np.ndarray], machines=SIM_MACHINES, iree: bool = True) -> dict:
    """Target name -> the kernel's output (a list of outputs when it returns a tuple)."""
    kern = kernel(body, arrays)
    dtypes = {f"a{i}": kiln_dtype(a.dtype) for i, a in enumerate(arrays)}
    graph = trace(kern, {}, dtypes)
    eager = kern(*arrays)
    several = isinstance(eager, tuple)
    results = {"cpu": [np.asarray(e) for e in eager] if several else [np.asarray(eager)]}
    for name in machines:
        m = machine(name)
        edf = compile_graph(graph, m)
        results[f"sim {name}"] = SimRunner(machine=m).run(edf, arrays).outputs
    if iree and HAS_IREE:
        from kiln.runners.iree import IreeRunner

        runner = IreeRunner(options={"device": "llvm-cpu"})
        prepared = runner.prepare(KernelArtifacts(graph.name, graph, None, None))
        results["iree-cpu"] = runner.run(prepared, arrays).outputs
    if not several:
        return {k: v[0] for k, v in results.items()}
    return results


def assert_targets_agree(results: dict, dtype: str | list[str], names=None) -> None:
    """Every target equals the cpu oracle under ``kiln test``'s per-dtype tolerance."""
    expected = results["cpu"]
    many = isinstance(expected, list)
    expected = expected if many else [expected]
    dtypes = dtype if isinstance(dtype, list) else [dtype] * len(expected)
    for target, actual in results.items():
        actual = actual if many else [actual]
        for i, (e, a, dt) in enumerate(zip(expected, actual, dtypes, strict=True)):
            c = compare(i, e, a, dt)
            label = names[i] if names else f"output {i}"
            assert c.ok, f"{target}, {label}: {c.describe()}"


def assert_close(actual: np.ndarray, reference: np.ndarray, rtol: float, atol: float) -> None:
    """The oracle against a float64 reference (NaN where the reference is NaN)."""
    actual = np.asarray(actual, dtype=np.float64)
    assert actual.shape == reference.shape, f"shape {actual.shape} != {reference.shape}"
    np.testing.assert_allclose(actual, reference, rtol=rtol, atol=atol, equal_nan=True)
