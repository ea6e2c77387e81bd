"""Reductions (and other consumers) fed by broadcasts, constants and keepdims results:
traced kernels lowered to MLIR, checked for valid loops everywhere and against the
numpy oracle on iree-cpu where IREE is installed.

Each kernel returns many outputs so the corpus costs one IREE compile per kernel.
"""

# ruff: noqa: F821  (symbolic dims in Tensor[...] annotations)
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln import Tensor, device
from kiln.ir.graph import Graph
from kiln.ir.interp import NUMPY_DTYPES, run_graph
from kiln.lang.tracer import trace
from kiln.runners.iree_mlir import to_mlir

TOLERANCE = {"f32": (1e-5, 1e-5), "f16": (1e-2, 1e-2), "bf16": (2e-2, 2e-2)}


@device
def consts(x: Tensor["R", "C"]):
    ones = kiln.ones_like(x)
    return (
        ones.sum(axis=-1),
        ones.sum(axis=-1) * x.mean(axis=-1),
        kiln.full_like(x, 2.0).prod(axis=-1),
        kiln.full_like(x, 0.1).sum(axis=0),
        kiln.full_like(x, 3.0).mean(axis=(0, 1)),
        kiln.full_like(x, -2.0).max(axis=0, keepdims=True),
        kiln.full_like(x, 7.0).min(),
        kiln.logsumexp(kiln.full_like(x, -kiln.inf), axis=-1),
        kiln.logsumexp(kiln.zeros_like(x), axis=0),
        kiln.softmax(ones, axis=-1),
        ones.sum(axis=-1, keepdims=True) * x,
        kiln.zeros_like(x),
        x + kiln.full_like(x, 1.0).sum(),
        kiln.where(x > 0, ones, kiln.zeros_like(x)).sum(axis=-1),
        ones.astype("int32").sum(axis=-1),
        (ones > 0).min(axis=0),
    )


@device
def bcast_2d(x: Tensor["R", "C"], w: Tensor["R", 1], v: Tensor["C"]):
    bw, bv = kiln.broadcast_to(w, x.shape), kiln.broadcast_to(v, x.shape)
    m = kiln.broadcast_to(x.max(axis=-1, keepdims=True), x.shape)
    return (
        (bw * 2.0).sum(axis=-1),
        (2.0 - bv).sum(axis=0),
        kiln.exp(m - 1.0).sum(axis=-1),
        (bw * 2.0).sum(axis=0),
        (bw + bv).sum(axis=-1),
        (bw * bv).max(axis=(0, 1)),
        bv.sum(axis=0),
        bw.mean(axis=-1, keepdims=True),
        (m * bv).sum(axis=-1),
        (m * bv).prod(axis=0),
        kiln.broadcast_to(x.mean(axis=0, keepdims=True), x.shape).min(axis=0),
        kiln.logsumexp(bw, axis=-1),
        kiln.softmax(bv, axis=0),
        (bw - x).sum(axis=-1),
        (bw > 0).min(axis=-1),
        (bv > 0).max(axis=0, keepdims=True),
        ((bw > 0) & (x > 0)).sum(axis=(0, 1)),
    )


