"""Scalar level of the MLIR emitter: element types, literals and generic bodies.

One emitter per elementwise op (STYLE 5), writing arith/math ops into a
``linalg.generic`` body; f16/bf16 operands are widened to f32 around each op
and rounded back, as the oracle does. Also the graph facts that make values
scalars: uniform constants, and the dims a value does not vary along.
Used by runners/iree_mlir.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Protocol

import numpy as np

from kiln.errors import TargetError
from kiln.ir.graph import Graph, Node, TensorType
from kiln.ir.interp import NUMPY_DTYPES, evaluate
from kiln.ir.ops import OPS

ELEM = {"f32": "f32", "f16": "f16", "bf16": "bf16", "i32": "i32", "bool": "i1"}
FLOATS = ("f32", "f16", "bf16")
HALVES = ("f16", "bf16")
ELEMENTWISE = ("unary", "binary", "compare", "select", "cast")
# Bit patterns of the non-finite f32 values MLIR cannot spell in decimal.
F32_SPECIAL = {"inf": "0x7F800000", "-inf": "0xFF800000", "nan": "0x7FC00000"}


def ttype(shape: tuple[int, ...] | list[int], elem: str) -> str:
    """``tensor<4x8xf32>``; rank 0 is ``tensor<f32>``."""
    return "tensor<" + "".join(f"{d}x" for d in shape) + elem + ">"


def func_name(graph: Graph) -> str:
    """The MLIR symbol of the graph: its name with non-identifier characters as ``_``."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", graph.name) or "kernel"
    return name if not name[0].isdigit() else "_" + name


def literal(value, dtype: str) -> str:
    """An MLIR literal for ``value`` rounded to ``dtype`` (exact, shortest form)."""
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf is the literal
        x = np.asarray(value).astype(NUMPY_DTYPES[dtype])
    if dtype == "bool":
        return "true" if bool(x) else "false"
    if dtype == "i32":
        return str(int(x))
    f = np.float32(x)  # every f16/bf16 value is an f32 value: print that, MLIR rounds back
    if not np.isfinite(f):
        bits = F32_SPECIAL["nan" if np.isnan(f) else ("inf" if f > 0 else "-inf")]
        return bits if dtype == "f32" else _half_bits(x, dtype)
    if f == 0 or 1e-4 <= abs(f) < 1e16:
        return np.format_float_positional(f, unique=True, trim="0")
    return np.format_float_scientific(f, unique=True, trim="0")


def constant_op(text: str, elem: str) -> str:
    """``arith.constant``; MLIR spells bools bare (``true``), other literals with a type."""
    return f"arith.constant {text}" if elem == "i1" else f"arith.constant {text} : {elem}"


def _half_bits(x, dtype: str) -> str:
    return f"0x{int(np.asarray(x, NUMPY_DTYPES[dtype]).view(np.uint16)):04X}"


def affine(rank: int, results: list[str] | tuple[str, ...]) -> str:
    dims = ", ".join(f"d{i}" for i in range(rank))
    return f"affine_map<({dims}) -> ({', '.join(results)})>"


def reassociation(rank: int, kept: list[int]) -> str:
    """Groups of ``rank`` dims, each holding one kept dim and the unit dims beside it."""
    if not kept:
        return "[]"
    groups: list[list[int]] = []
    for i in range(rank):
        if i in kept and groups and any(j in kept for j in groups[-1]):
            groups.append([i])
        elif groups:
            groups[-1].append(i)
        else:
            groups.append([i])
    return "[" + ", ".join("[" + ", ".join(map(str, g)) + "]" for g in groups) + "]"


# ---------------------------------------------------------------------------
# Uniform constants: folded here, so IREE never sees a splat tensor reduced.

_SAME_VALUE = ("broadcast", "reshape", "transpose", "slice")


