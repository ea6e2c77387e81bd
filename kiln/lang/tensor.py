"""``Tensor``: a value inside a @device function, eager (holds an ndarray) or traced (a node).

Both kinds go through :func:`apply`: the op table types the result
(``kiln.ir.ops.infer``), then an eager tensor is computed with
``kiln.ir.interp.evaluate`` and a traced one becomes a graph node. That
one branch is the only difference between running a kernel and tracing it.
The operators and methods below are one-liners over :mod:`kiln.lang.functions`.
"""

from __future__ import annotations

import difflib
import sys
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import TraceError
from kiln.ir.graph import MAX_TENSOR_BYTES, AttrValue, Node, TensorType, make_attrs
from kiln.ir.interp import evaluate
from kiln.ir.ops import OpTypeError, infer
from kiln.lang.errors import DOCS_NOTE, UnsupportedAttributeError, unsupported_operator
from kiln.lang.methods import NumpyMethods

Dim = str | int


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """What ``Tensor["M", "K"]`` makes: an annotation recording the argument's dims."""

    dims: tuple[Dim, ...]

    def __repr__(self) -> str:
        return f"Tensor[{', '.join(repr(d) for d in self.dims) or '()'}]"


def tensor_spec(item: Any) -> TensorSpec:
    items = item if isinstance(item, tuple) else (item,)
    for dim in items:
        ok_int = isinstance(dim, int) and not isinstance(dim, bool) and dim > 0
        if not (ok_int or (isinstance(dim, str) and dim.isidentifier())):
            raise TypeError(
                f"Tensor[...] dims must be names like 'N' or positive ints, got {dim!r}"
            )
    return TensorSpec(tuple(items))


class Builder:
    """The graph under construction while one kernel is traced."""

    def __init__(self, source_file: str | None = None) -> None:
        self.records: list[tuple[str, tuple[int, ...], tuple, TensorType]] = []
        # record -> line in ``source_file`` that created it (kept out of the graph:
        # a comment edit must not change graph.json; see stages/trace.py)
        self.source_file = source_file
        self.lines: dict[int, int] = {}

    def add(self, op: str, inputs: tuple[int, ...], attrs: tuple, type_: TensorType) -> int:
        self.records.append((op, inputs, attrs, type_))
        index = len(self.records) - 1
        if self.source_file is not None:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename != self.source_file:
                frame = frame.f_back
            if frame is not None:
                self.lines[index] = frame.f_lineno
        return index

    def nodes(self, keep: list[int]) -> tuple[tuple[Node, ...], dict[int, int]]:
        """Nodes reachable from ``keep`` (plus every ``arg``), renumbered in order."""
        live = [False] * len(self.records)
        for i in keep:
            live[i] = True
        for i in range(len(self.records) - 1, -1, -1):
            op, inputs, _, _ = self.records[i]
            if op == "arg":
                live[i] = True
            if live[i]:
                for j in inputs:
                    live[j] = True
        new_id: dict[int, int] = {}
        nodes: list[Node] = []
        for i, (op, inputs, attrs, type_) in enumerate(self.records):
            if live[i]:
                new_id[i] = len(nodes)
                nodes.append(Node(len(nodes), op, tuple(new_id[j] for j in inputs), type_, attrs))
        return tuple(nodes), new_id


_TRACING: ContextVar[Builder | None] = ContextVar("kiln_tracing", default=None)


@contextmanager
def tracing(builder: Builder | None):
    """Make ``builder`` the target of ops that have no tensor operand (constants).

    ``None`` means eager: an eager kernel call made while another kernel is
    being traced computes its constants, it does not record them."""
    token = _TRACING.set(builder)
    try:
        yield builder
    finally:
        _TRACING.reset(token)


def _builder_of(tensors: list[Tensor]) -> Builder | None:
    if not tensors:
        return _TRACING.get()
    if any(t._builder is not tensors[0]._builder for t in tensors):
        raise TraceError(
            "an op mixes tensors from different kernels or from eager and traced code",
            hint="tensors cannot be captured from outside a kernel: pass them as arguments",
        )
    return tensors[0]._builder


def _check_size(out: TensorType) -> None:
    size = out.nbytes
    if size > MAX_TENSOR_BYTES:
        raise TraceError(
            f"a tensor of shape {out.shape} ({out.dtype}) would take {size / 2**30:,.0f} GiB",
            expected=f"at most {MAX_TENSOR_BYTES // 2**30} GiB per tensor, as for arguments",
            found=f"{out.size:,} elements",
        )


