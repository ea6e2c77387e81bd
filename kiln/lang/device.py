"""``@device``: mark a kernel. Calling it with numpy arrays runs it eagerly (the oracle).

The eager call and the tracer share everything but the tensors they pass
in (see :mod:`kiln.lang.tensor`). A :func:`dispatching` handler, when
active, receives calls made with numpy arrays instead, so an app can run
its kernels on a compiled target without changing a line.
"""

from __future__ import annotations

import ast
import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np

from kiln.errors import KilnError, TraceError
from kiln.ir.graph import TensorType
from kiln.ir.interp import NUMPY_DTYPES
from kiln.lang import dtypes
from kiln.lang.errors import (
    def_location,
    frame_location,
    located,
    param_location,
    return_location,
)
from kiln.lang.tensor import Tensor, TensorSpec, tensor_spec, tracing

Handler = Callable[["DeviceFunction", tuple, dict], Any]
_HANDLER: ContextVar[Handler | None] = ContextVar("kiln_dispatch", default=None)
I32_MIN, I32_MAX = -(2**31), 2**31 - 1


@contextmanager
def dispatching(handler: Handler | None) -> Iterator[Handler | None]:
    """While active, ``kernel(*arrays)`` returns ``handler(kernel, args, kwargs)``.

    The handler itself runs with dispatch switched off, so it may call the
    kernel to get the eager (cpu) result. Calls with kiln Tensors (one
    kernel calling another) are always inlined, never dispatched.
    """
    token = _HANDLER.set(handler)
    try:
        yield handler
    finally:
        _HANDLER.reset(token)


class DeviceFunction:
    """A ``@device`` kernel: the Python function plus its parameters' dims."""

    def __init__(self, fn: Callable) -> None:
        if not inspect.isfunction(fn):
            raise TypeError(f"@device decorates a function, got {type(fn).__name__}")
        functools.update_wrapper(self, fn)
        self.fn = fn

    def __repr__(self) -> str:
        return f"<device function {self.__module__}.{self.__qualname__}>"

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self  # a kernel stored on a class stays a plain kernel (no bound self)

    @functools.cached_property
    def signature(self) -> inspect.Signature:
        return inspect.signature(self.fn)

    @functools.cached_property
    def params(self) -> tuple[tuple[str, tuple[str | int, ...]], ...]:
        """(argument name, dims) in order; every argument needs a ``Tensor[...]`` annotation."""
        raw = getattr(self.fn, "__annotations__", {})
        out = []
        for p in self.signature.parameters.values():
            if p.kind is p.KEYWORD_ONLY:  # runners and the test inputs pass arguments by position
                raise TraceError(
                    f"argument {p.name!r} of kernel {self.__name__!r} is keyword-only: "
                    "kernel arguments must be positional",
                    location=param_location(self.fn, p.name),
                    expected=f"def {self.__name__}(..., {p.name}: Tensor[...])",
                    found=f"def {self.__name__}(..., *, {p.name}: ...)",
                    hint="remove the `*` (or `*args`) before it in the signature",
                )
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                star = "*" if p.kind is p.VAR_POSITIONAL else "**"
                raise TraceError(
                    f"argument {p.name!r} of kernel {self.__name__!r} is *args/**kwargs: "
                    "kernels take named tensors",
                    location=param_location(self.fn, p.name),
                    expected=f"one named argument per tensor: "
                    f"def {self.__name__}(x: Tensor[...], y: Tensor[...])",
                    found=f"{star}{p.name}",
                    hint="targets pass a kernel's inputs by position, one per named argument",
                )
            spec = _annotation_spec(self.fn, raw.get(p.name))
            if not isinstance(spec, TensorSpec):
                raise TraceError(
                    f"argument {p.name!r} of kernel {self.__name__!r} needs dims",
                    location=param_location(self.fn, p.name),
                    expected='an annotation like Tensor["M", "K"] (Tensor[()] for a scalar)',
                    found="no annotation" if spec is None else repr(spec),
                )
            out.append((p.name, spec.dims))
        return tuple(out)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _any_tensor(args, kwargs):
            return self._inline(args, kwargs)
        handler = _HANDLER.get()
        if handler is not None:
            token = _HANDLER.set(None)
            try:
                return handler(self, args, kwargs)
            finally:
                _HANDLER.reset(token)
        return self.eager(*args, **kwargs)

    def eager(self, *args: Any, **kwargs: Any) -> Any:
        """Run on the host with numpy (the ``cpu`` target), ignoring any dispatch handler."""
        try:
            bound = self._bind(args, kwargs)
            for name, value in bound.arguments.items():
                bound.arguments[name] = _eager_tensor(self, name, value)
            check_dims(self, {n: t.shape for n, t in bound.arguments.items()})
        except TraceError as exc:
            raise located(exc, def_location(self.fn)) from None
        with tracing(None):
            result = invoke(self, bound.args, bound.kwargs, wrap_errors=False)
        arrays = tuple(t.numpy() for t in outputs(self, result))
        return arrays if isinstance(result, (tuple, list)) else arrays[0]

    def _inline(self, args: tuple, kwargs: dict) -> Any:
        """One kernel calling another with tensors: run the body in place."""
        bound = self._bind(args, kwargs)
        shapes = {  # a Python number is a scalar: fine for Tensor[()], a rank error otherwise
            n: v.shape if isinstance(v, Tensor) else ()
            for n, v in bound.arguments.items()
            if isinstance(v, Tensor) or dtypes.scalar_kind(v) is not None
        }
        try:
            check_dims(self, shapes)
        except TraceError as exc:  # the call passed the wrong shapes: point at the call
            where = exc.location
            exc.location = None  # filled in from the traceback: the caller's line
            if where is not None:
                exc.notes.append(f"{self.__name__!r} declares its arguments at {where.header()}")
            raise
        return self.fn(*bound.args, **bound.kwargs)

    def _bind(self, args: tuple, kwargs: dict) -> inspect.BoundArguments:
        try:
            return self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            names = ", ".join(self.signature.parameters)
            raise TraceError(
                f"kernel {self.__name__!r} takes ({names}): {exc}",
                expected=f"{len(self.signature.parameters)} arguments ({names})",
                found=f"{len(args) + len(kwargs)} arguments",
            ) from None


