"""The iree target against the numpy oracle, on hand-built graphs (llvm-cpu, and cuda
where a GPU is usable).

Graphs are small and several checks share one graph (one output each), so
the suite compiles about twenty modules; the compile cache lives in a
temporary KILN_CACHE_DIR shared by the module.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from kiln.errors import TargetError
from kiln.ir.graph import Graph, Node, TensorType, make_attrs
from kiln.ir.graph_verify import verify_graph
from kiln.ir.interp import NUMPY_DTYPES, run_graph
from kiln.ir.ops import broadcast_shapes, infer
from kiln.runners.base import KernelArtifacts, load_runner_class

TOLERANCE = {  # dtype -> (rtol, atol)
    "f32": (1e-4, 1e-5),
    "f16": (1e-2, 1e-2),
    "bf16": (5e-2, 5e-2),
    "i32": (0, 0),
    "bool": (0, 0),
}
MATMUL_F32 = (1e-4, 1e-4)  # K up to 256


class GraphBuilder:
    """Hand-made graphs in the tracer's form: broadcasts and scalars are explicit nodes."""

    def __init__(self, name: str = "k"):
        self.name, self.nodes = name, []

    def _add(self, op, inputs, type_, **attrs) -> int:
        self.nodes.append(Node(len(self.nodes), op, tuple(inputs), type_, make_attrs(**attrs)))
        return len(self.nodes) - 1

    def type(self, i: int) -> TensorType:
        return self.nodes[i].type

    def arg(self, shape, dtype="f32") -> int:
        index = sum(n.op == "arg" for n in self.nodes)
        return self._add("arg", (), TensorType(tuple(shape), dtype), name=f"x{index}", index=index)

    def const(self, value, dtype="f32") -> int:
        return self._add("const", (), TensorType((), dtype), value=value)

    def op(self, op, *inputs, **attrs) -> int:
        t = infer(op, [self.type(i) for i in inputs], dict(make_attrs(**attrs)))
        return self._add(op, inputs, t, **attrs)

    def __getattr__(self, op):  # b.exp(x), b.sum(x, axes=(1,)), b.matmul(a, b)
        if op.startswith("_"):
            raise AttributeError(op)
        return lambda *inputs, **attrs: self.op(op, *inputs, **attrs)

    def bcast(self, x: int, shape) -> int:
        shape = tuple(shape)
        return x if self.type(x).shape == shape else self.op("broadcast", x, shape=shape)

    def ew(self, op, *xs) -> int:
        """An elementwise op with numpy broadcasting; Python numbers become consts."""
        dtype = next(self.type(x).dtype for x in xs if isinstance(x, int) and x >= 0)
        ids = [x if isinstance(x, int) and x >= 0 else self.const(x.value, dtype) for x in xs]
        shape = broadcast_shapes(*[self.type(i).shape for i in ids])
        return self.op(op, *[self.bcast(i, shape) for i in ids])

    def graph(self, *outputs: int) -> Graph:
        g = Graph(self.name, tuple(self.nodes), tuple(outputs))
        verify_graph(g)
        return g


class S:
    """A scalar operand for GraphBuilder.ew (ints are node ids there)."""

    def __init__(self, value):
        self.value = value


def random_inputs(graph: Graph, seed: int = 0, positive: bool = False) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = []
    for arg in graph.args:
        if arg.dtype == "i32":
            arrays.append(rng.integers(-20, 20, arg.shape).astype(np.int32))
        elif arg.dtype == "bool":
            arrays.append(rng.random(arg.shape) < 0.5)
        else:
            x = rng.standard_normal(arg.shape)
            x = np.abs(x) + 0.1 if positive else x
            arrays.append(x.astype(NUMPY_DTYPES[arg.dtype]))
    return arrays