@device
def bcast_3d(
    x: Tensor["A", "B", "C"], u: Tensor["A", 1, "C"], s: Tensor["B", 1], t: Tensor["B", "C"]
):
    bu, bs, bt = (kiln.broadcast_to(a, x.shape) for a in (u, s, t))
    k = kiln.broadcast_to(x.sum(axis=1, keepdims=True), x.shape)
    y = bu * 3.0  # used three times: a tensor of its own, reduced along its broadcast dim
    return (
        (bu * 3.0).sum(axis=1),
        (bu * 3.0).sum(axis=(1, 2)),
        (bu - x).sum(axis=1),
        (bs + 1.0).mean(axis=(0, 2)),
        bu.max(axis=1, keepdims=True),
        kiln.exp(bu).sum(),
        (k * 0.5).sum(axis=1),
        (k * 0.5).sum(axis=2),
        (bu * bs).sum(axis=(0, 1)),
        kiln.full_like(x, 1.5).sum(axis=(0, 2)),
        kiln.ones_like(x).sum(axis=1, keepdims=True) * bu,
        (bu * x).sum(axis=(0, 1)),
        (bu * x).sum(axis=(1, 2)),
        (bu * x).sum(axis=(0, 2)),
        (bu * bs * x).mean(axis=(0, 1, 2)),
        y,
        y.sum(axis=(1, 2)),
        kiln.exp(y).prod(axis=1),
        (bs * bt).sum(axis=1),  # a kept dim (A) no operand reads: reduced once, broadcast
        (bs * bt).max(axis=(1, 2), keepdims=True) * x,
        (bt * x).sum(axis=2),
    )


@device
def scalars(x: Tensor["R", "C"], c: Tensor[()]):
    bc = kiln.broadcast_to(c, x.shape)
    return (
        bc.sum(),
        (bc * 2.0).prod(axis=0),
        kiln.broadcast_to(c, (3,)).mean(),
        (bc * x).sum(),
        bc.max(axis=-1, keepdims=True),
    )


@device
def halves(x: Tensor["R", "C"], w: Tensor["R", 1]):
    bw = kiln.broadcast_to(w, x.shape)
    return (
        kiln.ones_like(x).sum(axis=-1),
        kiln.full_like(x, 0.1).sum(axis=0),
        kiln.full_like(x, 1.1).prod(axis=-1),
        (bw * 2.0).sum(axis=-1),
        bw.mean(axis=-1),
        kiln.logsumexp(kiln.zeros_like(x), axis=-1),
        kiln.exp(kiln.broadcast_to(x.max(axis=0, keepdims=True), x.shape)).sum(axis=0),
    )


@device
def ints(x: Tensor["R", "C"], w: Tensor["R", 1], v: Tensor["C"]):
    bw, bv = kiln.broadcast_to(w, x.shape), kiln.broadcast_to(v, x.shape)
    return (
        (bw * 3).sum(axis=-1),
        bw.prod(axis=-1),
        (bv + 1).mean(axis=0),
        bv.max(axis=0, keepdims=True),
        kiln.ones_like(x).sum(axis=-1),
        kiln.full_like(x, 3).prod(axis=-1),
        kiln.full_like(x, 2**30).sum(axis=-1),
        kiln.full_like(x, 7).mean(axis=-1),
        kiln.broadcast_to(kiln.arange(5), x.shape).sum(axis=0),
        kiln.argmax(x, axis=-1),
        kiln.argmin(bw, axis=-1),
        (bw * 1000).prod(axis=-1),
        (bv * 1000).sum(axis=0) * 100000,
    )


@device
def other_ops(x: Tensor["R", "C"], w: Tensor["R", 1], y: Tensor["C", "R"]):
    ones, bw = kiln.ones_like(x), kiln.broadcast_to(w, x.shape)
    return (
        kiln.matmul(ones, y),
        kiln.matmul(bw, y),
        kiln.matmul(kiln.full_like(x, 2.0), kiln.full_like(y, 3.0)),
        kiln.concatenate([x, ones], axis=0),
        kiln.concatenate([kiln.zeros_like(x), ones], axis=1).sum(axis=-1),
        kiln.transpose(bw).sum(axis=0),
        kiln.transpose(ones).sum(axis=0),
        ones[1:, ::2].sum(axis=-1),
        kiln.reshape(bw, (15,)).sum(),
        kiln.reshape(ones, (5, 3)).prod(axis=0),
    )


@device
def convs(x: Tensor[1, 4, 4, 2], w: Tensor[3, 3, 2, 2]):
    return (
        kiln.conv2d(x, kiln.ones_like(w), padding=1),
        kiln.conv2d(kiln.ones_like(x), w, padding=1),
        kiln.conv2d(kiln.ones_like(x), kiln.full_like(w, 0.5), padding=1).sum(axis=(1, 2)),
    )


