"""A corpus of kernels written the way docs/language.md teaches, checked by `kiln test`.

One project (built once for the module) holds a table of kernels x shape sets x
dtypes: broadcasting from size-1 dims and scalars on either side, every
reduction with negative axes and keepdims, chained reductions, transposes and
reshapes feeding matmuls, batched and broadcast matmuls, convolutions, casts of
NaN and inf, IEEE special values, i32 overflow and odd sizes (1, 3, 7, 127, 129)
that stress tiling. `kiln test` runs every instance on the sim (npu-v1 and
npu-tiny) and, where IREE is installed, on iree-cpu, against the cpu oracle;
each test below reads one instance's verdicts from test-report.json.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import machines_yaml, run_kiln
from tests.lang.targets import HAS_IREE

KERNELS = """\
# ruff: noqa: F821
import kiln
from kiln import Tensor, device


@device
def bcast_binary(a: Tensor["R", 1], b: Tensor[1, "C"], v: Tensor["C"]):
    s = a + b
    return s * v - kiln.maximum(a, v), kiln.minimum(b, a) / (abs(v) + 1), kiln.where(a > v, s, b)


@device
def scalar_sides(x: Tensor["R", "C"]):
    return 2 - x, x * 3, 0.5 / (x * x + 1), kiln.maximum(0.25, x), 1 + x**2, x - 7


@device
def unaries(x: Tensor["N"]):
    y = abs(x) + 0.5
    return (
        kiln.exp(x), kiln.log(y), kiln.sqrt(y), kiln.rsqrt(y), kiln.tanh(x), kiln.sigmoid(x),
        x.relu(), kiln.gelu(x), kiln.gelu(x, approximate="none"), kiln.erf(x), kiln.log1p(y),
        kiln.expm1(x), kiln.floor(x * 4), kiln.ceil(x * 4), kiln.round(x * 4), kiln.silu(x),
        kiln.softplus(x * 30), kiln.sign(x), kiln.clip(x, -0.5, 0.25), -x, x.reciprocal(),
    )


@device
def reductions(x: Tensor["A", "B", "C"]):
    return (
        x.sum(axis=0, keepdims=True), x.max(axis=-1), x.mean(axis=(0, 2)), x.min(),
        x.prod(axis=-2), x.sum(axis=(-1, 0), keepdims=True), x.max(axis=-1).sum(axis=0),
        x.sum(axis=1).max(keepdims=True),
    )


@device
def statistics(x: Tensor["R", "C"]):
    return (
        kiln.argmax(x, axis=-1), kiln.argmin(x, axis=0), x.var(axis=0, ddof=1), x.std(),
        kiln.logsumexp(x, axis=-1), kiln.softmax(x, axis=0), kiln.log_softmax(x),
    )


@device
def layernorm(x: Tensor["R", "C"], g: Tensor["C"]):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) * kiln.rsqrt(var + 1e-5) * g


@device
def batched_matmul(a: Tensor["B", 1, "M", "K"], b: Tensor["H", "K", "N"]):
    return a @ b, (a @ b).sum(axis=1)


@device
def matvec(a: Tensor["M", "K"], v: Tensor["K"]):
    return a @ v, v @ a.T, v @ v, kiln.dot(a, v)


@device
def transposed_matmul(x: Tensor["K", "M"]):
    flat = x.reshape(-1)
    return x.T @ x, x @ x.T, flat.reshape(x.shape[1], x.shape[0]) @ x


@device
def broadcast_matmul(x: Tensor["K", "N"], v: Tensor["K"], u: Tensor["K", 1]):
    k = x.shape[0]
    return kiln.broadcast_to(v, (5, k)) @ x, x.T @ kiln.broadcast_to(u, (k, 3))


@device
def conv_nhwc(x: Tensor["N", "H", "W", "C"], w: Tensor["F", 3, 3, "C"], b: Tensor["F"]):
    y = (kiln.conv(x, w, stride=2, padding="same") + b).relu()
    return y, kiln.conv(x, w, padding=((0, 2), (1, 0)), dilation=(2, 1))


