"""Stage 0: a @device function and a shape set -> the traced graph (``graph.json``).

The input is a :class:`TraceRequest` naming the kernel by module and
function, so the stage can run in any process; errors in the kernel
module (syntax, imports) and in the kernel body come back as TraceErrors
pointing at the kernel's own file and line.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from kiln.errors import ArtifactError, Location, TraceError, VerifyError
from kiln.fsutil import write_bytes_atomic
from kiln.ir.graph import Graph
from kiln.ir.graph_verify import verify_graph
from kiln.lang.device import DeviceFunction
from kiln.lang.errors import def_location, frame_location, source_line
from kiln.lang.tracer import trace_with_lines

NAME = "trace"
INPUT = "kernel source"  # the first stage: it reads the @device function, checked at load
ARTIFACT = "graph.json"
# what the compiler driver may call beyond run/verify/serialize/read (kiln/driver.py)
CAPABILITIES = frozenset({"side_artifacts", "decode", "exact_round_trip"})
# Where each node came from, beside graph.json and never inside it: a comment
# edit rewrites this file while graph.json keeps its bytes (early cutoff).
SOURCE_MAP = "graph.srcmap.json"


@dataclass(frozen=True)
class Options:
    """The trace stage takes no options."""


@dataclass(frozen=True)
class TraceRequest:
    """Which kernel to trace, at which sizes and dtypes.

    ``dtypes`` maps argument names to dtypes; arguments not named there get
    ``default_dtype`` (an empty string means "no default").
    """

    module: str
    function: str
    bindings: tuple[tuple[str, int], ...]
    dtypes: tuple[tuple[str, str], ...] = ()
    default_dtype: str = "f32"


def run(request: TraceRequest, options: Options, machine: dict | None) -> Graph:
    """Import the kernel's module, find the @device function and trace it."""
    return run_with_side_artifacts(request, options, machine)[0]


def run_with_side_artifacts(
    request: TraceRequest, options: Options, machine: dict | None
) -> tuple[Graph, dict[str, bytes]]:
    """``run``, plus the source map (``SOURCE_MAP``): node id -> line of the kernel's file."""
    module = load_module(request.module)
    fn = _find(module, request)
    dtypes = dict(request.dtypes)
    if request.default_dtype:
        dtypes.setdefault("*", request.default_dtype)
    graph, lines = trace_with_lines(fn, dict(request.bindings), dtypes)
    return graph, {SOURCE_MAP: source_map(fn, lines)}


def source_map(fn: DeviceFunction, lines: dict[int, int]) -> bytes:
    """The kernel's source text (as traced) and the line that made each node, as JSON."""
    try:
        source, first = inspect.getsourcelines(fn.fn)
        path = inspect.getsourcefile(fn.fn) or ""
    except (OSError, TypeError):
        source, first, path = [], 0, ""
    doc = {
        # relative to the import root (kernels/linalg.py): the same bytes in any checkout
        "file": _import_relative(path, getattr(fn.fn, "__module__", "") or ""),
        "function": fn.__name__,
        "first_line": first,
        "source": [line.rstrip("\r\n") for line in source],
        "nodes": {str(node): line for node, line in sorted(lines.items())},
    }
    return json.dumps(doc, sort_keys=True, indent=1).encode()


def _import_relative(path: str, module: str) -> str:
    """``path`` of ``module`` as it sits under its sys.path entry, else its base name."""
    if not path:
        return ""
    parts = module.split(".") if module else []
    tail = os.path.join(*parts) if parts else ""
    for candidate in (tail + ".py", os.path.join(tail, "__init__.py")):
        if parts and path.replace(os.sep, "/").endswith("/" + candidate.replace(os.sep, "/")):
            return candidate.replace(os.sep, "/")
    return os.path.basename(path)


# decode(serialize(ir)) gives the next stage an IR it cannot tell from ``ir``: a chain on
# a Dask worker hands ``ir`` on as it is (tasks/execution/chain_worker.py)
EXACT_ROUND_TRIP = True


def serialize(graph: Graph) -> bytes:
    return graph.to_json()


def decode(data: bytes) -> Graph:
    """The graph held by ``graph.json``'s bytes, checked: ``read`` without the file."""
    graph = Graph.from_json(data)
    verify_graph(graph)
    return graph