def splat_values(graph: Graph) -> dict[int, np.ndarray]:
    """Nodes whose every element is one value known now (node id -> 0-d array of its dtype).

    Constants and whatever is computed from them alone (full_like, ones_like,
    a reduction of one), by the oracle's own arithmetic. The emitter writes
    these as scalar literals: IREE 3.13 folds a splat tensor into a reduction
    that reads it and then loses the reduced loop (sum(ones(3, 5), -1) == 1).
    """
    known: dict[int, np.ndarray] = {}
    for node in graph.nodes:
        values = [known.get(i) for i in node.inputs]
        if node.op == "const":
            value = evaluate("const", [], dict(node.attrs), TensorType((), node.dtype))
        elif not node.inputs or any(v is None for v in values):
            continue
        elif node.op in _SAME_VALUE or (
            node.op == "concat" and len({v.tobytes() for v in values}) == 1
        ):
            value = values[0]
        elif _kind(node) in ELEMENTWISE:
            value = evaluate(node.op, values, dict(node.attrs), TensorType((), node.dtype))
        elif _kind(node) == "reduce":
            value = _reduced_splat(graph, node, values[0])
        else:
            continue
        if value is not None:
            known[node.id] = value
    return known


def varying_dims(graph: Graph, splats: dict[int, np.ndarray]) -> dict[int, frozenset[int]]:
    """The dims of each node's shape its value may vary along (node id -> dims).

    A reduction along a dim its input does not vary along is folded by the
    emitter (sum: times the count, prod: to that power, max/min/mean: itself):
    a loop that reads nothing along it is invalid MLIR, and IREE 3.13 miscompiles
    a broadcast materialized and then reduced along its stretched dim.
    """
    dims: dict[int, frozenset[int]] = {}
    for node in graph.nodes:
        rank, kind = node.type.rank, _kind(node)
        ins = [dims[i] for i in node.inputs]
        if node.id in splats:
            dims[node.id] = frozenset()
        elif node.op == "broadcast":
            src = graph.node(node.inputs[0])
            offset = rank - src.type.rank
            dims[node.id] = frozenset(
                d + offset for d in ins[0] if src.shape[d] == node.shape[d + offset]
            )
        elif kind in ELEMENTWISE:
            dims[node.id] = frozenset().union(*ins)
        elif kind == "reduce":
            axes, varied = node.attr("axes"), ins[0] - set(node.attr("axes"))
            if node.attr("keepdims"):
                dims[node.id] = varied
            else:
                kept = [d for d in range(graph.node(node.inputs[0]).type.rank) if d not in axes]
                dims[node.id] = frozenset(k for k, d in enumerate(kept) if d in varied)
        elif node.op == "transpose":
            dims[node.id] = frozenset(k for k, d in enumerate(node.attr("perm")) if d in ins[0])
        elif node.op == "slice":
            dims[node.id] = ins[0]
        else:
            dims[node.id] = frozenset(range(rank))
    return dims


def _kind(node: Node) -> str | None:
    return OPS[node.op].kind if node.op in OPS else None  # unknown: the emitter refuses it


def _reduced_splat(graph: Graph, node: Node, value: np.ndarray) -> np.ndarray | None:
    """A reduction of a uniform tensor: the oracle run on one row of the reduced axes."""
    x, axes = graph.node(node.inputs[0]), tuple(node.attr("axes"))
    row = np.broadcast_to(value, [d if i in axes else 1 for i, d in enumerate(x.shape)])
    out = TensorType(
        tuple(1 for i in range(x.type.rank) if node.attr("keepdims") or i not in axes),
        node.dtype,
    )
    try:
        return evaluate(node.op, [row], dict(node.attrs), out).reshape(())
    except ValueError:  # max/min of an empty axis: left to the target to refuse
        return None


# ---------------------------------------------------------------------------
# Scalar bodies: one emitter per op, (body, node, args, t) -> value (STYLE 5).
# ``t`` is the element type the args have: f32 for widened halves.


class SsaNames(Protocol):
    """What a body needs of the function it is written into: fresh SSA value names."""

    def fresh(self) -> str: ...