SIZES = {"R": 3, "C": 5, "A": 2, "B": 3}
CORPUS = {  # name -> (kernel, dtypes)
    "consts": (consts, "f32"),
    "bcast_2d": (bcast_2d, "f32"),
    "bcast_3d": (bcast_3d, "f32"),
    "halves_f16": (halves, "f16"),
    "halves_bf16": (halves, "bf16"),
    "ints": (ints, "i32"),
    "other_ops": (other_ops, "f32"),
    "scalars": (scalars, "f32"),
    "convs": (convs, "f32"),
}


def _graph(name: str) -> Graph:
    kernel, dtypes = CORPUS[name]
    graph = trace(kernel, SIZES, dtypes)
    return Graph(name, graph.nodes, graph.outputs)


def _inputs(graph: Graph) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [
        rng.integers(-9, 9, a.shape).astype(np.int32)
        if a.dtype == "i32"
        else rng.standard_normal(a.shape).astype(NUMPY_DTYPES[a.dtype])
        for a in graph.args
    ]


def _loops_unread(text: str) -> list[str]:
    """Each linalg.generic whose indexing maps leave a loop unread (MLIR rejects it)."""
    maps = {
        alias: (loops, results)
        for alias, loops, results in re.findall(
            r"^(#map\d*) = affine_map<\((.*?)\) -> \((.*?)\)>", text, re.M
        )
    }
    bad = []
    for line in text.splitlines():
        used = re.search(r"indexing_maps = \[([^\]]*)\]", line)
        if "linalg.generic" not in line or used is None:
            continue
        aliases = [a.strip() for a in used.group(1).split(",")]
        loops = set(re.findall(r"d\d+", maps[aliases[0]][0]))
        read = {d for a in aliases for d in re.findall(r"d\d+", maps[a][1])}
        if loops - read:
            bad.append(line.strip())
    return bad


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_every_generic_reads_each_of_its_loops(name):
    text = to_mlir(_graph(name))
    assert _loops_unread(text) == []
    # A splat tensor reduced is what IREE 3.13 miscompiles: none reaches a generic.
    fills = set(re.findall(r"^\s*(%\d+) = linalg.fill", text, re.M))
    for ins in re.findall(r"linalg.generic .*? ins\(([^:]*):", text):
        assert not fills & {v.strip() for v in ins.split(",")}, ins


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    pytest.importorskip("iree.compiler", reason="the iree target needs the 'iree' extra")
    pytest.importorskip("iree.runtime", reason="the iree target needs the 'iree' extra")
    from kiln.runners.iree import IreeRunner

    runner = IreeRunner({"device": "llvm-cpu"})
    if runner.unavailable():
        pytest.skip(f"iree llvm-cpu: {runner.unavailable()}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KILN_CACHE_DIR", str(tmp_path_factory.mktemp("kiln-cache")))
        yield runner


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_matches_oracle_on_iree_cpu(runner, name):
    from kiln.runners.base import KernelArtifacts

    graph = _graph(name)
    inputs = _inputs(graph)
    got = runner.run(runner.prepare(KernelArtifacts(name, graph, Path("."))), inputs).outputs
    want = run_graph(graph, inputs)
    for k, (g, w, node) in enumerate(zip(got, want, graph.output_nodes, strict=True)):
        assert g.dtype == w.dtype and g.shape == node.shape, f"{name} output {k}"
        rtol, atol = TOLERANCE.get(node.dtype, (0, 0))
        np.testing.assert_allclose(
            g.astype(np.float64),
            w.reshape(node.shape).astype(np.float64),
            rtol=rtol,
            atol=atol,
            err_msg=f"{name}: output {k} ({node.op} -> {node.type})",
        )