@pytest.fixture(scope="module", params=["llvm-cpu", "cuda"])
def runner(request, tmp_path_factory):
    """Every test runs on the host CPU, and again on a CUDA GPU where one is usable."""
    pytest.importorskip("iree.compiler", reason="the iree target needs the 'iree' extra")
    pytest.importorskip("iree.runtime", reason="the iree target needs the 'iree' extra")
    from kiln.runners.iree import IreeRunner

    runner = IreeRunner({"device": request.param})
    reason = runner.unavailable()
    if reason:
        pytest.skip(f"iree {request.param}: {reason}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KILN_CACHE_DIR", str(tmp_path_factory.mktemp("kiln-cache")))
        yield runner


def check(runner, graph: Graph, inputs=None, tolerance=None, **input_kw):
    """Run on IREE and on the oracle; every output must agree within its dtype's tolerance."""
    inputs = inputs if inputs is not None else random_inputs(graph, **input_kw)
    result = runner.run(runner.prepare(KernelArtifacts(graph.name, graph, Path("."))), inputs)
    expected = run_graph(graph, inputs)
    assert len(result.outputs) == len(expected)
    for k, (got, want, node) in enumerate(
        zip(result.outputs, expected, graph.output_nodes, strict=True)
    ):
        assert got.dtype == want.dtype and got.shape == node.shape, f"output {k}"
        want = want.reshape(node.shape)  # the oracle returns shape-() results as shape (1,)
        rtol, atol = (tolerance or {}).get(node.dtype, TOLERANCE[node.dtype])
        np.testing.assert_allclose(
            got.astype(np.float64),
            want.astype(np.float64),
            rtol=rtol,
            atol=atol,
            err_msg=f"{graph.name}: output {k} ({node.op})",
        )
    return result


# ---------------------------------------------------------------------------


def test_vector_add_matches_oracle(runner):
    b = GraphBuilder("vector_add")
    x, y = b.arg((1000,)), b.arg((1000,))
    check(runner, b.graph(b.add(x, y)))


def test_gemm_and_batched_matmul_match_oracle(runner):
    b = GraphBuilder("matmuls")
    a, w = b.arg((32, 256)), b.arg((256, 48))
    p, q = b.arg((3, 8, 16)), b.arg((3, 16, 8))
    r, s = b.arg((2, 2, 4, 8)), b.arg((2, 2, 8, 4))
    check(
        runner,
        b.graph(b.matmul(a, w), b.matmul(p, q), b.matmul(r, s)),
        tolerance={"f32": MATMUL_F32},
    )


def test_gemm_bias_relu_matches_oracle(runner):
    b = GraphBuilder("gemm_bias_relu")
    a, w, bias = b.arg((16, 32)), b.arg((32, 24)), b.arg((24,))
    check(runner, b.graph(b.relu(b.ew("add", b.matmul(a, w), bias))), tolerance={"f32": MATMUL_F32})


def _softmax(b, x, axis=1):
    m = b.max(x, axes=(axis,), keepdims=True)
    e = b.exp(b.ew("sub", x, m))
    return b.ew("div", e, b.sum(e, axes=(axis,), keepdims=True))


def _layernorm(b, x, gamma, beta, eps=1e-5):
    mu = b.mean(x, axes=(1,), keepdims=True)
    d = b.ew("sub", x, mu)
    var = b.mean(b.mul(d, d), axes=(1,), keepdims=True)
    inv = b.rsqrt(b.ew("add", var, S(eps)))
    return b.ew("add", b.ew("mul", b.ew("mul", d, inv), gamma), beta)


def test_softmax_and_layernorm_match_oracle(runner):
    b = GraphBuilder("norms")
    x, gamma, beta = b.arg((8, 64)), b.arg((64,)), b.arg((64,))
    check(runner, b.graph(_softmax(b, x), _layernorm(b, x, gamma, beta)))


def test_transpose_and_reshape_match_oracle(runner):
    b = GraphBuilder("layout")
    x, s = b.arg((4, 6, 8)), b.arg(())
    t = b.transpose(x, perm=(2, 0, 1))
    r = b.reshape(t, shape=(8, 24))
    out = b.reshape(b.reshape(s, shape=(1, 1)), shape=())
    check(runner, b.graph(t, r, b.transpose(r, perm=(1, 0)), out))