class Body:
    """The region of one linalg.generic: scalar ops appended in order."""

    def __init__(self, fn: SsaNames):
        self.fn = fn
        self.lines: list[str] = []
        self._consts: dict[tuple[str, str], str] = {}

    def op(self, text: str) -> str:
        name = self.fn.fresh()
        self.lines.append(f"{name} = {text}")
        return name

    def ins(self, op: str, *args: str, t: str = "f32") -> str:
        """``op a, b : t`` (unary and binary arith/math ops share this form)."""
        return self.op(f"{op} {', '.join(args)} : {t}")

    def narrow(self, x: str, elem: str) -> str:
        """Round an f32 value to f16/bf16 (nearest-even), as numpy does.

        bf16 is rounded with integer ops: IREE computes bf16 in f32 and folds
        ``extf(truncf(x))`` to ``x``, which would skip the rounding.
        """
        if elem != "bf16":
            return self.op(f"arith.truncf {x} : f32 to {elem}")
        i32 = "i32"
        bits = self.op(f"arith.bitcast {x} : f32 to i32")
        sixteen = self.const(16, i32)
        lsb = self.ins(
            "arith.andi", self.ins("arith.shrui", bits, sixteen, t=i32), self.const(1, i32), t=i32
        )
        rounded = self.ins(
            "arith.addi", bits, self.ins("arith.addi", lsb, self.const(0x7FFF, i32), t=i32), t=i32
        )
        high = self.op(
            f"arith.trunci {self.ins('arith.shrui', rounded, sixteen, t=i32)} : i32 to i16"
        )
        value = self.op(f"arith.bitcast {high} : i16 to bf16")
        nan = self.op(f"arith.cmpf uno, {x}, {x} : f32")
        return self.op(f"arith.select {nan}, {self.const(float('nan'), 'bf16')}, {value} : bf16")

    def const(self, value, dtype: str) -> str:
        text = literal(value, dtype)
        key = (text, dtype)
        if key not in self._consts:
            self._consts[key] = self.op(constant_op(text, ELEM[dtype]))
        return self._consts[key]


_T_DTYPE = {"f32": "f32", "f16": "f16", "bf16": "bf16", "i32": "i32", "i1": "bool"}


def _by_type(f_op: str | None, i_op: str | None, b_op: str | None = None) -> Callable:
    def emit(b: Body, node: Node, args: list[str], t: str) -> str:
        op = {"i1": b_op, "i32": i_op}.get(t, f_op)
        if op is None:
            raise TargetError(f"iree: {node.op} is not defined on {node.dtype} (node {node.id})")
        return b.op(f"{op} {', '.join(args)} : {t}")

    return emit


def _math(name: str) -> Callable:
    return lambda b, node, args, t: b.op(f"math.{name} {args[0]} : {t}")


def _div(b, node, args, t):
    if t == "f32":
        return b.ins("arith.divf", *args)
    if t != "i32":
        raise TargetError(f"iree: div is not defined on {node.dtype} (node {node.id})")
    # divsi traps (SIGFPE) on x / 0 and INT_MIN / -1. numpy computes in float and
    # casts back, which gives INT_MIN for both on x86: divide by 1 there instead.
    a, d = args
    int_min = b.const(-(2**31), "i32")
    by_zero = b.op(f"arith.cmpi eq, {d}, {b.const(0, 'i32')} : i32")
    overflow = b.ins(
        "arith.andi",
        b.op(f"arith.cmpi eq, {a}, {int_min} : i32"),
        b.op(f"arith.cmpi eq, {d}, {b.const(-1, 'i32')} : i32"),
        t="i1",
    )
    one = b.const(1, "i32")
    safe = b.op(f"arith.select {b.ins('arith.ori', by_zero, overflow, t='i1')}, {one}, {d} : i32")
    quotient = b.ins("arith.divsi", a, safe, t="i32")
    return b.op(f"arith.select {by_zero}, {int_min}, {quotient} : i32")


def _neg(b, node, args, t):
    if t == "i32":
        return b.op(f"arith.subi {b.const(0, 'i32')}, {args[0]} : i32")
    return b.op(f"arith.negf {args[0]} : {t}")


def _abs(b, node, args, t):
    if t == "i1":
        return args[0]
    return b.op(f"math.{'absi' if t == 'i32' else 'absf'} {args[0]} : {t}")


