"""``trace``: run a @device function on symbolic tensors and record the graph.

The result depends only on the kernel's code, the bindings and the dtypes:
node ids are creation order (dead nodes dropped), attributes are sorted,
and no source positions are recorded in the graph, so a comment edit leaves
``graph.to_json()`` byte-identical (``trace_with_lines`` returns the
positions beside it, for the trace stage's side artifact).
"""

from __future__ import annotations

from collections.abc import Mapping

from kiln.errors import TraceError, VerifyError
from kiln.ir.graph import Graph, TensorType, make_attrs
from kiln.ir.graph_verify import verify_graph
from kiln.lang import dtypes as dt
from kiln.lang.device import DeviceFunction, invoke, outputs
from kiln.lang.errors import param_location, return_location
from kiln.lang.tensor import Builder, Tensor, tracing

DEFAULT_KEYS = ("*", "default")


def trace(
    fn: DeviceFunction, bindings: Mapping[str, int], dtypes: Mapping[str, str] | str = "f32"
) -> Graph:
    """The graph of ``fn``; see :func:`trace_with_lines`."""
    return trace_with_lines(fn, bindings, dtypes, record_lines=False)[0]


def trace_with_lines(
    fn: DeviceFunction,
    bindings: Mapping[str, int],
    dtypes: Mapping[str, str] | str = "f32",
    record_lines: bool = True,
) -> tuple[Graph, dict[int, int]]:
    """The graph of ``fn`` with its symbolic dims bound to sizes and its arguments typed.

    ``dtypes`` is one dtype for every argument, or a map from argument name
    to dtype where ``"*"`` (or ``"default"``) covers the rest.
    """
    if not isinstance(fn, DeviceFunction):
        raise TraceError(
            f"{getattr(fn, '__name__', repr(fn))!r} is not a @device function",
            hint="decorate it with @kiln.device",
        )
    params = fn.params
    sizes = _check_bindings(bindings)
    types = _arg_dtypes(fn, [name for name, _ in params], dtypes)

    code = getattr(fn.fn, "__code__", None)
    source_file = code.co_filename if record_lines and code is not None else None
    builder = Builder(source_file)
    positional: list[Tensor] = []
    for index, (name, dims) in enumerate(params):
        shape = tuple(_size(fn, name, dim, sizes) for dim in dims)
        type_ = TensorType(shape, types[name])
        tensor = Tensor._traced(
            builder, builder.add("arg", (), make_attrs(name=name, index=index), type_), type_
        )
        positional.append(tensor)  # DeviceFunction.params admits positional parameters only

    with tracing(builder):
        result = invoke(fn, tuple(positional), {}, wrap_errors=True)
    outs = outputs(fn, result)
    if any(t._builder is not builder for t in outs):
        raise TraceError(
            f"kernel {fn.__name__!r} returned a tensor that was not computed from its arguments",
            location=return_location(fn.fn),
        )
    nodes, new_id = builder.nodes([t._node for t in outs])
    graph = Graph(
        name=fn.__name__,
        nodes=nodes,
        outputs=tuple(new_id[t._node] for t in outs),
        bindings=tuple(sorted(sizes.items())),
    )
    try:
        verify_graph(graph)
    except ValueError as exc:  # a Kiln bug, not the user's: say so
        raise VerifyError(
            f"stage 'trace' built an invalid graph for {fn.__name__!r}: {exc}"
        ) from exc
    # node id -> line of the kernel's file that created it (the report's source map)
    lines = {new_id[i]: line for i, line in builder.lines.items() if i in new_id}
    return graph, lines


def _check_bindings(bindings: Mapping[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, size in bindings.items():
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise TraceError(
                f"binding {name}={size!r} is not a positive integer",
                expected="a size >= 1",
                found=repr(size),
            )
        out[str(name)] = int(size)
    return out


def _size(fn: DeviceFunction, arg: str, dim: str | int, sizes: dict[str, int]) -> int:
    if isinstance(dim, int):
        return dim
    if dim not in sizes:
        bound = ", ".join(f"{k}={v}" for k, v in sorted(sizes.items())) or "none"
        raise TraceError(
            f"dim {dim!r} of argument {arg!r} is not bound",
            location=param_location(fn.fn, arg),
            expected=f"a size for {dim!r} in the shape set",
            found=f"bindings: {bound}",
            hint=f"add {dim}: <size> to the kernel's shapes in pipeline.yaml",
        )
    return sizes[dim]


def _arg_dtypes(
    fn: DeviceFunction, names: list[str], spec: Mapping[str, str] | str
) -> dict[str, str]:
    if isinstance(spec, str):
        one = dt.normalize(spec)
        return {name: one for name in names}
    default = next((spec[k] for k in DEFAULT_KEYS if k in spec), None)
    unknown = sorted(k for k in spec if k not in names and k not in DEFAULT_KEYS)
    if unknown:
        raise TraceError(
            f"dtypes name {', '.join(map(repr, unknown))}, not an argument of {fn.__name__!r}",
            expected="argument names: " + ", ".join(names) + " (or '*' for the rest)",
            found=", ".join(unknown),
        )
    out = {}
    for name in names:
        value = spec.get(name, default)
        if value is None:
            raise TraceError(
                f"no dtype for argument {name!r} of kernel {fn.__name__!r}",
                hint="give a dtype for every argument, or a default under '*'",
            )
        out[name] = dt.normalize(value)
    return out