def test_reductions_match_oracle(runner):
    b = GraphBuilder("reductions")
    x = b.arg((6, 5, 7))
    outs = [
        b.sum(x, axes=(2,)),
        b.max(x, axes=(2,)),
        b.min(x, axes=(0, 2)),
        b.sum(x, axes=(0, 1, 2)),
        b.mean(x, axes=(1,), keepdims=True),
        b.mean(x, axes=(0, 2), keepdims=True),
        b.max(x, axes=(0, 1, 2), keepdims=True),
        b.ew("mul", b.sum(x, axes=(0, 1, 2)), S(2.0)),  # a rank-0 elementwise generic
        b.max(b.abs(b.neg(x)), axes=(1,)),  # producers computed inside the reduction
    ]
    check(runner, b.graph(*outs))


def test_where_and_compares_match_oracle(runner):
    b = GraphBuilder("select")
    x, y, flag = b.arg((5, 6)), b.arg((5, 6)), b.arg((5, 6), "bool")
    gt = b.gt(x, y)
    picked = b.where(gt, x, b.ew("mul", y, S(2.0)))
    outs = [picked, b.where(flag, x, y), b.eq(x, x), b.ne(x, y), b.le(x, y), gt]
    check(runner, b.graph(*outs))


def test_casts_round_like_numpy(runner):
    b = GraphBuilder("casts")
    x, i = b.arg((4, 33)), b.arg((4, 33), "i32")
    h = b.cast(x, dtype="f16")
    outs = [
        b.cast(h, dtype="f32"),
        b.cast(b.cast(x, dtype="bf16"), dtype="f32"),
        b.cast(b.ew("mul", x, S(7.0)), dtype="i32"),
        b.cast(i, dtype="f32"),
        b.cast(i, dtype="bool"),
        b.cast(b.cast(x, dtype="bool"), dtype="i32"),
        b.cast(h, dtype="bf16"),
    ]
    check(runner, b.graph(*outs))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_precision_chain_matches_oracle(runner, dtype):
    """Elementwise and reductions in halves; matmul and conv2d accumulate in f32 (on the
    CPU f16 operands are widened in bulk first, bf16 ones too where the CPU lacks BF16)."""
    b = GraphBuilder(f"chain_{dtype}")
    x, y = b.arg((16, 40), dtype), b.arg((40,), dtype)
    img, w = b.arg((2, 6, 5, 8), dtype), b.arg((3, 3, 8, 4), dtype)
    z = b.tanh(b.ew("add", b.ew("mul", x, y), S(0.5)))
    outs = [
        b.exp(b.ew("sub", z, x)),
        b.sum(z, axes=(1,)),
        b.matmul(x, b.reshape(y, shape=(40, 1))),
        b.mean(b.mul(x, x), axes=(0,)),
        b.conv2d(img, w, stride=(1, 1), padding=(1, 1), dilation=(1, 1)),
    ]
    check(runner, b.graph(*outs))


def test_bf16_widened_in_bulk_matches_oracle(runner):
    """A CPU without a BF16 dot product (opt: false targets a generic one) gets its bf16
    matmul and conv operands converted to f32 before the contraction."""
    from kiln.runners.iree import IreeRunner, lower

    if runner.config.device != "llvm-cpu":
        pytest.skip("the widening is an llvm-cpu choice")
    generic = IreeRunner({**runner.options, "opt": False})
    b = GraphBuilder("widened_bf16")
    x, y = b.arg((8, 24), "bf16"), b.arg((24, 5), "bf16")
    img, w = b.arg((1, 5, 4, 6), "bf16"), b.arg((3, 3, 6, 3), "bf16")
    conv = b.conv2d(img, w, stride=(1, 1), padding=(1, 1), dilation=(1, 1))
    graph = b.graph(b.matmul(x, y), conv)
    assert "arith.extf %in0 : bf16 to f32" in lower(graph, generic.config)
    check(generic, graph)


