"""What each graph op means, in numpy: the oracle's arithmetic.

The eager path of ``@device`` functions and the graph interpreter both
call :func:`evaluate`, so "run the kernel on the host" and "run its traced
graph" can never disagree. f16/bf16 operands are computed in f32 and the
result is rounded to the node's dtype once.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np

from kiln.ir.graph import Graph, TensorType


class NumpyDtypes(Mapping):
    """Kiln dtype name -> numpy dtype; bf16's comes from ml_dtypes, imported on first use.

    Some ml_dtypes releases take about a second to import: a build of f32
    kernels, and every worker process of a parallel or distributed build,
    would pay it for a dtype it never meets.
    """

    NAMES = ("f32", "f16", "bf16", "i32", "bool")

    def __init__(self):
        self._known = {
            "f32": np.dtype(np.float32),
            "f16": np.dtype(np.float16),
            "i32": np.dtype(np.int32),
            "bool": np.dtype(np.bool_),
        }

    def __getitem__(self, name: str) -> np.dtype:
        if name == "bf16" and name not in self._known:
            import ml_dtypes

            self._known[name] = np.dtype(ml_dtypes.bfloat16)
        return self._known[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.NAMES)

    def __len__(self) -> int:
        return len(self.NAMES)

    def name_of(self, dtype) -> str | None:
        """The Kiln name of a numpy dtype, or None; never imports ml_dtypes itself.

        A bfloat16 array can only exist once ml_dtypes is imported, so bf16 is
        looked for only then.
        """
        dtype = np.dtype(dtype)
        for name, known in self._known.items():
            if known == dtype:
                return name
        if "ml_dtypes" in sys.modules and dtype == self["bf16"]:
            return "bf16"
        return None


NUMPY_DTYPES = NumpyDtypes()


def kiln_dtype(dtype: np.dtype) -> str:
    """The Kiln dtype name of a numpy dtype; raises KeyError for unsupported ones."""
    name = NUMPY_DTYPES.name_of(dtype)
    if name is None:
        raise KeyError(np.dtype(dtype))
    return name


def _wide(x: np.ndarray) -> np.ndarray:
    """Half-precision floats are computed in f32 (asking by name imports no ml_dtypes)."""
    if NUMPY_DTYPES.name_of(x.dtype) in ("f16", "bf16"):
        return x.astype(np.float32)
    return x


def _gelu(x):
    c = math.sqrt(2.0 / math.pi)
    return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x * x * x)))


_ERF = np.frompyfunc(math.erf, 1, 1)


def _erf(x):
    """numpy has no erf; math.erf per element is exact to double precision."""
    return _ERF(x.astype(np.float64)).astype(x.dtype)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _div(a, b):
    return np.true_divide(a, b)


def _pow(a, b):
    if a.dtype.kind == "i":
        return np.power(a, np.maximum(b, 0))
    # numpy's loop for a broadcast (stride-0) exponent differs from its contiguous one at
    # special values ((-inf) ** 0.5 is nan there, inf here): the sim hands in broadcast
    # views, the eager path contiguous arrays, so both are made contiguous here.
    return np.power(np.asarray(a, order="C"), np.asarray(b, order="C"))


def _conv2d(x, w, attrs):
    n, h, wd, c = x.shape
    kh, kw, _, f = w.shape
    (sh, sw), (ph, pw), (dh, dw) = attrs["stride"], attrs["padding"], attrs["dilation"]
    xp = np.pad(x, ((0, 0), (ph, ph), (pw, pw), (0, 0)))
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, oh, ow, f), dtype=np.result_type(x, w))
    for i in range(kh):
        for j in range(kw):
            patch = xp[
                :,
                i * dh : i * dh + sh * (oh - 1) + 1 : sh,
                j * dw : j * dw + sw * (ow - 1) + 1 : sw,
                :,
            ]
            out += patch @ w[i, j]
    return out


_UNARY: dict[str, Callable] = {
    "neg": np.negative,
    "abs": np.abs,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "tanh": np.tanh,
    "sigmoid": _sigmoid,
    "relu": lambda x: np.maximum(x, 0),
    "gelu": _gelu,
    "erf": _erf,
    "log1p": np.log1p,
    "expm1": np.expm1,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.round,  # half to even, like numpy
}
_BINARY: dict[str, Callable] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": _div,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "pow": _pow,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "eq": np.equal,
    "ne": np.not_equal,
}
_REDUCE: dict[str, Callable] = {
    "sum": np.sum,
    "max": np.max,
    "min": np.min,
    "mean": np.mean,
    "prod": np.prod,
}


def _slice(x, attrs):
    index = tuple(
        slice(start, start + (size - 1) * step + 1 if size else start, step)
        for start, step, size in zip(attrs["starts"], attrs["steps"], attrs["sizes"], strict=True)
    )
    return x[index]


def evaluate(op: str, inputs: Sequence[np.ndarray], attrs: dict, out: TensorType) -> np.ndarray:
    """Compute one op on numpy arrays; the result has exactly ``out``'s dtype and shape."""
    args = [_wide(np.asarray(x)) for x in inputs]
    if op in _UNARY:
        with np.errstate(all="ignore"):
            result = _UNARY[op](args[0])
    elif op in _BINARY:
        with np.errstate(all="ignore"):
            result = _BINARY[op](args[0], args[1])
    elif op == "where":
        result = np.where(args[0], args[1], args[2])
    elif op == "cast":  # NumPy's C cast: out-of-range floats to i32 wrap, f16 overflows to inf
        # To i32 a half goes through f32 like every other op (ml_dtypes' own bf16 -> int32
        # turns NaN, inf and out-of-range values into 0, where f16 and f32 give INT_MIN);
        # other casts take the narrow value as is, so i32 -> bf16 rounds once.
        source = args[0] if out.dtype == "i32" else np.asarray(inputs[0])
        with np.errstate(over="ignore", invalid="ignore"):
            result = source.astype(NUMPY_DTYPES[out.dtype])
    elif op in _REDUCE:
        with np.errstate(all="ignore"):  # a sum may overflow to inf, as on every target
            result = _REDUCE[op](
                args[0], axis=tuple(attrs["axes"]), keepdims=bool(attrs.get("keepdims"))
            )
    elif op == "matmul":
        with np.errstate(all="ignore"):
            result = np.matmul(args[0], args[1])
    elif op == "transpose":
        result = np.transpose(args[0], tuple(attrs["perm"]))
    elif op == "reshape":
        result = np.reshape(args[0], tuple(attrs["shape"]))
    elif op == "broadcast":
        result = np.broadcast_to(args[0], tuple(attrs["shape"]))
    elif op == "slice":
        result = _slice(args[0], attrs)
    elif op == "concat":
        result = np.concatenate(args, axis=attrs["axis"])
    elif op == "conv2d":
        with np.errstate(all="ignore"):
            result = _conv2d(args[0], args[1], attrs)
    elif op == "const":
        result = np.full(out.shape, attrs["value"])
    else:
        raise ValueError(f"no numpy meaning for op {op!r}")
    # np.asarray(order="C"), not np.ascontiguousarray: the latter turns 0-d results into 1-d.
    with np.errstate(over="ignore", invalid="ignore"):  # rounding to f16 may overflow to inf
        result = np.asarray(result).astype(NUMPY_DTYPES[out.dtype], copy=False)
    result = np.asarray(result, order="C")
    if result.shape != out.shape:
        raise ValueError(f"{op}: computed shape {result.shape}, expected {out.shape}")
    return result


def run_graph(graph: Graph, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Interpret a whole graph on numpy arrays (one per ``arg`` node, in index order)."""
    args = graph.args
    if len(inputs) != len(args):
        raise ValueError(f"{graph.name}: expects {len(args)} inputs, got {len(inputs)}")
    values: dict[int, np.ndarray] = {}
    for node, array in zip(args, inputs, strict=True):
        values[node.id] = np.asarray(array, dtype=NUMPY_DTYPES[node.dtype])
    for node in graph.nodes:
        if node.op == "arg":
            continue
        values[node.id] = evaluate(
            node.op, [values[i] for i in node.inputs], dict(node.attrs), node.type
        )
    return [values[i] for i in graph.outputs]