def _annotation_spec(fn: Callable, raw: Any) -> Any:
    """The annotation's value; a string one (``from __future__ import annotations``) is
    evaluated in the kernel's module, else read as ``Tensor[...]`` syntax when it has that form."""
    if not isinstance(raw, str):
        return raw
    try:
        return eval(raw, fn.__globals__)  # what typing.get_type_hints does, per argument
    except Exception:
        pass
    try:
        node = ast.parse(raw, mode="eval").body
    except SyntaxError:
        return raw
    base = node.value if isinstance(node, ast.Subscript) else None
    name = getattr(base, "id", None) or getattr(base, "attr", None)
    if name != "Tensor":
        return raw
    items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    if not all(isinstance(i, ast.Constant) for i in items):
        return raw
    try:
        return tensor_spec(tuple(i.value for i in items))
    except TypeError:
        return raw


def device(fn: Callable) -> DeviceFunction:
    """Mark ``fn`` as a kernel: eager on numpy arrays, traceable by the pipeline."""
    return DeviceFunction(fn)


# ``kiln.lang.device`` is this decorator once the package re-exports it (the attribute
# shadows the submodule), so the decorator carries the module's public names too.
device.dispatching = dispatching  # type: ignore[attr-defined]
device.DeviceFunction = DeviceFunction  # type: ignore[attr-defined]


def _any_tensor(args: tuple, kwargs: dict) -> bool:
    return any(isinstance(v, Tensor) for v in (*args, *kwargs.values()))


def _eager_tensor(kernel: DeviceFunction, name: str, value: Any) -> Tensor:
    """Wrap an eager argument; float64/int64 (numpy's defaults) become f32/i32."""
    kind = dtypes.scalar_kind(value)
    if isinstance(value, np.generic):
        value = np.asarray(value)
    elif kind is not None:  # a Python number: f32, i32 or bool, like a weak scalar alone
        if kind == "int" and not I32_MIN <= value <= I32_MAX:
            raise _not_i32(kernel, name, value)
        value = np.asarray(value, dtype=NUMPY_DTYPES[dtypes.SCALAR_DEFAULT[kind]])
    if not isinstance(value, np.ndarray):
        raise TraceError(
            f"argument {name!r} of kernel {kernel.__name__!r} must be a numpy array or a "
            f"number, got {type(value).__name__}"
        )
    dtype = dtypes.eager_input_dtype(value.dtype)
    if dtype is None:
        raise TraceError(
            f"argument {name!r} of kernel {kernel.__name__!r} has unsupported dtype {value.dtype}",
            expected="float32, float16, bfloat16, int32 (or float64/int64, converted)",
            found=str(value.dtype),
        )
    if value.size == 0:
        raise TraceError(
            f"argument {name!r} of kernel {kernel.__name__!r} is empty (shape {value.shape}): "
            "a kernel's tensors are never empty",
            expected="at least one element (every dim >= 1)",
            found=f"shape {value.shape}",
        )
    if dtype == "i32" and value.dtype != np.int32:  # int64: never wrapped modulo 2**32
        outside = (value < I32_MIN) | (value > I32_MAX)
        if outside.any():
            index = tuple(int(i) for i in np.argwhere(outside)[0])
            raise _not_i32(kernel, name, int(value[index]), index)
    array = np.asarray(value, dtype=NUMPY_DTYPES[dtype], order="C")  # keeps 0-d arrays 0-d
    return Tensor._eager(array, TensorType(tuple(int(d) for d in array.shape), dtype))