def test_i32_arithmetic_is_exact(runner):
    b = GraphBuilder("ints")
    x, y = b.arg((8, 9), "i32"), b.arg((8, 9), "i32")
    small = b.ew("minimum", b.abs(y), S(5))
    outs = [
        b.add(x, y),
        b.mul(x, y),
        b.ew("div", x, b.ew("add", b.abs(y), S(1))),
        b.pow(x, small),
        b.neg(b.maximum(x, y)),
        b.relu(x),
        b.sum(x, axes=(1,)),
        b.mean(x, axes=(0,), keepdims=True),
        b.max(x, axes=(0, 1)),
    ]
    check(runner, b.graph(*outs))


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")  # the oracle's x / 0
def test_i32_division_by_zero_and_overflow_do_not_trap(runner):
    b = GraphBuilder("idiv")
    x, y = b.arg((5,), "i32"), b.arg((5,), "i32")
    inputs = [np.array([7, -7, 0, -(2**31), 9], np.int32), np.array([2, 2, 0, -1, 0], np.int32)]
    check(runner, b.graph(b.div(x, y)), inputs)


def test_transcendentals_match_oracle(runner):
    b = GraphBuilder("unary")
    x, p = b.arg((7, 33)), b.arg((7, 33))
    outs = [b.gelu(x), b.sigmoid(x), b.tanh(x), b.exp(x), b.neg(x), b.abs(x)]
    outs += [b.rsqrt(b.abs(p)), b.sqrt(b.abs(p)), b.log(b.abs(p)), b.ew("pow", b.abs(p), x)]
    check(runner, b.graph(*outs))


def test_pow_of_negative_base_follows_numpy(runner):
    b = GraphBuilder("pow")
    x, e = b.arg((8,)), b.arg((8,))
    inputs = [
        np.array([-2, -2, -2, 2, 0, -1.5, 3, -0.5], np.float32),
        np.array([3, 2, 0.5, 0.5, 2, 4, -1, -3], np.float32),
    ]
    check(runner, b.graph(b.pow(x, e)), inputs)


def test_pow_special_values_follow_numpy(runner):
    """math.powf is exp(e*log|a|): it gave NaN for x**0, 1**inf, (-inf)**0.5 and lost -0.0."""
    specials = np.array([np.nan, 1, -1, 0, -0.0, np.inf, -np.inf, 0.5, -2, 3, 2.5], np.float32)
    x, e = (a.ravel() for a in np.meshgrid(specials, specials, indexing="ij"))
    b = GraphBuilder("pow_specials")
    graph = b.graph(b.pow(b.arg(x.shape), b.arg(e.shape)))
    got = check(runner, graph, [x, e]).outputs[0]
    want = run_graph(graph, [x, e])[0]
    zeros = want == 0
    np.testing.assert_array_equal(np.signbit(got[zeros]), np.signbit(want[zeros]))


def test_conv2d_matches_oracle(runner):
    b = GraphBuilder("conv")
    x, w, w2 = b.arg((2, 9, 9, 3)), b.arg((3, 3, 3, 4)), b.arg((2, 2, 3, 5))
    outs = [
        b.conv2d(x, w, stride=(2, 2), padding=(1, 1), dilation=(1, 1)),
        b.conv2d(x, w2, stride=(1, 2), padding=(0, 1), dilation=(2, 1)),
    ]
    check(runner, b.graph(*outs))


def test_materialized_broadcasts_and_constants(runner):
    b = GraphBuilder("materialize")
    x, v = b.arg((3, 4)), b.arg((4, 1))
    two = b.const(2.0)
    outs = [b.bcast(two, (2, 3)), b.bcast(v, (2, 4, 5)), two, x]
    outs.append(b.matmul(x, b.bcast(b.const(1.0), (4, 2))))
    check(runner, b.graph(*outs))


