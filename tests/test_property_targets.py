"""Property: random small kernels compile through every stage and agree with the oracle.

A kernel is a short random program in the kernel language over
``x: [R, C]``, ``y: [C]`` and ``w: [C, N]`` (sizes 1..48): elementwise
chains (unary ops, casts, transposes, flips), operands broadcast from a row
vector, a scalar on either side or a reduction, matmuls (with ``w``, ``w.T``,
``v.T @ v`` or a broadcast operand) and an optional final reduction (sums,
products, argmax, var, logsumexp; keepdims), in f32, f16, bf16 or i32. It is
traced, lowered by the stage modules in-process (trace -> visa -> lir ->
schedule -> edf, for npu-v1 and npu-tiny), encoded and decoded as an EDF, run
on the sim and compared with the eager @device call under the per-dtype
tolerance of ``kiln test``; separately compiled and run by IREE on the CPU.

Examples are derandomized (same inputs on every run, no example
database), so CI sees the same programs every time.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kiln
from kiln import Tensor, device
from kiln.compare import compare
from kiln.inputs import random_inputs
from kiln.lang import trace
from kiln.runners.base import KernelArtifacts
from kiln.runners.sim import SimRunner
from tests.runners.test_sim import compile_graph, machine

# ruff: noqa: F821  (Tensor["R"] names a dim)

FLOATS = ("f32", "f16", "bf16")

# name -> (function, dtypes it is valid for)
UNARY = {
    "neg": (lambda v: -v, None),
    "abs": (lambda v: abs(v), None),
    "relu": (lambda v: v.relu(), None),
    "tanh": (lambda v: v.tanh(), FLOATS),
    "sigmoid": (lambda v: v.sigmoid(), FLOATS),
    "exp-tanh": (lambda v: v.tanh().exp(), FLOATS),  # bounded, so no overflow in f16
    "log1p-abs": (lambda v: (abs(v) + 1).log(), FLOATS),
    "sqrt-abs": (lambda v: abs(v).sqrt(), FLOATS),
    "rsqrt": (lambda v: (abs(v) + 1).rsqrt(), FLOATS),
    "gelu": (lambda v: v.gelu(), FLOATS),
    "erf": (kiln.erf, FLOATS),
    "expm1-tanh": (lambda v: kiln.expm1(v.tanh()), FLOATS),
    "log1p-abs1": (lambda v: kiln.log1p(abs(v)), FLOATS),
    "softplus": (kiln.softplus, FLOATS),
    "silu": (kiln.silu, FLOATS),
    "pow-const": (lambda v: (abs(v) + 0.5) ** 1.5, FLOATS),
    "floor": (lambda v: kiln.floor(v * 3), None),
    "ceil": (lambda v: kiln.ceil(v * 3), None),
    "round": (lambda v: kiln.round(v * 3), None),
    "sign": (kiln.sign, None),
    "square": (kiln.square, None),
    "clip": (lambda v: kiln.clip(v, -0.5, 2), None),
    "transpose": (lambda v: v.T, None),
    "flip": (lambda v: v[::-1], None),
    "to-f16": (lambda v: v.astype("float16"), None),
    "to-bf16": (lambda v: v.astype("bfloat16"), None),
    "to-i32": (lambda v: (v * 4).astype("int32"), None),
}
BINARY = {
    "add": (lambda a, b: a + b, None),
    "sub": (lambda a, b: a - b, None),
    "mul": (lambda a, b: a * b, None),
    "max": (kiln.maximum, None),
    "min": (kiln.minimum, None),
    "where": (lambda a, b: kiln.where(a > b, a, b), None),
    "div": (lambda a, b: a / (abs(b) + 1), FLOATS),
    "pow": (lambda a, b: kiln.tanh(abs(a)) ** kiln.tanh(b), FLOATS),
    "compare": (lambda a, b: (a >= b) + (a != b), None),
}
PARTNERS = ("self", "x", "y", "scalar", "row-sum", "col-max", "bcast-y", "scalar-left")
FINAL = (
    *("none", "sum-rows", "max-cols", "mean-rows", "min-all", "sum-cols-keep", "prod-rows"),
    *("argmax-rows", "var-cols", "logsumexp-rows"),
)
FLOAT_FINALS = ("mean-rows", "var-cols", "logsumexp-rows")


@dataclass(frozen=True)
class Recipe:
    dtype: str
    sizes: tuple[tuple[str, int], ...]
    steps: tuple[tuple[str, str, str], ...]  # (kind, op, partner)
    final: str

    def __repr__(self) -> str:  # what hypothesis prints for a falsifying example
        return (
            f"Recipe({self.dtype!r}, {dict(self.sizes)}, steps={list(self.steps)}, {self.final!r})"
        )


def _valid(table: dict, dtype: str) -> list[str]:
    return [name for name, (_, dtypes) in table.items() if dtypes is None or dtype in dtypes]


@st.composite
def recipes(draw) -> Recipe:
    dtype = draw(st.sampled_from(("f32", "f16", "bf16", "i32")))
    size = st.integers(1, 48)
    sizes = (("C", draw(size)), ("N", draw(size)), ("R", draw(size)))
    step = st.one_of(
        st.tuples(st.just("unary"), st.sampled_from(_valid(UNARY, dtype)), st.just("")),
        st.tuples(
            st.just("binary"), st.sampled_from(_valid(BINARY, dtype)), st.sampled_from(PARTNERS)
        ),
        st.tuples(st.just("matmul"), st.sampled_from(("w", "gram", "bcast-y")), st.just("")),
    )
    steps = tuple(draw(st.lists(step, min_size=1, max_size=5)))
    finals = [f for f in FINAL if not (dtype == "i32" and f in FLOAT_FINALS)]
    return Recipe(dtype, sizes, steps, draw(st.sampled_from(finals)))


def _broadcastable(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    try:
        np.broadcast_shapes(a, b)
    except ValueError:
        return False
    return True


def make_kernel(recipe: Recipe):
    dims = dict(recipe.sizes)
    scalar = 3 if recipe.dtype == "i32" else 0.75

    def partner(name: str, v, x, y):
        candidates = {
            "self": lambda: v,
            "x": lambda: x,
            "y": lambda: y,
            "row-sum": lambda: v.sum(axis=-1, keepdims=True),
            "col-max": lambda: v.max(axis=0, keepdims=True),
            "bcast-y": lambda: kiln.broadcast_to(y, (dims["R"], dims["C"])),
        }
        if name in candidates:
            p = candidates[name]()
            if _broadcastable(v.shape, p.shape):
                return p
        return scalar

    def binary(op: str, other: str, v, x, y):
        if other == "scalar-left":  # the Python number on the left: 3 - v, max(0.75, v)
            return BINARY[op][0](scalar, v)
        return BINARY[op][0](v, partner(other, v, x, y))

    @device
    def prop(x: Tensor["R", "C"], y: Tensor["C"], w: Tensor["C", "N"]):
        v = x
        for kind, op, other in recipe.steps:
            if kind == "unary":
                v = UNARY[op][0](v)
            elif kind == "binary":
                v = binary(op, other, v, x, y)
            elif op == "gram":
                v = v.T @ v
            elif op == "bcast-y" and v.shape[-1] == dims["C"]:  # a broadcast as an operand
                v = v @ w + kiln.broadcast_to(y, v.shape) @ w
            elif v.shape[-1] == dims["C"]:
                v = v @ w
            elif v.shape[-1] == dims["N"]:
                v = v @ w.T
        if recipe.final == "sum-rows":
            v = v.sum(axis=-1)
        elif recipe.final == "max-cols":
            v = v.max(axis=0)
        elif recipe.final == "mean-rows":
            v = v.mean(axis=-1, keepdims=True)
        elif recipe.final == "min-all":
            v = v.min(axis=(0, 1))
        elif recipe.final == "sum-cols-keep":
            v = v.sum(axis=-2, keepdims=True)
        elif recipe.final == "prod-rows":
            v = (v.tanh() if v.dtype in FLOATS else v).prod(axis=-1)  # no overflow in floats
        elif recipe.final == "argmax-rows":
            v = kiln.argmax(v, axis=-1)
        elif recipe.final == "var-cols":
            v = v.var(axis=0, ddof=1) if v.shape[0] > 1 else v.var(axis=0)
        elif recipe.final == "logsumexp-rows":
            v = kiln.logsumexp(v, axis=-1)
        return v

    return prop


def oracle(recipe: Recipe):
    """The traced graph, seeded inputs and the eager result (the cpu target)."""
    fn = make_kernel(recipe)
    graph = trace(fn, dict(recipe.sizes), recipe.dtype)
    inputs = random_inputs(repr(recipe), [(a.shape, a.dtype) for a in graph.args])
    expected = fn(*inputs)
    expected = [np.asarray(e) for e in (expected if isinstance(expected, tuple) else (expected,))]
    return graph, inputs, expected


def assert_agrees(graph, expected, outputs, target: str) -> None:
    assert len(outputs) == len(expected)
    for i, (e, a, node) in enumerate(zip(expected, outputs, graph.output_nodes, strict=True)):
        assert a.shape == e.shape, f"{target}: shape {a.shape} != {e.shape}"
        c = compare(i, e, a, node.dtype)
        assert c.ok, f"{target}: {c.describe()}"


COMMON = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@settings(max_examples=60, **COMMON)
@given(recipes())
def test_random_kernels_agree_with_the_oracle_on_sim(recipe):
    graph, inputs, expected = oracle(recipe)
    for name in ("npu-v1", "npu-tiny"):
        m = machine(name)
        edf = compile_graph(graph, m)
        runner = SimRunner(machine=m)
        runner.check(edf.scheduled, f"{graph.name} on {name}")
        result = runner.run(edf, inputs)
        assert_agrees(graph, expected, result.outputs, f"sim {name}")
        assert result.metrics["cycles"] == edf.scheduled.makespan


HAS_IREE = importlib.util.find_spec("iree") is not None and (
    importlib.util.find_spec("iree.compiler") is not None
)


@pytest.fixture(scope="module")
def iree_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KILN_CACHE_DIR", str(tmp_path_factory.mktemp("kiln-cache")))
        yield


@pytest.mark.skipif(not HAS_IREE, reason="iree-base-compiler/runtime not installed")
@settings(max_examples=10, **COMMON)  # ~1 s per IREE compile on 2 cores
@given(recipe=recipes())
def test_random_kernels_agree_with_the_oracle_on_iree_cpu(iree_cache, recipe):
    from kiln.runners.iree import IreeRunner

    graph, inputs, expected = oracle(recipe)
    runner = IreeRunner(options={"device": "llvm-cpu"})
    prepared = runner.prepare(KernelArtifacts(graph.name, graph, None, None))
    assert_agrees(graph, expected, runner.run(prepared, inputs).outputs, "iree-cpu")