def _relu(b, node, args, t):
    if t == "i1":
        return args[0]
    op = "arith.maxsi" if t == "i32" else "arith.maximumf"
    return b.op(f"{op} {args[0]}, {b.const(0, _T_DTYPE[t])} : {t}")


def _sigmoid(b, node, args, t):
    one = b.const(1, "f32")
    e = b.ins("math.exp", b.ins("arith.negf", args[0]))
    return b.ins("arith.divf", one, b.ins("arith.addf", one, e))


def _gelu(b, node, args, t):
    (x,) = args
    c = b.const(float(np.sqrt(2.0 / np.pi)), "f32")
    x3 = b.ins("arith.mulf", b.ins("arith.mulf", x, x), x)
    inner = b.ins("arith.addf", x, b.ins("arith.mulf", b.const(0.044715, "f32"), x3))
    th = b.ins("math.tanh", b.ins("arith.mulf", c, inner))
    half_x = b.ins("arith.mulf", b.const(0.5, "f32"), x)
    return b.ins("arith.mulf", half_x, b.ins("arith.addf", b.const(1, "f32"), th))


def _pow(b, node, args, t):
    a, e = args
    if t == "i32":  # square-and-multiply over the 31 bits of max(e, 0): no loop, wraps like numpy
        zero = b.const(0, "i32")
        e = b.ins("arith.maxsi", e, zero, t="i32")
        result, base = b.const(1, "i32"), a
        for k in range(31):
            bit = b.ins("arith.andi", e, b.const(1 << k, "i32"), t="i32")
            on = b.op(f"arith.cmpi ne, {bit}, {zero} : i32")
            prod = b.ins("arith.muli", result, base, t="i32")
            result = b.op(f"arith.select {on}, {prod}, {result} : i32")
            if k < 30:
                base = b.ins("arith.muli", base, base, t="i32")
        return result
    # math.powf is exp(e*log(a)): NaN for a < 0, and for 1**inf, 1**nan, x**0 with x
    # 0, inf or nan. Take |a|, then restore numpy's (IEEE pow's) answers around it.
    one, zero = b.const(1, "f32"), b.const(0, "f32")
    p = b.ins("math.powf", b.ins("math.absf", a), e)
    unit = b.op(f"arith.cmpf oeq, {b.ins('math.absf', a)}, {one} : f32")
    p = b.op(f"arith.select {unit}, {one}, {p} : f32")  # |a| == 1: (-1)**nan is fixed below
    is_int = b.op(f"arith.cmpf oeq, {b.ins('math.trunc', e)}, {e} : f32")  # false for nan
    half = b.ins("arith.mulf", e, b.const(0.5, "f32"))
    even = b.op(f"arith.cmpf oeq, {b.ins('math.trunc', half)}, {half} : f32")
    odd = b.ins(
        "arith.andi", is_int, b.ins("arith.xori", even, b.const(True, "bool"), t="i1"), t="i1"
    )
    sign = b.op(f"arith.cmpf olt, {b.ins('math.copysign', one, a)}, {zero} : f32")  # -0.0 too
    flip = b.ins("arith.andi", sign, odd, t="i1")
    p = b.op(f"arith.select {flip}, {b.ins('arith.negf', p)}, {p} : f32")
    # a finite negative base to a non-integer power has no real value (-inf**0.5 is inf)
    finite_neg = b.ins(
        "arith.andi",
        b.op(f"arith.cmpf olt, {a}, {zero} : f32"),
        b.op(f"arith.cmpf one, {a}, {b.const(float('-inf'), 'f32')} : f32"),
        t="i1",
    )
    not_int = b.ins("arith.xori", is_int, b.const(True, "bool"), t="i1")
    undefined = b.ins("arith.andi", finite_neg, not_int, t="i1")
    p = b.op(f"arith.select {undefined}, {b.const(float('nan'), 'f32')}, {p} : f32")
    e_zero = b.op(f"arith.cmpf oeq, {e}, {zero} : f32")  # x**0 is 1 for every x, nan too
    return b.op(f"arith.select {e_zero}, {one}, {p} : f32")