def test_broadcast_operand_of_a_matmul_compiles(runner):
    """iree-compile crashed on a broadcast fused into a data-tiled matmul operand."""
    b = GraphBuilder("bcast_matmul")
    x, v, u = b.arg((4, 3)), b.arg((4,)), b.arg((4, 1))
    rows = b.bcast(v, (5, 4))  # every row the same
    cols = b.bcast(u, (4, 5))  # every column the same
    outs = [b.matmul(rows, x), b.matmul(b.transpose(x, perm=(1, 0)), cols)]
    check(runner, b.graph(*outs))


def test_batched_matmul_of_a_broadcasting_elementwise_result_matches_oracle(runner):
    """softmax(s) @ v: with data tiling, iree-compile 3.13 fused the broadcasting
    subtraction into the batch_matmul's operand and every batch after the first
    came out wrong (zeros or garbage)."""
    b = GraphBuilder("attention_tail")
    s, m, v = b.arg((2, 7, 11)), b.arg((2, 7, 1)), b.arg((2, 11, 13))
    centred = b.sub(s, b.bcast(m, (2, 7, 11)))
    check(runner, b.graph(b.matmul(centred, v)), tolerance={"f32": MATMUL_F32})


def test_a_half_grouped_conv_wgrad_iree_compile_crashes_on_is_built_without_data_tiling(
    runner, capfd
):
    """iree-compile 3.13 segfaults (in inferSizesFromIR(linalg::PackOp)) on an f16 grouped
    NCHW conv_wgrad under --iree-opt-data-tiling: the module is built again without it."""
    import kiln
    from kiln import Tensor, device
    from kiln.lang import trace

    def w_min(x: Tensor[1, 4, 4, 4], dy: Tensor[1, 2, 2, 2]):
        return kiln.conv_wgrad(x, dy, (2, 2, 3, 3), groups=2, layout="NCHW")

    graph = trace(device(w_min), {}, {"x": "f16", "dy": "f16"})
    check(runner, graph, tolerance={"f16": (1e-2, 1e-2)})
    if runner.config.device == "llvm-cpu":
        err = capfd.readouterr().err
        assert "iree-compile crashed on kernel 'w_min' with --iree-opt-data-tiling" in err
        assert "Traceback" not in err


# -- runner behaviour -------------------------------------------------------


def _small_graph(name="small"):
    b = GraphBuilder(name)
    x = b.arg((4, 8))
    return b.graph(b.sum(b.exp(x), axes=(1,)))


def test_second_prepare_is_a_cache_hit(runner):
    graph = _small_graph("cached")
    artifacts = KernelArtifacts(graph.name, graph, Path("."))
    first = runner.prepare(artifacts)
    second = runner.prepare(artifacts)
    assert first.metrics["cache"] == "miss" and first.metrics["compile_s"] > 0
    assert second.metrics["cache"] == "hit" and second.metrics["compile_s"] == 0
    assert first.vmfb == second.vmfb and second.vmfb.parent.name == "iree"
    assert Path(os.environ["KILN_CACHE_DIR"]) in second.vmfb.parents
    result = runner.run(second, random_inputs(graph))
    assert result.metrics["cache"] == "hit" and result.metrics["wall_s"] > 0


def test_corrupt_cache_entry_is_recompiled(runner):
    graph = _small_graph("corrupt")
    artifacts = KernelArtifacts(graph.name, graph, Path("."))
    path = runner.prepare(artifacts).vmfb
    path.write_bytes(path.read_bytes()[:100])
    again = runner.prepare(artifacts)
    assert again.metrics["cache"] == "miss" and again.vmfb.stat().st_size > 100
    check(runner, graph)


