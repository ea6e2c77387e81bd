"""The visa stage: what gets fused, tiled and stored; options; errors; artifacts and dumps.

Numeric correctness of every lowering is pinned end to end in test_lir.py;
here we look at the vISA program itself.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln import Tensor, device
from kiln.errors import ArtifactError, StageError, VerifyError
from kiln.ir import visa
from kiln.ir.graph import Graph, Node, TensorType, make_attrs
from kiln.ir.interp import run_graph
from kiln.ir.lir_exec import run_program
from kiln.ir.ops import infer
from kiln.lang import trace
from kiln.options import build_options
from kiln.stages import lir as lir_stage
from kiln.stages import visa as visa_stage
from tests.stages.machines import MACHINES

REPO = Path(__file__).resolve().parents[2]

V1 = MACHINES["npu-v1"]


class GraphBuilder:
    def __init__(self, name: str):
        self.name, self.nodes, self.nargs = name, [], 0

    def _add(self, op, inputs, attrs, declared=None) -> int:
        frozen = make_attrs(**attrs)
        typ = infer(op, [self.nodes[i].type for i in inputs], dict(frozen), declared=declared)
        self.nodes.append(Node(len(self.nodes), op, tuple(inputs), typ, frozen))
        return len(self.nodes) - 1

    def arg(self, name, shape, dtype="f32") -> int:
        self.nargs += 1
        return self._add(
            "arg", (), {"name": name, "index": self.nargs - 1}, TensorType(tuple(shape), dtype)
        )

    def const(self, value, dtype="f32") -> int:
        return self._add("const", (), {"value": value}, TensorType((), dtype))

    def __getattr__(self, op):
        return lambda *inputs, **attrs: self._add(op, inputs, attrs)

    def graph(self, *outputs) -> Graph:
        return Graph(self.name, tuple(self.nodes), tuple(outputs))


def kernel(name: str, **bindings) -> Graph:
    from kernels import elementwise, linalg, normalization, reductions

    for module in (elementwise, linalg, normalization, reductions):
        if hasattr(module, name):
            return trace(getattr(module, name), bindings, "f32")
    raise KeyError(name)


def lower(graph: Graph, machine: str = "npu-v1", **options) -> visa.Program:
    program = visa_stage.run(graph, visa_stage.Options(**options), MACHINES[machine])
    visa_stage.verify(program, MACHINES[machine])
    return program


def ops(program: visa.Program) -> list[str]:
    return [i.op for i in program.instrs]


def scratch(program: visa.Program) -> list[str]:
    return [t.name for t in program.tensors if t.role == "scratch"]


def compile_and_run(program: visa.Program, graph: Graph, machine: str = "npu-v1"):
    lowered = lir_stage.run(program, lir_stage.Options(), MACHINES[machine])
    lir_stage.verify(lowered, MACHINES[machine])
    rng = np.random.default_rng(1)
    inputs = [rng.uniform(0.5, 2, a.shape).astype(np.float32) for a in graph.args]
    for want, got in zip(run_graph(graph, inputs), run_program(lowered, inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# -- fusion ----------------------------------------------------------------------------


def test_matmul_epilogue_runs_on_the_resident_tile():
    program = lower(kernel("gemm_bias_relu", M=64, K=128, N=64))
    assert ops(program) == ["load", "load", "mma", "load", "add", "relu", "store"]
    assert scratch(program) == []
    bias = program.instrs[3].srcs[0]
    assert isinstance(bias, visa.View) and bias.strides[0] == 0, "bias is a stride-0 load"


def test_without_fusion_every_op_stores_its_result():
    program = lower(kernel("gemm_bias_relu", M=64, K=128, N=64), fusion=False)
    assert len(scratch(program)) == 2
    assert ops(program).count("store") == 3


def test_softmax_rows_stay_resident():
    program = lower(kernel("softmax", R=64, C=128))
    box = ["load", "max", "sub", "exp", "sum", "div", "store"]
    assert ops(program) == box * 2  # two boxes of 32 whole rows: x is read once, never x - max
    (sub,) = {i for i in program.instrs if i.op == "sub"}
    assert sub.srcs[1].shape == (32, 1), "the row max is a broadcast operand"
    assert scratch(program) == []
    unfused = lower(kernel("softmax", R=64, C=128), fusion=False)
    assert len(scratch(unfused)) == 4  # max, x - max, exp, sum


def test_rows_longer_than_a_tile_accumulate_across_tiles():
    graph = kernel("softmax", R=4, C=8192)
    program = lower(graph, vector_tile=1024)
    maxes = [i for i in program.instrs if i.op == "max"]
    assert [i.attr("acc") for i in maxes[:8]] == [0] + [1] * 7
    assert scratch(program)  # the row max and sum go through DRAM
    compile_and_run(program, graph)


def test_reshape_and_broadcast_are_views_not_copies():
    b = GraphBuilder("views")
    x = b.arg("x", (8, 32))
    flat = b.reshape(x, shape=(256,))
    col = b.broadcast(b.arg("c", (8, 1)), shape=(8, 32))
    graph = b.graph(b.exp(flat), b.mul(x, col))
    program = lower(graph)
    assert ops(program) == ["load", "exp", "store", "load", "load", "mul", "store"]
    assert program.instrs[4].srcs[0].strides == (1, 0)


def _leading_part_of_a_concat(a):
    return kiln.concatenate([a, a])[:7]


def _first_row_of_a_stack(a):
    return kiln.stack([a, a])[0]


def _arange_of_an_odd_length(a):
    return kiln.arange(a.shape[0])


@pytest.mark.parametrize(
    "body", [_leading_part_of_a_concat, _first_row_of_a_stack, _arange_of_an_odd_length]
)
def test_an_output_that_is_part_of_a_computed_value_is_copied_out(body):
    """A leading slice starts at offset 0 and is contiguous, but it is not the whole
    value: the value keeps a home of its own and the output is copied from it (it was
    made the output's home, and the stores ran past the output's end)."""
    fn = device(body)
    fn.__annotations__["a"] = Tensor["N"]
    graph = trace(fn, {"N": 7}, "f32")
    program = lower(graph)
    assert program.instrs[-1].op == "store"
    compile_and_run(program, graph)


def test_scalar_constants_are_immediates():
    b = GraphBuilder("imm")
    x = b.arg("x", (4, 4))
    graph = b.graph(b.sub(b.broadcast(b.const(1.5), shape=(4, 4)), x))
    (sub,) = [i for i in lower(graph).instrs if i.op == "sub"]
    assert sub.srcs[0] == visa.Imm(1.5, "f32")


@pytest.mark.filterwarnings("error")  # numpy's overflow warning must not reach the user
def test_a_constant_that_overflows_f16_is_an_inf_immediate_without_a_warning():
    b = GraphBuilder("imm16")
    x = b.arg("x", (4, 4), "f16")
    graph = b.graph(b.mul(x, b.broadcast(b.const(70000.0, "f16"), shape=(4, 4))))
    (mul,) = [i for i in lower(graph).instrs if i.op == "mul"]
    assert mul.srcs[1] == visa.Imm(float("inf"), "f16")


def test_conv2d_is_an_implicit_gemm_over_a_padded_copy():
    b = GraphBuilder("conv")
    x, w = b.arg("x", (1, 8, 8, 4)), b.arg("w", (3, 3, 4, 16))
    graph = b.graph(b.conv2d(x, w, stride=(1, 1), padding=(1, 1), dilation=(1, 1)))
    program = lower(graph)
    assert "pad2" in scratch(program)
    assert ops(program).count("mma") == 9  # one output tile, one mma per kernel tap
    gathers = [i.srcs[0] for i in program.instrs if i.op == "load" and i.dst.buf == "lhs2"]
    assert all(v.tensor == "pad2" for v in gathers)
    compile_and_run(program, graph)


def test_batched_matmul_loops_over_the_batch():
    program = lower(kernel("batched_matmul", B=4, M=32, K=64, N=32))
    assert ops(program).count("mma") == 4


# -- tiles and options --------------------------------------------------------------------


def test_tile_options_set_the_tile_buffers():
    program = lower(kernel("gemm", M=128, K=128, N=128), tile_m=32, tile_n=64, tile_k=16)
    shapes = {b.name: b.shape for b in program.buffers}
    assert shapes == {"acc2": (32, 64), "lhs2": (32, 16), "rhs2": (16, 64)}
    assert ops(program).count("mma") == 4 * 2 * 8


def test_default_tiles_derive_from_the_machine():
    graph = kernel("gemm", M=512, K=512, N=512)
    assert lower(graph).buffer_map()["lhs2"].shape == (128, 128)  # 4x the 32x32 tensor tile
    assert lower(graph, "npu-tiny").buffer_map()["lhs2"].shape == (32, 32)  # fits 64 KiB


def test_vector_tile_bounds_elementwise_tiles():
    program = lower(kernel("vector_add", N=4096), vector_tile=512)
    assert all(b.size <= 512 for b in program.buffers)
    assert ops(program).count("add") == 8


def test_bad_options_are_stage_errors():
    with pytest.raises(StageError, match="must be >= 0"):
        lower(kernel("gemm", M=64, K=64, N=64), tile_m=-1)
    with pytest.raises(StageError) as err:
        build_options(visa_stage.Options, {"tile_mm": 64}, "visa")
    assert "tile_m" in err.value.expected and err.value.hint == "did you mean 'tile_m'?"
    with pytest.raises(StageError, match="wrong type"):
        build_options(visa_stage.Options, {"fusion": "yes"}, "visa")


def test_an_op_the_stage_cannot_lower_names_kernel_and_op():
    t = TensorType((4,), "f32")
    nodes = (Node(0, "arg", (), t, make_attrs(name="x", index=0)), Node(1, "fft", (0,), t))
    with pytest.raises(StageError, match="kernel odd: the visa stage cannot lower op 'fft'"):
        visa_stage.run(Graph("odd", nodes, (1,)), visa_stage.Options(), V1)


# -- artifacts, dumps, hand edits ---------------------------------------------------------


def test_artifact_round_trips_through_read(tmp_path):
    program = lower(kernel("layernorm", R=64, C=128))
    path = tmp_path / visa_stage.ARTIFACT
    path.write_bytes(visa_stage.serialize(program))
    assert visa_stage.read(path) == program
    dump = tmp_path / "dump.visa"
    visa_stage.DUMPS["visa"](program, dump, V1)
    assert dump.read_bytes() == path.read_bytes()


def test_corrupt_artifact_names_file_line_and_expectation(tmp_path):
    path = tmp_path / "kernel.visa"
    text = visa_stage.serialize(lower(kernel("gemm", M=64, K=64, N=64))).decode()
    path.write_text(text.replace("mma ", "mmx ", 1))
    with pytest.raises(ArtifactError) as err:
        visa_stage.read(path)
    line = text.splitlines().index(next(x for x in text.splitlines() if x.startswith("mma"))) + 1
    assert err.value.location.file == str(path) and err.value.location.line == line
    assert "an opcode" in err.value.expected and err.value.found == "mmx"
    with pytest.raises(ArtifactError, match="cannot read"):
        visa_stage.read(tmp_path / "missing.visa")


def test_verify_failure_names_stage_instruction_and_rule():
    program = lower(kernel("gemm", M=64, K=64, N=64))
    broken = visa.Program(
        program.kernel, program.bindings, program.tensors, program.buffers, program.instrs[1:]
    )
    with pytest.raises(VerifyError) as err:
        visa_stage.verify(broken, V1)
    assert "stage visa" in str(err.value) and "instruction 1 (mma" in str(err.value)
    assert "read before it is written" in str(err.value)


def test_hand_edited_dump_still_compiles_and_runs():
    b = GraphBuilder("edit")
    x, w = b.arg("x", (64, 64)), b.arg("w", (64, 64))
    y = b.matmul(x, w)
    b.exp(y)  # dead: computed on the tile, never stored
    graph = b.graph(b.relu(y))
    text = visa_stage.serialize(lower(graph)).decode()
    lines = text.splitlines()
    # delete the redundant instruction, and grow a buffer (consistently: all uses still fit)
    lines = [line for line in lines if not line.startswith("exp ")]
    lines = [line.replace("buffer %lhs2 f32[64,64]", "buffer %lhs2 f32[128,64]") for line in lines]
    edited = visa.parse("\n".join(lines) + "\n")
    visa.verify(edited)
    assert edited.buffer_map()["lhs2"].shape == (128, 64) and "exp" not in ops(edited)
    compile_and_run(edited, graph)
    # shrinking a buffer below what its tiles use is caught by verify, naming the instruction
    shrunk = visa.parse(text.replace("buffer %lhs2 f32[64,64]", "buffer %lhs2 f32[32,64]"))
    with pytest.raises(VerifyError, match=r"instruction 0 \(load %lhs2.*exceeds the buffer"):
        visa_stage.verify(shrunk, V1)


def test_output_is_deterministic_across_hash_seeds():
    script = (
        "import hashlib, sys\n"
        "from kiln.lang import trace\n"
        "from kernels.normalization import layernorm\n"
        "from stages import visa, lir\n"
        "import yaml\n"
        "m = dict(yaml.safe_load(open('pipeline.yaml'))['machines']['npu-tiny'], name='t')\n"
        "p = visa.run(trace(layernorm, {'R': 64, 'C': 128}), visa.Options(), m)\n"
        "l = lir.run(p, lir.Options(), m)\n"
        "print(hashlib.sha256(visa.serialize(p) + lir.serialize(l)).hexdigest())\n"
    )
    digests = set()
    for seed in ("1", "2"):
        env = {"PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
        out = subprocess.run(
            [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        digests.add(out.stdout.strip())
    assert len(digests) == 1


@pytest.mark.parametrize("name", ["gemm", "gemm_bias_relu"])
def test_column_order_visits_output_tiles_by_columns_with_the_same_result(name):
    graph = kernel(name, M=96, K=64, N=160)
    rows = lower(graph, tile_m=32, tile_n=32, tile_order="mn")
    cols = lower(graph, tile_m=32, tile_n=32, tile_order="nm")
    compile_and_run(cols, graph)
    stores = lambda p: [i.dst.offset for i in p.instrs if i.op == "store"]  # noqa: E731
    assert sorted(stores(rows)) == sorted(stores(cols)) and stores(rows) != stores(cols)
    # row order: offsets grow along n first; column order: along m first (stride N)
    assert stores(cols)[1] - stores(cols)[0] == 32 * 160


def test_an_unknown_tile_order_is_a_stage_error():
    with pytest.raises(StageError, match="'tile_order' of stage 'visa' must be one of mn, nm"):
        lower(kernel("gemm", M=64, K=64, N=64), tile_order="km")


def long_rows(op: str) -> Graph:
    b = GraphBuilder(f"row_{op}")
    x = b.arg("x", (4, 300))  # a product of 300 values in [0.5, 2] stays finite
    return b.graph(getattr(b, op)(x, axes=(1,), keepdims=False))


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("split", [2, 3])
def test_a_split_reduction_alternates_accumulators_and_combines_them(op, split):
    graph = long_rows(op)
    program = lower(graph, vector_tile=64, reduce_split=split)
    compile_and_run(program, graph)
    combine = {"sum": "add", "mean": "add", "prod": "mul", "max": "maximum", "min": "minimum"}
    assert ops(program).count(combine[op]) == 4 * (split - 1)  # once per row
    names = {b.name for b in program.buffers}
    assert {f"acc1_{i}" for i in range(1, split)} <= names


def test_reduce_split_is_bounded():
    with pytest.raises(StageError, match="'reduce_split' of stage 'visa' must be between 1 and 8"):
        lower(kernel("row_sum", R=4, C=64), reduce_split=0)
