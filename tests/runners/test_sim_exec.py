"""The simulator's bound fast paths compute exactly what lir_exec's semantics compute."""

from __future__ import annotations

import numpy as np
import pytest

import kernels.elementwise as elementwise
import kernels.linalg as linalg
import kernels.normalization as normalization
import kernels.reductions as reductions
from kiln.inputs import random_inputs
from kiln.ir.lir_exec import apply, run_program
from kiln.lang import trace
from kiln.runners.sim import SimBinary, SimRunner
from kiln.runners.sim_decode import columns_of
from kiln.runners.sim_exec import FAST, bind
from tests.runners.test_sim import compile_graph, machine

CASES = [
    (elementwise.vector_add, {"N": 1000}),
    (linalg.gemm, {"M": 48, "K": 80, "N": 40}),
    (linalg.gemm_bias_relu, {"M": 33, "K": 64, "N": 50}),
    (linalg.transpose, {"M": 40, "N": 24}),
    (normalization.softmax, {"R": 24, "C": 96}),
    (normalization.layernorm, {"R": 16, "C": 200}),
    (reductions.row_sum, {"R": 20, "C": 130}),
    (reductions.row_max, {"R": 20, "C": 130}),
]


@pytest.mark.parametrize("machine_name", ["npu-v1", "npu-tiny"])
@pytest.mark.parametrize("dtype", ["f32", "i32", "f16"])
@pytest.mark.parametrize("fn,bindings", CASES, ids=[f.__name__ for f, _ in CASES])
def test_bound_execution_is_bitwise_equal_to_the_reference_executor(
    fn, bindings, dtype, machine_name
):
    if dtype == "i32" and fn in (normalization.softmax, normalization.layernorm):
        pytest.skip("softmax/layernorm need floats")
    graph = trace(fn, bindings, dtype)
    edf = compile_graph(graph, machine(machine_name))
    inputs = random_inputs(graph.name, [(a.shape, a.dtype) for a in graph.args])
    reference = run_program(edf.scheduled.program, inputs)
    fast = SimRunner(machine=machine(machine_name)).run(SimBinary.load(edf), inputs).outputs
    for want, got in zip(reference, fast, strict=True):
        assert want.dtype == got.dtype
        np.testing.assert_array_equal(got, want)


def test_fast_paths_cover_the_common_opcodes_and_are_used():
    graph = trace(normalization.layernorm, {"R": 16, "C": 64}, "f32")
    edf = compile_graph(graph, machine())
    cols = columns_of(edf.scheduled)
    generic = {t.opcode for t, fast in zip(cols.templates, cols.fast, strict=True) if not fast}
    assert {"load", "store", "mma", "add", "sum", "max"} <= set(FAST)
    # everything layernorm needs in f32 except rsqrt runs on a fast path
    assert generic <= {"rsqrt"}, generic
    assert SimBinary.load(edf).bound == "columns"


def test_one_instruction_binds_to_what_its_template_binds():
    """``bind`` (one Instr) takes the same path as the template its instruction is in."""
    graph = trace(normalization.layernorm, {"R": 16, "C": 64}, "f32")
    edf = compile_graph(graph, machine())
    program = edf.scheduled.program
    dram = np.zeros(program.dram_bytes, np.uint8)
    sram = np.zeros(program.sram_bytes, np.uint8)
    cols = columns_of(edf.scheduled)
    for t, fast in zip(cols.templates, cols.fast, strict=True):
        for k in t.rows.tolist():
            step = bind(program.instrs[k], dram, sram)
            assert (step.func is apply) == (fast is None), program.instrs[k]


def test_a_binary_runs_many_times_with_fresh_memory():
    graph = trace(linalg.gemm, {"M": 32, "K": 32, "N": 32}, "f32")
    binary = SimBinary.load(compile_graph(graph, machine()))
    runner = SimRunner(machine=machine())
    a = random_inputs("a", [((32, 32), "f32")] * 2)
    b = random_inputs("b", [((32, 32), "f32")] * 2)
    first = runner.run(binary, a).outputs[0]
    runner.run(binary, b)
    again = runner.run(binary, a).outputs[0]
    np.testing.assert_array_equal(first, again)
    np.testing.assert_allclose(first, a[0] @ a[1], rtol=1e-5, atol=1e-5)