def apply(op: str, inputs: list[Tensor], **attrs: AttrValue) -> Tensor:
    """Type ``op`` with the op table, then evaluate it (eager) or record a node (traced)."""
    frozen = make_attrs(**attrs)
    try:
        out = infer(op, [t.type for t in inputs], dict(frozen))
    except OpTypeError as exc:
        raise TraceError(str(exc)) from None
    _check_size(out)
    builder = _builder_of(inputs)
    if builder is None:
        return Tensor._eager(evaluate(op, [t._array for t in inputs], dict(frozen), out), out)
    node = builder.add(op, tuple(t._node for t in inputs), frozen, out)
    return Tensor._traced(builder, node, out)


def constant(value: bool | int | float, dtype: str) -> Tensor:
    """A shape-() ``const`` of ``dtype``; the value is stored as the dtype's Python kind."""
    if dtype == "bool":
        value = bool(value)
    elif dtype == "i32":
        value = int(value)
        if not -(2**31) <= value < 2**31:
            raise TraceError(f"constant {value} does not fit in i32")
    else:
        value = float(value)
    frozen = make_attrs(value=value)
    out = TensorType((), dtype)
    builder = _TRACING.get()
    if builder is None:
        return Tensor._eager(evaluate("const", [], dict(frozen), out), out)
    return Tensor._traced(builder, builder.add("const", (), frozen, out), out)