def read(path: str | os.PathLike) -> Graph:
    """Load ``graph.json``; a missing, corrupt or invalid file is an ArtifactError naming it."""
    where = Location(str(path))
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ArtifactError(f"cannot read graph artifact: {exc.strerror or exc}", where) from None
    try:
        graph = decode(raw)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise ArtifactError(
            f"corrupt graph artifact: {type(exc).__name__}: {exc}",
            where,
            hint="delete the file and rebuild (the trace stage rewrites it)",
        ) from None
    return graph


def verify(graph: Graph, machine: dict | None) -> None:
    """``Graph.verify`` as a VerifyError that names this stage."""
    try:
        verify_graph(graph)
    except ValueError as exc:
        raise VerifyError(
            f"stage {NAME!r} produced an invalid graph: {exc}", notes=[f"graph {graph.name!r}"]
        ) from None


def _dump_dfg(graph: Graph, path: str | os.PathLike, machine: dict | None) -> None:
    write_bytes_atomic(path, graph.to_json())


DUMPS = {"dfg": _dump_dfg}


# -- finding the kernel ----------------------------------------------------------
_STAMPS: dict[str, tuple[int, int]] = {}
# Python lists a module in sys.modules before its body has run: a second
# thread (doit's thread runner, or chains a Dask build takes back to run
# locally) must wait for the import rather than read the half-run module.
_IMPORTING = threading.RLock()


def _stamp(path: str | None) -> tuple[int, int] | None:
    try:
        st = os.stat(path or "")
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def _source_path(name: str) -> str | None:
    """The file ``name`` would be imported from (imports its parent packages)."""
    spec = importlib.util.find_spec(name)
    return spec.origin if spec is not None else None


def load_module(name: str) -> ModuleType:
    """Import ``name``; re-import it when its file changed since this process loaded it."""
    with _IMPORTING:
        return _load_module(name)


def _load_module(name: str) -> ModuleType:
    # The stamp is taken before the import reads the file: a save landing while the
    # module runs leaves a newer file than the stamp, so the next trace re-imports it.
    # (Taken after, it matched the saved file and the old code stayed for good.)
    stamp = None
    try:
        module = sys.modules.get(name)
        if module is None:
            importlib.invalidate_caches()
            stamp = _stamp(_source_path(name))
            module = importlib.import_module(name)
        else:
            stamp = _stamp(module.__file__)
            if name in _STAMPS and stamp != _STAMPS[name]:
                module = importlib.reload(module)
    except SyntaxError as exc:
        line = exc.lineno
        raise TraceError(
            f"syntax error in kernel module {name!r}: {exc.msg}",
            Location(
                exc.filename or name,
                line,
                exc.offset,
                source=(source_line(exc.filename, line) if exc.filename and line else None)
                or (exc.text or "").rstrip("\n")
                or None,
            ),
        ) from None
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise TraceError(
                f"kernel module {name!r} not found",
                hint="is the project root on sys.path and the package listed in `packages:`?",
            ) from None
        raise _import_failed(name, exc) from None
    except Exception as exc:
        raise _import_failed(name, exc) from None
    except SystemExit as exc:  # sys.exit() at import must not end the build, least of all with 0
        raise TraceError(
            f"importing kernel module {name!r} called sys.exit({exc.code!r})",
            frame_location(exc.__traceback__.tb_next if exc.__traceback__ else None),
            hint="a kernel module must not exit when imported; "
            "guard script code with `if __name__ == '__main__':`",
        ) from None
    if stamp is not None:
        _STAMPS[name] = stamp
    return module


def _import_failed(name: str, exc: Exception) -> TraceError:
    tb = exc.__traceback__.tb_next if exc.__traceback__ else None  # skip this module's frame
    message = f"importing kernel module {name!r} failed: {type(exc).__name__}: {exc}"
    # one cause for every kernel of the module, whatever names its source line holds
    return TraceError(message, frame_location(tb), cause=message)


def _find(module: ModuleType, request: TraceRequest) -> DeviceFunction:
    fn = getattr(module, request.function, None)
    if isinstance(fn, DeviceFunction):
        return fn
    kernels = sorted(k for k, v in vars(module).items() if isinstance(v, DeviceFunction))
    if fn is None:
        raise TraceError(
            f"module {request.module!r} has no kernel {request.function!r}",
            Location(getattr(module, "__file__", None) or request.module),
            expected="one of its @device functions: " + (", ".join(kernels) or "(none)"),
            found=request.function,
        )
    where = def_location(fn) if inspect.isfunction(fn) else Location(module.__file__ or "")
    raise TraceError(
        f"{request.module}.{request.function} is not a @device function",
        where,
        hint="decorate it with @kiln.device",
    )