def _not_i32(kernel: DeviceFunction, name: str, bad: int, index: tuple = ()) -> TraceError:
    """The error for an int argument outside i32, as for a constant (``constant 2**40 ...``)."""
    at = f" at index {index}" if index else ""
    return TraceError(
        f"argument {name!r} of kernel {kernel.__name__!r}: {bad}{at} does not fit in i32",
        expected=f"ints from {I32_MIN} to {I32_MAX} (int64 arrays become i32)",
        found=str(bad),
    )


def check_dims(kernel: DeviceFunction, shapes: dict[str, tuple[int, ...]]) -> None:
    """Shapes must match the annotations, and each dim name must mean one size."""
    seen: dict[str, tuple[int, str]] = {}
    for name, dims in kernel.params:
        if name not in shapes:
            continue
        shape = shapes[name]
        spec = TensorSpec(dims)
        if len(shape) != len(dims):
            raise TraceError(
                f"argument {name!r} of kernel {kernel.__name__!r} should have rank {len(dims)} "
                f"({spec!r}), got shape {shape}",
                location=param_location(kernel.fn, name),
            )
        for dim, size in zip(dims, shape, strict=True):
            if isinstance(dim, int) and dim != size:
                raise TraceError(
                    f"argument {name!r} should have shape {spec!r}, got {shape}",
                    location=param_location(kernel.fn, name),
                )
            if isinstance(dim, str):
                first = seen.setdefault(dim, (size, name))
                if first[0] != size:
                    raise TraceError(
                        f"dim {dim!r} is {first[0]} in argument {first[1]!r} but {size} "
                        f"in argument {name!r}",
                        location=param_location(kernel.fn, name),
                    )


def invoke(kernel: DeviceFunction, args: tuple, kwargs: dict, *, wrap_errors: bool) -> Any:
    """Call the kernel body; point Kiln errors (and with ``wrap_errors``, any error) at the
    user's line."""
    try:
        return kernel.fn(*args, **kwargs)
    except KilnError as exc:
        if exc.location is None:
            exc.location = frame_location(exc.__traceback__) or def_location(kernel.fn)
        raise
    except Exception as exc:
        if not wrap_errors:
            raise
        raise TraceError(
            f"{type(exc).__name__}: {exc}",
            location=frame_location(exc.__traceback__) or def_location(kernel.fn),
            notes=[f"raised by the kernel's own code while tracing {kernel.__name__!r}"],
        ) from exc
    except SystemExit as exc:  # would end the whole build or test run, often with status 0
        doing = "while tracing" if wrap_errors else "while running on the host"
        raise TraceError(
            f"kernel {kernel.__name__!r} called sys.exit({exc.code!r}) {doing}",
            location=frame_location(exc.__traceback__) or def_location(kernel.fn),
            hint="a kernel must not exit; raise an exception to report a problem",
        ) from None


def outputs(kernel: DeviceFunction, result: Any) -> list[Tensor]:
    """A kernel returns a Tensor or a tuple/list of them."""
    if inspect.isgenerator(result) or inspect.iscoroutine(result):
        result.close()  # never started: no "was never awaited" warning either
        kind = "a generator (it uses `yield`)" if inspect.isgenerator(result) else "async"
        raise TraceError(
            f"kernel {kernel.__name__!r} is {kind}: a kernel returns its tensors",
            location=def_location(kernel.fn),
            expected="a plain `def` that returns a Tensor or a tuple of Tensors",
            found="a generator" if inspect.isgenerator(result) else "a coroutine",
            hint="write `return x` instead of `yield x`"
            if inspect.isgenerator(result)
            else "write `def`, not `async def`",
        )
    if result is None:
        raise TraceError(
            f"kernel {kernel.__name__!r} returned nothing",
            location=return_location(kernel.fn),
            hint="return the result tensor (or a tuple of tensors)",
        )
    several = isinstance(result, (tuple, list))
    items = list(result) if several else [result]
    for index, item in enumerate(items):
        if not isinstance(item, Tensor):
            what = _a(type(item).__name__)
            nested = several and isinstance(item, (tuple, list))
            raise TraceError(
                f"output {index} of kernel {kernel.__name__!r} is {what}, not a Tensor"
                if several
                else f"kernel {kernel.__name__!r} returned {what}, not a Tensor",
                location=return_location(kernel.fn),
                expected="a Tensor or a flat tuple of Tensors",
                found=f"output {index}: {_described(item)}" if several else _described(item),
                hint="return a flat tuple of Tensors: return a, b, c" if nested else None,
            )
    if not items:
        raise TraceError(
            f"kernel {kernel.__name__!r} returned an empty tuple",
            location=return_location(kernel.fn),
        )
    return items


def _described(value: Any) -> str:
    """A short repr, without the memory address that differs on every run."""
    text = repr(value)
    if len(text) >= 60 or " at 0x" in text:
        return _a(type(value).__name__)
    return text


def _a(name: str) -> str:
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"