class Tensor(NumpyMethods):
    """A kernel value. ``Tensor["M", "K"]`` in an annotation declares an argument's dims."""

    __slots__ = ("type", "_builder", "_node", "_array")
    __hash__ = None  # type: ignore[assignment]  # like ndarray: == builds a tensor

    type: TensorType
    _builder: Builder | None
    _node: int
    _array: np.ndarray | None

    def __class_getitem__(cls, item: Any) -> TensorSpec:
        return tensor_spec(item)

    def __init__(self) -> None:
        raise TypeError("Tensors are made by calling a @device function, not constructed")

    @classmethod
    def _eager(cls, array: np.ndarray, type_: TensorType) -> Tensor:
        self = object.__new__(cls)
        self.type, self._builder, self._node, self._array = type_, None, -1, array
        return self

    @classmethod
    def _traced(cls, builder: Builder, node: int, type_: TensorType) -> Tensor:
        self = object.__new__(cls)
        self.type, self._builder, self._node, self._array = type_, builder, node, None
        return self

    # -- static facts -------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    @property
    def ndim(self) -> int:
        return self.type.rank

    @property
    def size(self) -> int:
        return self.type.size

    @property
    def is_traced(self) -> bool:
        return self._builder is not None

    def __len__(self) -> int:
        if not self.shape:
            raise TraceError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        where = f"node {self._node}" if self.is_traced else "eager"
        return f"Tensor({self.type}, {where})"

    def numpy(self) -> np.ndarray:
        """The value of an eager tensor (a traced one has none)."""
        if self._array is None:
            raise TraceError("a traced tensor has no value: .numpy() only works eagerly")
        return self._array

    # -- arithmetic ----------------------------------------------------------
    def __add__(self, other):
        return F.add(self, other)

    def __radd__(self, other):
        return F.add(other, self)

    def __sub__(self, other):
        return F.subtract(self, other)

    def __rsub__(self, other):
        return F.subtract(other, self)

    def __mul__(self, other):
        return F.multiply(self, other)

    def __rmul__(self, other):
        return F.multiply(other, self)

    def __truediv__(self, other):
        return F.divide(self, other)

    def __rtruediv__(self, other):
        return F.divide(other, self)

    def __pow__(self, other):
        return F.power(self, other)

    def __rpow__(self, other):
        return F.power(other, self)

    def __matmul__(self, other):
        return F.matmul(self, other)

    def __rmatmul__(self, other):
        return F.matmul(other, self)

    def __floordiv__(self, other):
        raise unsupported_operator("//")

    def __mod__(self, other):
        raise unsupported_operator("%")

    def __divmod__(self, other):
        raise unsupported_operator("divmod")

    def __lshift__(self, other):
        raise unsupported_operator("<<")

    def __rshift__(self, other):
        raise unsupported_operator(">>")

    __rfloordiv__, __rmod__, __rdivmod__ = __floordiv__, __mod__, __divmod__
    __rlshift__, __rrshift__ = __lshift__, __rshift__

    def __neg__(self):
        return F.negative(self)

    def __pos__(self):
        return self

    def __abs__(self):
        return F.absolute(self)

    def __invert__(self):
        return F.logical_not(self)

    def __and__(self, other):
        return E.logical_and(self, other)

    def __rand__(self, other):
        return E.logical_and(other, self)

    def __or__(self, other):
        return E.logical_or(self, other)

    def __ror__(self, other):
        return E.logical_or(other, self)

    def __xor__(self, other):
        return E.logical_xor(self, other)

    def __rxor__(self, other):
        return E.logical_xor(other, self)

    def __getitem__(self, key):
        return S.getitem(self, key)

    def __lt__(self, other):
        return F.less(self, other)

    def __le__(self, other):
        return F.less_equal(self, other)

    def __gt__(self, other):
        return F.greater(self, other)

    def __ge__(self, other):
        return F.greater_equal(self, other)

    def __eq__(self, other):
        return F.equal(self, other)  # type: ignore[override]

    def __ne__(self, other):
        return F.not_equal(self, other)  # type: ignore[override]

    # -- methods (NumPy names) -----------------------------------------------
    def abs(self) -> Tensor:
        return F.absolute(self)

    def exp(self) -> Tensor:
        return F.exp(self)

    def log(self) -> Tensor:
        return F.log(self)

    def sqrt(self) -> Tensor:
        return F.sqrt(self)

    def rsqrt(self) -> Tensor:
        return F.rsqrt(self)

    def tanh(self) -> Tensor:
        return F.tanh(self)

    def sigmoid(self) -> Tensor:
        return F.sigmoid(self)

    def relu(self) -> Tensor:
        return F.relu(self)

    def gelu(self, approximate: str = "tanh") -> Tensor:
        return E.gelu(self, approximate)

    def sum(self, axis=None, keepdims: bool = False) -> Tensor:
        return F.sum(self, axis, keepdims)

    def max(self, axis=None, keepdims: bool = False) -> Tensor:
        return F.max(self, axis, keepdims)

    def min(self, axis=None, keepdims: bool = False) -> Tensor:
        return F.min(self, axis, keepdims)

    def mean(self, axis=None, keepdims: bool = False) -> Tensor:
        return F.mean(self, axis, keepdims)

    def transpose(self, *axes) -> Tensor:
        return F.transpose(self, _varargs(axes))

    @property
    def T(self) -> Tensor:
        return F.transpose(self)

    def reshape(self, *shape) -> Tensor:
        return F.reshape(self, _varargs(shape))

    def astype(self, dtype: Any) -> Tensor:
        return F.cast(self, dtype)

    # -- what a kernel cannot do -------------------------------------------------
    def __bool__(self) -> bool:
        raise TraceError(
            "data-dependent control flow is not supported: use kiln.where",
            hint="a tensor's truth value is not known while tracing (if/while/and/or/not)",
        )

    def _no_value(self, *_: Any) -> Any:
        raise TraceError(
            "a tensor cannot become a Python number: its value is not known while tracing",
            hint="keep computing with tensor ops; use kiln.where for choices",
        )

    __int__ = __float__ = __index__ = __complex__ = _no_value

    def _no_indexing(self, *_: Any) -> Any:
        raise TraceError(
            "item assignment, iteration and 'in' are not supported on tensors",
            hint="tensors are values: build a new one (kiln.where, kiln.concatenate, x[1:5])",
        )

    __setitem__ = __iter__ = __contains__ = _no_indexing

    def __array__(self, *_: Any, **__: Any) -> Any:
        raise TraceError(
            "a kiln Tensor cannot be converted to a numpy array inside a kernel",
            hint="use kiln ops (kiln.exp, x.sum(), ...) instead of numpy functions",
        )

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return interop.numpy_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return interop.numpy_function(func, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in Tensor.__slots__:
            raise AttributeError(name)
        members = {n: getattr(Tensor, n) for n in dir(Tensor) if not n.startswith("_")}
        # what a kernel may use: its ops, and the properties that describe a tensor
        # (numpy() and is_traced are eager-mode helpers; ``type`` is the slot behind them)
        methods = sorted(n for n, v in members.items() if callable(v) and n != "numpy")
        properties = sorted(
            n for n, v in members.items() if isinstance(v, property) and n != "is_traced"
        )
        close = difflib.get_close_matches(name, methods + properties, n=3)
        raise UnsupportedAttributeError(
            f"Tensor has no attribute {name!r}: it is not a kiln op",
            hint=("did you mean " + " or ".join(close) + "?") if close else None,
            notes=[
                "supported methods: " + ", ".join(methods),
                "attributes: " + ", ".join(properties),
                DOCS_NOTE,
            ],
        )


def _varargs(values: tuple) -> Any:
    """``x.reshape(2, 3)`` and ``x.reshape((2, 3))`` mean the same; no args means None."""
    if not values:
        return None
    if len(values) == 1 and (values[0] is None or isinstance(values[0], (tuple, list))):
        return values[0]
    return values


from kiln.lang import elementwise as E  # noqa: E402
from kiln.lang import functions as F  # noqa: E402
from kiln.lang import interop  # noqa: E402
from kiln.lang import shapes as S  # noqa: E402