@device
def conv_grouped(x: Tensor["N", "C", "H", "W"], w: Tensor["F", 1, 3, 3]):
    c = x.shape[1]
    return kiln.conv(x, w, groups=c, layout="NCHW", padding=1)


@device
def casts(x: Tensor["N"]):
    nan = kiln.log(x - 2)  # log of a negative number: NaN in every element
    big = x * 1e10
    return (
        nan.astype("int32"), big.astype("int32"), (x * 100).astype("int32"),
        x.astype("float16"), x.astype("bfloat16"), (x > 0).astype("float32"),
        (x * 1e5).astype("float16"), (x * 100).astype("int32").astype("bfloat16"),
    )


@device
def specials(x: Tensor["N"]):
    zero = x * 0
    neg_zero = -abs(zero)
    one = zero + 1
    inf = one / zero
    return (
        zero**zero, one**inf, inf**zero, (-inf) ** 0.5, neg_zero**-1.0, neg_zero**3.0,
        (x - kiln.inf).max(), kiln.where(x > 0, x, -kiln.inf), x * float("nan"),
        kiln.maximum(x, zero * kiln.inf), x + 1e30,
    )


@device
def int_ops(x: Tensor["R", "C"]):
    big = x * 2**28
    return (
        big.sum(axis=-1), (big + 2**30).prod(axis=0), x * x - 3, abs(x), x / (abs(x) + 1),
        x**2, kiln.maximum(x, 2), (x > 0).sum(axis=0), x.mean(axis=-1), x.max(axis=0),
    )


@device
def slices(x: Tensor["R", "C"]):
    return (
        x[1:, ::2], x[::-1, -1], x[None, :, 0], kiln.flip(x, -1),
        kiln.concatenate([x, x[:1] * 2], axis=0), kiln.stack([x, -x], axis=1),
    )


@device
def outer_concat(a: Tensor["M"], b: Tensor["N"]):
    outer = a.reshape(-1, 1) * b
    return kiln.concatenate([a, b, a * 2]), outer, outer.reshape(a.shape[0] * b.shape[0])


@device
def compare_select(x: Tensor["R", "C"], y: Tensor["C"]):
    return (
        x < y, x >= 0.5, x == x, kiln.where(x > y, x, 0), (x > 0) & (y < 0), ~(x > y),
        kiln.where((x > 0) ^ (y > 0), 1.0, x),
    )