def test_flags_are_part_of_the_cache_key(runner):
    from kiln.runners.iree import IreeRunner

    graph = _small_graph("flags")
    flagged = IreeRunner({**runner.options, "flags": ["--iree-opt-level=O1"]})
    plain = flagged.prepare(KernelArtifacts("flags", graph, Path(".")))
    tuned = runner.prepare(KernelArtifacts("flags", graph, Path(".")))
    assert plain.vmfb != tuned.vmfb and tuned.metrics["cache"] == "miss"
    check(flagged, graph)


def test_a_change_to_the_lowering_misses_the_cache(runner, monkeypatch):
    """The key is the MLIR text: a lowering edit can never be served a stale vmfb."""
    import kiln.runners.iree as iree

    graph = _small_graph("lowering")
    artifacts = KernelArtifacts(graph.name, graph, Path("."))
    first = runner.prepare(artifacts)
    assert runner.prepare(artifacts).metrics["cache"] == "hit"
    lowered = iree.to_mlir
    monkeypatch.setattr(iree, "to_mlir", lambda g, **kw: "// lowering v2\n" + lowered(g, **kw))
    changed = runner.prepare(artifacts)
    assert changed.metrics["cache"] == "miss" and changed.vmfb != first.vmfb
    check(runner, graph)


def test_compiler_warnings_reach_a_stream_without_a_byte_buffer(runner, monkeypatch):
    """doit captures an action's stderr in a stream that takes str only."""
    import kiln.runners.iree as iree

    class TextOnly:
        def __init__(self):
            self.text = ""

        def write(self, data):
            if not isinstance(data, str):
                raise TypeError(f"string argument expected, got {type(data).__name__!r}")
            self.text += data

        def flush(self):
            pass

    compiler, _ = iree._iree()

    def noisy(text, **kwargs):
        import sys

        from iree.compiler.tools.binaries import _write_binary_stderr

        _write_binary_stderr(sys.stderr, b"warning: a note from iree-compile\n")
        return b"vmfb"

    monkeypatch.setattr(compiler, "compile_str", noisy)
    sink = TextOnly()
    monkeypatch.setattr("sys.stderr", sink)
    vmfb, _ = iree.compile_graph(_small_graph("noisy"), runner.config)
    assert vmfb == b"vmfb" and "a note from iree-compile" in sink.text


def test_time_returns_one_sample_per_iteration(runner):
    graph = _small_graph("shared")  # compiled once for this test and the next
    prepared = runner.prepare(KernelArtifacts(graph.name, graph, Path(".")))
    samples = runner.time(prepared, random_inputs(graph), iters=4, warmup=1)
    assert len(samples) == 4 and all(s > 0 for s in samples)


def test_compile_failure_names_diagnostics_and_dump_hint(runner):
    from kiln.runners.iree import IreeRunner

    bad = IreeRunner({**runner.options, "flags": ["--iree-no-such-flag"]})
    with pytest.raises(TargetError) as info:
        bad.prepare(KernelArtifacts("bad", _small_graph("bad"), Path(".")))
    text = info.value.render()
    assert "iree-compile failed" in text and "no-such-flag" in text and "--dump-mlir" in text


def test_wrong_input_shape_is_a_target_error(runner):
    graph = _small_graph("shared")
    prepared = runner.prepare(KernelArtifacts(graph.name, graph, Path(".")))
    with pytest.raises(TargetError, match="wrong shape"):
        runner.run(prepared, [np.zeros((8, 4), np.float32)])


def test_unknown_option_lists_the_valid_ones():
    from kiln.runners.iree import IreeRunner

    with pytest.raises(TargetError) as info:
        _ = IreeRunner({"devcie": "cuda"}).config
    assert "devcie" in info.value.render() and "device" in info.value.expected


@pytest.mark.parametrize(
    "options", [{"opt": "no"}, {"device_index": "1"}, {"flags": "-O3"}, {"device": "tpu"}]
)
def test_malformed_options_are_target_errors(options):
    from kiln.runners.iree import IreeRunner

    with pytest.raises(TargetError, match="iree"):
        _ = IreeRunner(options).config


