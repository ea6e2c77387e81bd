"""The vISA text form: golden printer output, exact round trips, parse errors, verify rules."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import kiln
from kiln import Tensor, device
from kiln.ir import visa
from kiln.ir.graph import Graph, Node, TensorType, make_attrs
from kiln.ir.visa import Buffer, DramTensor, Imm, Instr, Program, Tile, View
from kiln.lang import trace
from kiln.stages import visa as visa_stage

GOLDEN = Path(__file__).parent / "golden"
MACHINE = {  # npu-v1 from pipeline.yaml: what the visa stage reads of it
    "name": "npu-v1",
    "sram_bytes": 4194304,
    "units": {"dma": 2, "tensor": 1, "vector": 2},
    "tensor": {"tile": [32, 32, 32], "cycles_per_tile": 32},
    "vector": {"lanes": 64, "latency": {"default": 4}},
}
TINY = {**MACHINE, "name": "npu-tiny", "sram_bytes": 65536, "vector": {"lanes": 16}}


def small_gemm() -> Graph:
    f32 = TensorType((64, 64), "f32")
    nodes = (
        Node(0, "arg", (), f32, make_attrs(name="a", index=0)),
        Node(1, "arg", (), f32, make_attrs(name="b", index=1)),
        Node(2, "matmul", (0, 1), f32),
    )
    return Graph("gemm", nodes, (2,), (("K", 64), ("M", 64), ("N", 64)))


def test_small_gemm_prints_the_golden_text():
    options = visa_stage.Options(tile_m=32, tile_n=32, tile_k=32)
    text = visa.print_program(visa_stage.run(small_gemm(), options, MACHINE))
    golden = GOLDEN / "gemm_64_tiled.visa"
    if os.environ.get("KILN_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), "regenerate with KILN_UPDATE_GOLDEN=1 if intended"


def test_golden_text_parses_back_exactly():
    text = (GOLDEN / "gemm_64_tiled.visa").read_text()
    program = visa.parse(text)
    visa.verify(program)
    assert visa.print_program(program) == text
    assert [i.op for i in program.instrs].count("mma") == 8


# -- round trips -------------------------------------------------------------------------


@device
def conv_bias(x: Tensor["N", "H", "W", "C"], w: Tensor["KH", "KW", "C", "F"], b: Tensor["F"]):  # noqa: F821
    return kiln.relu(kiln.conv2d(x, w, stride=2, padding=1) + b)


@device
def mixed(x: Tensor["R", "C"], y: Tensor["R", "C"]):  # noqa: F821
    mask = x > y
    picked = kiln.where(~mask, x * 0.5, y - 2.0)
    half = kiln.cast(picked, "f16")
    return (
        half,
        kiln.mean(picked, axis=0),
        kiln.permute(kiln.reshape(x, (2, -1, 4)), 2, 0, 1),
        kiln.sum(x),
        kiln.cast(x, "i32") * 3,
    )


def example_graphs() -> list[Graph]:
    from kernels import elementwise, linalg, normalization, reductions

    return [
        trace(elementwise.vector_add, {"N": 1000}),
        trace(linalg.gemm, {"M": 100, "K": 70, "N": 50}),
        trace(linalg.gemm_bias_relu, {"M": 64, "K": 128, "N": 64}),
        trace(linalg.batched_matmul, {"B": 2, "M": 32, "K": 64, "N": 32}),
        trace(linalg.transpose, {"M": 64, "N": 128}),
        trace(normalization.softmax, {"R": 64, "C": 128}),
        trace(normalization.layernorm, {"R": 64, "C": 128}, {"*": "bf16"}),
        trace(reductions.row_sum, {"R": 64, "C": 128}),
        trace(reductions.row_max, {"R": 64, "C": 128}, "f16"),
        trace(conv_bias, {"N": 1, "H": 9, "W": 9, "C": 3, "KH": 3, "KW": 3, "F": 8}),
        trace(mixed, {"R": 8, "C": 16}),
    ]


@pytest.mark.parametrize("machine", [MACHINE, TINY], ids=["npu-v1", "npu-tiny"])
@pytest.mark.parametrize("fusion", [True, False], ids=["fused", "unfused"])
def test_every_lowered_program_round_trips(machine, fusion):
    for graph in example_graphs():
        program = visa_stage.run(graph, visa_stage.Options(fusion=fusion), machine)
        visa.verify(program)
        text = visa.print_program(program)
        assert visa.parse(text) == program, graph.name
        assert visa.print_program(visa.parse(text)) == text


def test_immediates_round_trip_exactly():
    values = [
        Imm(0.1, "f32"),
        Imm(float("inf"), "f32"),
        Imm(float("-inf"), "bf16"),
        Imm(float("nan"), "f32"),
        Imm(1e-05, "f16"),
        Imm(-3, "i32"),
        Imm(True, "bool"),
        Imm(False, "bool"),
    ]
    tensors = (DramTensor("x", "input", (4,), "f32"),)
    buffers = (Buffer("t", "f32", (4,)),)
    instrs = tuple(Instr("fill", Tile("t", (4,)), (v,)) for v in values)
    program = Program("imms", (), tensors, buffers, instrs)
    assert visa.parse(visa.print_program(program)) == program


def test_parser_ignores_comments_blank_lines_and_spacing():
    text = (GOLDEN / "gemm_64_tiled.visa").read_text()
    lines = text.splitlines()
    noisy = (
        ["; a hand-edited dump", ""]
        + lines[:9]
        + [
            "",
            "load   %lhs2[32, 32]  <-  @a+0[32:64, 32:1]   ; first A tile",
            *lines[10:],
        ]
    )
    assert visa.parse("\n".join(noisy)) == visa.parse(text)


# -- parse errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line_no,replacement,expected",
    [
        (1, "visa 2", "the header 'visa 1'"),
        (2, "kernal gemm", "'kernel <name>'"),
        (4, "tensor a inout f32[64,64]", "a tensor role"),
        (4, "tensor a input f64[64,64]", "a tensor type like f32[64,64]"),
        (7, "buffer acc2 f32[32,32]", "a buffer name starting with %"),
        (10, "lod %lhs2[32,32] <- @a+0[32:64,32:1]", "an opcode"),
        (10, "load %lhs2[32,32] @a+0[32:64,32:1]", "'<-' between destination and sources"),
        (10, "load %lhs2[32,32] <- a+0[32:64,32:1]", "an operand"),
        (10, "load %lhs2[32,32] <- @a+0[32,32:1]", "a view dim as size:stride"),
        (12, "mma %acc2[32,32] <- %lhs2[32,32] acc=0", "2 source operand(s) for mma"),
        (12, "mma %acc2[32,32] <- %lhs2[32,32], %rhs2[32,32] acc=0 perm=(1,0)", "attributes"),
        (12, "fill %acc2[32,32] <- #zero:f32", "a f32 immediate value"),
    ],
)
def test_parse_errors_name_the_line_and_what_was_expected(line_no, replacement, expected):
    lines = (GOLDEN / "gemm_64_tiled.visa").read_text().splitlines()
    lines[line_no - 1] = replacement
    with pytest.raises(visa.VisaParseError) as err:
        visa.parse("\n".join(lines))
    assert err.value.line == line_no
    assert expected in err.value.expected
    assert f"line {line_no}: expected" in str(err.value)


def test_empty_text_is_a_parse_error():
    with pytest.raises(visa.VisaParseError, match="expected 'visa 1' and 'kernel <name>'"):
        visa.parse("; nothing here\n")


# -- verify ------------------------------------------------------------------------------


def _program(*instrs: Instr, buffers=None) -> Program:
    tensors = (
        DramTensor("x", "input", (8, 8), "f32"),
        DramTensor("out0", "output", (8, 8), "f32"),
    )
    buffers = buffers or (Buffer("t", "f32", (8, 8)), Buffer("u", "f32", (8, 8)))
    return Program("k", (), tensors, tuple(buffers), tuple(instrs))


LOAD = Instr("load", Tile("t", (8, 8)), (View("x", 0, (64,), (1,)),))


@pytest.mark.parametrize(
    "instrs,rule",
    [
        ((Instr("exp", Tile("u", (8, 8)), (Tile("t", (8, 8)),)),), "read before it is written"),
        ((Instr("load", Tile("t", (8, 9)), (View("x", 0, (72,), (1,)),)),), "exceeds the buffer"),
        ((Instr("load", Tile("t", (8, 8)), (View("x", 8, (64,), (1,)),)),), "view reaches"),
        ((LOAD, Instr("store", View("x", 0, (64,), (1,)), (Tile("t", (8, 8)),))), "input tensor"),
        ((LOAD, Instr("store", View("out0", 0, (8, 8), (0, 1)), (Tile("t", (8, 8)),))), "repeat"),
        ((LOAD, Instr("exp", Tile("u", (4, 16)), (Tile("t", (8, 8)),))), "operand shape"),
        ((LOAD, Instr("cast", Tile("v", (8, 8)), (Tile("t", (8, 8)),))), "not declared"),
        ((LOAD, Instr("add", Tile("u", (8, 8)), (Tile("t", (8, 8)), Imm(1, "i32")))), "dtypes"),
        ((LOAD, Instr("mma", Tile("u", (8, 8)), (Tile("t", (8, 8)), Tile("t", (4, 8))))), "dims"),
        ((LOAD, Instr("sum", Tile("u", (8, 8)), (Tile("t", (8, 8)),), (("axes", (1,)),))), "shape"),
        (
            (
                LOAD,
                Instr("transpose", Tile("u", (8, 8)), (Tile("t", (8, 8)),), (("perm", (0, 0)),)),
            ),
            "permutation",
        ),
    ],
)
def test_verify_names_the_instruction_and_the_rule(instrs, rule):
    with pytest.raises(visa.VisaError) as err:
        visa.verify(_program(*instrs))
    assert rule in str(err.value)
    assert err.value.index == len(instrs) - 1
    assert f"instruction {len(instrs) - 1} (" in str(err.value)


def test_verify_rejects_duplicate_declarations():
    with pytest.raises(visa.VisaError, match="declared twice"):
        visa.verify(_program(LOAD, buffers=(Buffer("t", "f32", (8, 8)),) * 2))
