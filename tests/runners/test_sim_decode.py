"""The numpy reader of the INSTRUCTIONS section gives what decoding to objects gives.

``decode_columns`` reads an EDF's instructions with numpy (``sim_msgpack``);
``columns_of`` builds the same columns from decoded ``Instr`` objects. Both
must agree field by field on every example kernel, dtype and machine, and
a binary prepared from its bytes must compute bit for bit what the
reference executor computes.
"""

from __future__ import annotations

import numpy as np
import pytest

import kernels.elementwise as elementwise
import kernels.linalg as linalg
import kernels.normalization as normalization
import kernels.reductions as reductions
from kiln.inputs import random_inputs
from kiln.ir.edf import decode, encode, read_layout
from kiln.ir.lir_exec import run_program
from kiln.lang import trace
from kiln.runners import sim_decode
from kiln.runners.sim_decode import Columns, columns_of, decode_columns
from tests.runners.test_sim import compile_graph, machine, prepare_file

CASES = [
    (elementwise.vector_add, {"N": 1000}),
    (linalg.gemm, {"M": 48, "K": 80, "N": 40}),
    (linalg.gemm_bias_relu, {"M": 33, "K": 64, "N": 50}),
    (linalg.batched_matmul, {"B": 3, "M": 17, "K": 9, "N": 12}),
    (linalg.transpose, {"M": 40, "N": 24}),
    (normalization.softmax, {"R": 24, "C": 96}),
    (normalization.layernorm, {"R": 16, "C": 200}),
    (reductions.row_sum, {"R": 20, "C": 130}),
    (reductions.row_max, {"R": 20, "C": 130}),
]
ARRAYS = (
    "latency", "acc_ptr", "acc_space", "acc_addr", "acc_end", "acc_write", "dep_ptr", "dep_src",
    "slot_instr", "slot_unit_index", "slot_start", "slot_end",
)  # fmt: skip


def per_row(cols: Columns) -> dict[int, tuple]:
    """Each instruction's template (less its rows), addresses and whether it runs generically."""
    out = {}
    for t, fast in zip(cols.templates, cols.fast, strict=True):
        what = (t.opcode, t.extra, t.dst, t.srcs, fast is None)
        for k, addrs in zip(t.rows.tolist(), t.addrs.tolist(), strict=True):
            out[k] = (what, addrs)
    return out


@pytest.mark.parametrize("machine_name", ["npu-v1", "npu-tiny"])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "i32"])
@pytest.mark.parametrize("fn,bindings", CASES, ids=[f.__name__ for f, _ in CASES])
def test_the_numpy_reader_agrees_with_the_objects(
    fn, bindings, dtype, machine_name, tmp_path, monkeypatch
):
    if dtype == "i32" and fn in (normalization.softmax, normalization.layernorm):
        pytest.skip("softmax/layernorm need floats")
    monkeypatch.setattr(sim_decode, "NUMPY_FROM", 0)  # these kernels are small
    graph = trace(fn, bindings, dtype)
    edf = compile_graph(graph, machine(machine_name))
    raw = encode(edf)
    cols = decode_columns(raw, read_layout(raw))
    assert cols.reader == "numpy"
    ref = columns_of(decode(raw).scheduled, edf.metadata)
    assert ref.reader == "chunks"
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(cols, name), getattr(ref, name), err_msg=name)
    assert [cols.unit_names[u] for u in cols.unit] == [ref.unit_names[u] for u in ref.unit]
    assert (cols.program, cols.metadata, cols.slot_unit) == (
        ref.program,
        ref.metadata,
        ref.slot_unit,
    )
    assert per_row(cols) == per_row(ref)
    assert cols.generic == ref.generic
    # and it runs: bit for bit what lir_exec computes instruction by instruction
    runner, prepared, _ = prepare_file(tmp_path, graph, raw, machine(machine_name))
    assert prepared.bound == "columns"
    inputs = random_inputs(graph.name, [(a.shape, a.dtype) for a in graph.args])
    for want, got in zip(
        run_program(edf.scheduled.program, inputs),
        runner.run(prepared, inputs).outputs,
        strict=True,
    ):
        assert want.dtype == got.dtype
        np.testing.assert_array_equal(got, want)


def test_each_msgpack_encoding_reads_back():
    """Every int width and sign, float32/64, short and long strings, arrays: the token
    reader gives the value msgpack packed."""
    import msgpack

    from kiln.runners.sim_msgpack import ARR, FLOAT, INT, STR, Reader

    values = [0, 127, -1, -32, -33, -128, -129, 200, 255, 256, 70000, -70000, 2**32, 2**40]
    values += [-(2**40), 2**63 - 1, -(2**63), "", "abc", "x" * 40, "y" * 300, 1.5, -0.0]
    data = b"".join(msgpack.packb(v) for v in values)
    data += msgpack.packb(2.5, use_single_float=True) + msgpack.packb(list(range(20)))
    r = Reader(data, np.array([0, len(data)]))
    for want in [*values, 2.5]:
        t = r.token()
        if isinstance(want, int):
            assert (t.cls[0], t.value[0]) == (INT, want)
        elif isinstance(want, float):
            assert t.cls[0] == FLOAT and t.value[0] == np.float64(want).view(np.int64)
        else:
            assert (t.cls[0], t.value[0]) == (STR, len(want))
            start = int(t.at[0] + t.header[0])
            assert data[start : start + len(want)].decode() == want
    t = r.token()
    assert (t.cls[0], t.value[0]) == (ARR, 20)


@pytest.mark.parametrize(
    "fn,bindings", CASES[:4] + CASES[6:7], ids=lambda x: getattr(x, "__name__", "")
)
def test_records_read_row_by_row_agree_too(fn, bindings, monkeypatch):
    """Rows with many dependencies or accesses are read with msgpack once few are left in
    lockstep; forced here for every row."""
    from kiln.runners import sim_msgpack

    monkeypatch.setattr(sim_msgpack, "TAIL", 1 << 30)
    monkeypatch.setattr(sim_decode, "NUMPY_FROM", 0)
    edf = compile_graph(trace(fn, bindings, "f32"), machine())
    raw = encode(edf)
    cols = decode_columns(raw, read_layout(raw))
    assert cols.reader == "numpy"
    ref = columns_of(decode(raw).scheduled, edf.metadata)
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(cols, name), getattr(ref, name), err_msg=name)
    assert per_row(cols) == per_row(ref)


def test_small_binaries_are_read_as_objects_and_large_ones_with_numpy():
    small = encode(
        compile_graph(trace(normalization.layernorm, {"R": 4, "C": 32}, "f32"), machine())
    )
    assert decode_columns(small, read_layout(small)).reader == "chunks"
    graph = trace(normalization.layernorm, {"R": 32, "C": 512}, "f32")
    large = encode(compile_graph(graph, machine("npu-tiny")))
    cols = decode_columns(large, read_layout(large))
    assert cols.count >= sim_decode.NUMPY_FROM and cols.reader == "numpy"