"""

# kernel -> {shape set: bindings}, dtypes (None: f32)
TABLE = {
    "bcast_binary": ({"a": {"R": 3, "C": 7}, "b": {"R": 129, "C": 1}}, ["f32", "f16", "bf16"]),
    "scalar_sides": ({"a": {"R": 1, "C": 127}, "b": {"R": 7, "C": 3}}, ["f32", "bf16", "i32"]),
    "unaries": ({"a": {"N": 129}}, ["f32", "f16", "bf16"]),
    "reductions": ({"a": {"A": 3, "B": 7, "C": 5}, "b": {"A": 1, "B": 1, "C": 129}}, ["f32"]),
    "statistics": ({"a": {"R": 7, "C": 127}, "b": {"R": 1, "C": 3}}, ["f32", "bf16"]),
    "layernorm": ({"a": {"R": 3, "C": 129}}, ["f32", "f16"]),
    "batched_matmul": ({"a": {"B": 2, "H": 3, "M": 7, "K": 5, "N": 3}}, ["f32", "f16"]),
    "matvec": ({"a": {"M": 127, "K": 129}, "b": {"M": 1, "K": 1}}, ["f32"]),
    "transposed_matmul": ({"a": {"K": 7, "M": 3}}, ["f32", "bf16"]),
    "broadcast_matmul": ({"a": {"K": 4, "N": 3}, "b": {"K": 129, "N": 7}}, ["f32", "f16"]),
    "conv_nhwc": ({"a": {"N": 2, "H": 7, "W": 9, "C": 3, "F": 4}}, ["f32", "f16"]),
    "conv_grouped": ({"a": {"N": 1, "C": 3, "H": 7, "W": 5, "F": 6}}, ["f32"]),
    "casts": ({"a": {"N": 7}}, ["f32", "f16", "bf16"]),
    "specials": ({"a": {"N": 3}}, ["f32", "f16", "bf16"]),
    "int_ops": ({"a": {"R": 3, "C": 129}}, ["i32"]),
    "slices": ({"a": {"R": 3, "C": 7}}, ["f32", "i32"]),
    "outer_concat": ({"a": {"M": 3, "N": 7}, "b": {"M": 1, "N": 129}}, ["f32"]),
    "compare_select": ({"a": {"R": 7, "C": 3}}, ["f32", "bf16", "i32"]),
}
# IREE compiles cost ~1 s each on 2 cores: iree-cpu checks the first shape set in f32 and
# one half dtype, which covers the lowering of every kernel; the sim checks everything.
IREE_DTYPES = ("f32", "bf16")


def _instances() -> list[tuple[str, str, str]]:
    """(kernel entry name, shape set, dtype) for every row of the table."""
    return [
        (f"{kernel}_{dtype}", shape_set, dtype)
        for kernel, (sets, dtypes) in TABLE.items()
        for dtype in dtypes
        for shape_set in sets
    ]


def _pipeline() -> str:
    lines = ["project: corpus", "packages: [kernels]", "machine: npu-v1", "kernels:"]
    for kernel, (sets, dtypes) in TABLE.items():
        for dtype in dtypes:
            lines += [
                f"  {kernel}_{dtype}:",
                f"    function: kernels.corpus.{kernel}",
                f"    dtype: {dtype}",
            ]
            lines.append("    shapes:")
            lines += [f"      {name}: {json.dumps(dims)}" for name, dims in sets.items()]
    lines += [
        "targets:",
        "  cpu: {runner: cpu}",
        "  sim: {runner: sim, machine: npu-v1}",
        "  tiny: {runner: sim, machine: npu-tiny}",
        "  iree-cpu: {runner: iree, options: {device: llvm-cpu}}",
        "machines:",
    ]
    return "\n".join(lines) + "\n" + machines_yaml()


def _run(project: Path, *args: str) -> dict:
    proc = run_kiln(project, "test", *args, env={"KILN_CACHE_DIR": os.environ["KILN_CACHE_DIR"]})
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    report = json.loads((project / "build/kiln/kernel/test-report.json").read_text())
    return {(r["kernel"], r["target"]): r for r in report["reports"]}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory, shared_iree_cache) -> dict:
    """(instance, target) -> its report, from one `kiln test` per target group."""
    project = tmp_path_factory.mktemp("corpus")
    (project / "kernels").mkdir()
    (project / "kernels" / "__init__.py").write_text("")
    (project / "kernels" / "corpus.py").write_text(KERNELS)
    (project / "pipeline.yaml").write_text(_pipeline())
    found = _run(project, "--target", "sim", "--target", "tiny")
    if HAS_IREE:
        firsts = {f"{k}_{d}.{next(iter(TABLE[k][0]))}" for k in TABLE for d in TABLE[k][1]}
        picked = sorted(i for i in firsts if i.rsplit(".")[0].endswith(IREE_DTYPES))
        found.update(_run(project, *picked, "--target", "iree-cpu"))
    return found


@pytest.mark.parametrize(
    "entry, shape_set, dtype", _instances(), ids=[f"{e}.{s}" for e, s, _ in _instances()]
)
def test_corpus_kernel_agrees_with_the_oracle(verdicts, entry, shape_set, dtype):
    instance = f"{entry}.{shape_set}"
    targets = {t for (k, t) in verdicts if k == instance}
    assert {"sim", "tiny"} <= targets, f"{instance} was not tested: {sorted(verdicts)[:5]}..."
    for target in sorted(targets):
        report = verdicts[(instance, target)]
        bad = [o["text"] for o in report.get("outputs", []) if not o["ok"]]
        details = "\n".join(bad) or report.get("message") or report.get("reason")
        assert report["status"] == "pass", f"{instance} @ {target}:\n{details}"