def test_missing_iree_extra_says_how_to_install(monkeypatch):
    from kiln.runners.iree import MISSING_EXTRA, IreeRunner

    monkeypatch.setitem(sys.modules, "iree.compiler", None)
    runner = IreeRunner()
    assert runner.unavailable() == MISSING_EXTRA
    with pytest.raises(TargetError, match=r"pip install 'kiln-kernels\[iree\]'"):
        runner.prepare(KernelArtifacts("x", _small_graph(), Path(".")))


def test_runner_is_found_by_name():
    assert load_runner_class("iree").kind == "iree"


def test_dump_mlir_writes_the_compiled_text(tmp_path):
    from kiln.runners.iree import dump_mlir
    from kiln.runners.iree_mlir import to_mlir

    graph = _small_graph()
    path = dump_mlir(graph, tmp_path / "k.mlir")
    assert path.read_text() == to_mlir(graph)
    assert [p.name for p in tmp_path.iterdir()] == ["k.mlir"]


def test_bf16_outputs_come_back_as_bf16(runner):
    b = GraphBuilder("bf16_io")
    x = b.arg((3, 5), "bf16")
    result = check(runner, b.graph(b.ew("mul", x, S(3.0))))
    assert result.outputs[0].dtype == np.dtype(ml_dtypes.bfloat16)
    assert math.isfinite(float(result.outputs[0].astype(np.float32).sum()))


# -- the example kernels of pipeline.yaml ------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def _example_instances():
    """(id, function, shapes, dtypes, tolerance) for every kernel and shape set of pipeline.yaml."""
    try:
        import importlib
        import pkgutil

        import kernels
        from kiln.lang import DeviceFunction
        from kiln.pipeline.load import load_pipeline

        pipeline = load_pipeline(ROOT / "pipeline.yaml")
    except Exception:  # the tracer or the kernels are not there yet
        return []
    functions = {}
    for info in pkgutil.iter_modules(kernels.__path__, "kernels."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, DeviceFunction):
                functions[name] = functions[f"{info.name}.{name}"] = value
    cases = []
    for spec in pipeline.kernels:
        fn = functions.get(spec.function or spec.name)
        dtypes = {"*": spec.dtype, **dict(spec.dtypes)}
        for set_name, dims in spec.shapes:
            cases.append(
                pytest.param(fn, dict(dims), dtypes, spec.tolerance, id=f"{spec.name}.{set_name}")
            )
    return cases


@pytest.mark.parametrize("fn, shapes, dtypes, tolerance", _example_instances())
def test_example_kernels_match_oracle(runner, fn, shapes, dtypes, tolerance):
    from kiln import trace
    from kiln.inputs import random_inputs as seeded_inputs

    assert fn is not None, "pipeline.yaml names a kernel that is not in kernels/"
    graph = trace(fn, shapes, dtypes)
    inputs = seeded_inputs(graph.name, [(a.shape, a.dtype) for a in graph.args])
    per_dtype = {"f32": MATMUL_F32} if any(n.op == "matmul" for n in graph.nodes) else {}
    if tolerance:
        per_dtype = {
            d: (tolerance.get("rtol", rtol), tolerance.get("atol", atol))
            for d, (rtol, atol) in TOLERANCE.items()
        }
    check(runner, graph, inputs, tolerance=per_dtype)


def test_an_unwritable_cache_compiles_without_keeping_and_warns_once(
    runner, tmp_path, monkeypatch, capfd
):
    (tmp_path / "a-file").write_text("where the cache goes\n")
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "a-file"))
    for name in ("unkept1", "unkept2"):
        graph = _small_graph(name)
        prepared = runner.prepare(KernelArtifacts(graph.name, graph, Path(".")))
        assert prepared.metrics["cache"] == "miss" and prepared.metrics["vmfb"] is None
        check(runner, graph)
    err = capfd.readouterr().err
    assert err.count("kiln: warning: the iree cache") == 1, err
    assert f"{tmp_path / 'a-file' / 'iree'} cannot be written (Not a directory)" in err