_CMP_F = {"lt": "olt", "le": "ole", "gt": "ogt", "ge": "oge", "eq": "oeq", "ne": "une"}
_CMP_I = {"lt": "slt", "le": "sle", "gt": "sgt", "ge": "sge", "eq": "eq", "ne": "ne"}
_CMP_B = {"lt": "ult", "le": "ule", "gt": "ugt", "ge": "uge", "eq": "eq", "ne": "ne"}


def _compare(b, node, args, t):
    if t in ("i32", "i1"):
        pred = (_CMP_I if t == "i32" else _CMP_B)[node.op]
        return b.op(f"arith.cmpi {pred}, {args[0]}, {args[1]} : {t}")
    return b.op(f"arith.cmpf {_CMP_F[node.op]}, {args[0]}, {args[1]} : {t}")


def _where(b, node, args, t):
    return b.op(f"arith.select {args[0]}, {args[1]}, {args[2]} : {t}")


def _cast(b, node, args, t):
    x, dst = args[0], ELEM[node.dtype]
    if t == dst:
        return x
    if t in FLOATS and dst in FLOATS:
        if t != "f32":
            x = b.op(f"arith.extf {x} : {t} to f32")
        return b.narrow(x, dst) if dst != "f32" else x
    if dst == "i1":
        zero = b.const(0, _T_DTYPE[t])
        cmp = "arith.cmpi ne" if t == "i32" else "arith.cmpf une"
        return b.op(f"{cmp}, {x}, {zero} : {t}")
    if t in FLOATS:  # -> i32
        return b.op(f"arith.fptosi {x} : {t} to i32")
    if dst == "i32":  # i1 -> i32
        return b.op(f"arith.extui {x} : i1 to i32")
    conv = "arith.sitofp" if t == "i32" else "arith.uitofp"
    if dst == "bf16":
        wide = b.op(f"{conv} {x} : {t} to f32")
        return b.narrow(wide, "bf16")
    return b.op(f"{conv} {x} : {t} to {dst}")


# op -> (emitter, widen): widen ops see f16/bf16 operands as f32 and round their result.
SCALAR: dict[str, tuple[Callable, bool]] = {
    "add": (_by_type("arith.addf", "arith.addi", "arith.ori"), True),
    "sub": (_by_type("arith.subf", "arith.subi"), True),
    "mul": (_by_type("arith.mulf", "arith.muli", "arith.andi"), True),
    "div": (_div, True),
    "maximum": (_by_type("arith.maximumf", "arith.maxsi", "arith.ori"), True),
    "minimum": (_by_type("arith.minimumf", "arith.minsi", "arith.andi"), True),
    "pow": (_pow, True),
    "neg": (_neg, True),
    "abs": (_abs, True),
    "exp": (_math("exp"), True),
    "log": (_math("log"), True),
    "sqrt": (_math("sqrt"), True),
    "rsqrt": (_math("rsqrt"), True),
    "tanh": (_math("tanh"), True),
    "sigmoid": (_sigmoid, True),
    "erf": (_math("erf"), True),
    "log1p": (_math("log1p"), True),
    "expm1": (_math("expm1"), True),
    "floor": (_math("floor"), True),
    "ceil": (_math("ceil"), True),
    "round": (_math("roundeven"), True),
    "relu": (_relu, True),
    "gelu": (_gelu, True),
    **{op: (_compare, False) for op in _CMP_F},
    "where": (_where, False),
    "cast": (_cast, False),
}


def emit_scalar(b: Body, node: Node, args: list[str], in_dtype: str) -> str:
    """The body value of ``node`` (in its own element type) from ``args`` (in ``in_dtype``)."""
    emitter, widen = SCALAR[node.op]
    if widen and in_dtype in HALVES:
        args = [b.op(f"arith.extf {a} : {ELEM[in_dtype]} to f32") for a in args]
        result = emitter(b, node, args, "f32")
        return b.narrow(result, ELEM[node.dtype])
    return emitter(b, node, args, ELEM[in_dtype])
