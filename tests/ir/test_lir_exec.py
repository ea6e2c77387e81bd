"""LIR opcode semantics in numpy: each opcode on hand-made instructions, bounds, run_program."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kiln.ir import visa
from kiln.ir.graph import TensorType
from kiln.ir.interp import evaluate
from kiln.ir.lir import ArgSlot, Instr, Program
from kiln.ir.lir_exec import OPCODES, LirExecError, execute, run_program

F32 = np.float32


def instr(opcode, dst, *srcs, **attrs) -> Instr:
    args = {"dst": dst, "srcs": tuple(srcs), **attrs}
    return Instr(0, "vector0", opcode, (), (), 0, 1, (), tuple(sorted(args.items())), opcode)


def memories(dram_bytes=4096, sram_bytes=4096):
    return np.zeros(dram_bytes, np.uint8), np.zeros(sram_bytes, np.uint8)


def put(mem, addr, array):
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    mem[addr : addr + raw.size] = raw


def get(mem, addr, dtype, shape):
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return mem[addr : addr + n].view(dtype).reshape(shape)


def tile(addr, shape, dtype="f32"):
    return ("sram", addr, dtype, tuple(shape))


def test_every_visa_opcode_has_semantics():
    assert set(visa.OPS) == set(OPCODES)


def test_load_reads_a_strided_view_with_broadcast_stride():
    dram, sram = memories()
    row = np.arange(4, dtype=F32)
    put(dram, 64, row)
    execute(instr("load", tile(0, (3, 4)), ("dram", 64, "f32", (3, 4), (0, 1))), dram, sram)
    np.testing.assert_array_equal(get(sram, 0, F32, (3, 4)), np.broadcast_to(row, (3, 4)))


def test_load_gathers_a_transposed_view():
    dram, sram = memories()
    m = np.arange(12, dtype=F32).reshape(3, 4)
    put(dram, 0, m)
    execute(instr("load", tile(128, (4, 3)), ("dram", 0, "f32", (4, 3), (1, 4))), dram, sram)
    np.testing.assert_array_equal(get(sram, 128, F32, (4, 3)), m.T)


def test_store_writes_a_box_of_a_larger_tensor():
    dram, sram = memories()
    put(sram, 0, np.ones((2, 2), F32))
    execute(instr("store", ("dram", 4 * 5, "f32", (2, 2), (4, 1)), tile(0, (2, 2))), dram, sram)
    out = get(dram, 0, F32, (4, 4))
    np.testing.assert_array_equal(out[1:3, 1:3], np.ones((2, 2)))
    assert out.sum() == 4


def test_mma_overwrites_then_accumulates():
    dram, sram = memories()
    a = np.arange(6, dtype=F32).reshape(2, 3)
    b = np.arange(12, dtype=F32).reshape(3, 4)
    put(sram, 0, a)
    put(sram, 64, b)
    args = (tile(256, (2, 4)), tile(0, (2, 3)), tile(64, (3, 4)))
    execute(instr("mma", *args, acc=0), dram, sram)
    np.testing.assert_array_equal(get(sram, 256, F32, (2, 4)), a @ b)
    execute(instr("mma", *args, acc=1), dram, sram)
    np.testing.assert_array_equal(get(sram, 256, F32, (2, 4)), 2 * (a @ b))


def test_half_mma_accumulates_in_f32():
    dram, sram = memories()
    a = np.full((1, 64), 0.1, np.float16)
    b = np.full((64, 1), 0.1, np.float16)
    put(sram, 0, a)
    put(sram, 256, b)
    execute(
        instr("mma", tile(512, (1, 1)), tile(0, (1, 64), "f16"), tile(256, (64, 1), "f16"), acc=0),
        dram,
        sram,
    )
    want = a.astype(F32) @ b.astype(F32)
    assert get(sram, 512, F32, (1, 1))[0, 0] == want[0, 0]


@pytest.mark.parametrize(
    "op", ["neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu"]
)
def test_unary_matches_the_oracle(op):
    dram, sram = memories()
    x = np.linspace(0.25, 3, 16, dtype=F32).reshape(4, 4)
    put(sram, 0, x)
    execute(instr(op, tile(64, (4, 4)), tile(0, (4, 4))), dram, sram)
    want = evaluate(op, [x], {}, TensorType((4, 4), "f32"))
    np.testing.assert_array_equal(get(sram, 64, F32, (4, 4)), want)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum", "minimum", "pow"])
def test_binary_with_an_immediate_on_either_side(op):
    dram, sram = memories()
    x = np.linspace(0.5, 2, 8, dtype=F32)
    put(sram, 0, x)
    imm = ("imm", 1.5, "f32")
    execute(instr(op, tile(64, (8,)), tile(0, (8,)), imm), dram, sram)
    execute(instr(op, tile(128, (8,)), imm, tile(0, (8,))), dram, sram)
    full = np.full(8, 1.5, F32)
    out = TensorType((8,), "f32")
    np.testing.assert_array_equal(get(sram, 64, F32, (8,)), evaluate(op, [x, full], {}, out))
    np.testing.assert_array_equal(get(sram, 128, F32, (8,)), evaluate(op, [full, x], {}, out))


def test_half_precision_ops_round_like_the_oracle():
    dram, sram = memories()
    x = np.linspace(0.1, 7, 32).astype(np.float16)
    put(sram, 0, x)
    execute(instr("exp", tile(64, (32,), "f16"), tile(0, (32,), "f16")), dram, sram)
    want = evaluate("exp", [x], {}, TensorType((32,), "f16"))
    np.testing.assert_array_equal(get(sram, 64, np.float16, (32,)), want)
    bf = np.linspace(0.1, 7, 32).astype(ml_dtypes.bfloat16)
    put(sram, 1024, bf)
    execute(
        instr("mul", tile(2048, (32,), "bf16"), tile(1024, (32,), "bf16"), ("imm", 3.0, "bf16")),
        dram,
        sram,
    )
    want = evaluate("mul", [bf, np.full(32, 3, ml_dtypes.bfloat16)], {}, TensorType((32,), "bf16"))
    np.testing.assert_array_equal(get(sram, 2048, ml_dtypes.bfloat16, (32,)), want)


def test_compare_select_and_cast():
    dram, sram = memories()
    x = np.array([1, 5, 3, 7], F32)
    put(sram, 0, x)
    execute(instr("gt", tile(64, (4,), "bool"), tile(0, (4,)), ("imm", 4.0, "f32")), dram, sram)
    np.testing.assert_array_equal(get(sram, 64, np.bool_, (4,)), x > 4)
    execute(
        instr("where", tile(128, (4,)), tile(64, (4,), "bool"), tile(0, (4,)), ("imm", 0.0, "f32")),
        dram,
        sram,
    )
    np.testing.assert_array_equal(get(sram, 128, F32, (4,)), np.where(x > 4, x, 0))
    execute(instr("cast", tile(192, (4,), "i32"), tile(0, (4,))), dram, sram)
    np.testing.assert_array_equal(get(sram, 192, np.int32, (4,)), x.astype(np.int32))


@pytest.mark.parametrize("op,combine", [("sum", np.add), ("max", np.maximum), ("min", np.minimum)])
def test_reduce_keeps_axes_and_accumulates(op, combine):
    dram, sram = memories()
    x = np.arange(24, dtype=F32).reshape(2, 3, 4)
    put(sram, 0, x)
    args = (tile(512, (2, 1, 1)), tile(0, (2, 3, 4)))
    execute(instr(op, *args, acc=0, axes=(1, 2)), dram, sram)
    once = getattr(np, op)(x, axis=(1, 2), keepdims=True)
    np.testing.assert_array_equal(get(sram, 512, F32, (2, 1, 1)), once)
    execute(instr(op, *args, acc=1, axes=(1, 2)), dram, sram)
    np.testing.assert_array_equal(get(sram, 512, F32, (2, 1, 1)), combine(once, once))


def test_sum_of_halves_goes_into_an_f32_accumulator():
    dram, sram = memories()
    x = np.full((1, 100), 0.1, np.float16)
    put(sram, 0, x)
    execute(instr("sum", tile(512, (1, 1)), tile(0, (1, 100), "f16"), acc=0, axes=(1,)), dram, sram)
    assert get(sram, 512, F32, (1, 1))[0, 0] == np.sum(x.astype(F32))


def test_transpose_and_fill():
    dram, sram = memories()
    x = np.arange(24, dtype=F32).reshape(2, 3, 4)
    put(sram, 0, x)
    execute(
        instr("transpose", tile(128, (4, 2, 3)), tile(0, (2, 3, 4)), perm=(2, 0, 1)), dram, sram
    )
    np.testing.assert_array_equal(get(sram, 128, F32, (4, 2, 3)), x.transpose(2, 0, 1))
    execute(instr("fill", tile(256, (5,), "i32"), ("imm", 7, "i32")), dram, sram)
    np.testing.assert_array_equal(get(sram, 256, np.int32, (5,)), [7] * 5)


def test_out_of_bounds_access_is_a_clear_error():
    dram, sram = memories(256, 256)
    with pytest.raises(LirExecError, match=r"sram access \[192, 320\) is outside"):
        execute(instr("fill", tile(192, (32,)), ("imm", 0.0, "f32")), dram, sram)
    with pytest.raises(LirExecError, match="dram access"):
        execute(instr("load", tile(0, (8,)), ("dram", 0, "f32", (8,), (64,))), dram, sram)


def test_unknown_opcode_is_an_error():
    dram, sram = memories()
    with pytest.raises(LirExecError, match="unknown opcode 'fft'"):
        execute(instr("fft", tile(0, (4,)), tile(0, (4,))), dram, sram)


def _program() -> Program:
    """out = exp(x) for a 4x4 f32 x, by hand: load, exp, store."""
    x = ArgSlot("x", "input", (4, 4), "f32", 0, 64)
    out = ArgSlot("out0", "output", (4, 4), "f32", 64, 64)
    instrs = (
        instr("load", tile(0, (4, 4)), ("dram", 0, "f32", (16,), (1,))),
        instr("exp", tile(64, (4, 4)), tile(0, (4, 4))),
        instr("store", ("dram", 64, "f32", (16,), (1,)), tile(64, (4, 4))),
    )
    instrs = tuple(
        Instr(k, i.unit, i.opcode, (), (), 0, 1, (), i.args, i.text) for k, i in enumerate(instrs)
    )
    return Program("exp", "m", (("dma", 1), ("vector", 1)), (x, out), instrs, 1024, 128, 128)


def test_run_program_lays_out_dram_per_argslot():
    x = np.linspace(0, 1, 16, dtype=F32).reshape(4, 4)
    (out,) = run_program(_program(), [x])
    np.testing.assert_array_equal(out, evaluate("exp", [x], {}, TensorType((4, 4), "f32")))


def test_run_program_checks_its_inputs():
    with pytest.raises(ValueError, match="expects 1 inputs, got 0"):
        run_program(_program(), [])
    with pytest.raises(ValueError, match="has shape"):
        run_program(_program(), [np.zeros((2, 8), F32)])
