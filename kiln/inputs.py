"""Kernel inputs: seeded arrays, drawn per argument as pipeline.yaml's `inputs:` asks.

One implementation for `kiln test`, `kiln run`, `kiln bench`, the tuner and
the benchmarks: every target of a kernel instance sees exactly the same
arrays. An argument without an input spec gets the defaults: floats uniform
in [-1, 1), i32 in [-8, 8] (small enough that sums and products stay exact
in i32). A spec is a one-key mapping, the distribution and its parameters,
written in pipeline.yaml under ``kernels.<name>.inputs`` (or a shape set's
``inputs``)::

    logits: {normal: {mean: 0, std: 1}}
    labels: {integers: {low: 0, high: 1000}}     # high excluded, as numpy's
    scale:  {positive: {}}                       # uniform in [0.5, 2)
    bias:   {constant: 0.25}
    table:  {npy: data/table.npy}                # a file of the project

The checks of a spec live here too (``spec_problem`` for what the file alone
decides, ``argument_problem`` for what needs the argument's dtype and
shape), so the pipeline loader and every command report the same errors.
numpy is imported only when arrays are made or a ``.npy`` file is read.
"""

from __future__ import annotations

import hashlib
import math
import os
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
FLOAT_DTYPES = ("f32", "f16", "bf16")
# The largest finite value of each float dtype: a parameter beyond it would draw inf.
FLOAT_MAX = {"f32": 3.4028234663852886e38, "f16": 65504.0, "bf16": 3.3895313892515355e38}
INT_DTYPES = ("i32", "bool")


@dataclass(frozen=True)
class Distribution:
    """One kind of input: its parameters (with defaults) and how to draw it.

    ``draw(rng, shape, params)`` returns float64 or int64 values; they are
    cast to the argument's dtype afterwards. ``value`` kinds take one scalar
    (``constant: 0.25``, ``npy: path``) instead of a parameter mapping.
    """

    name: str
    params: dict[str, Any]  # name -> default (REQUIRED: must be written)
    floats_only: bool
    doc: str
    draw: Callable[[Any, tuple[int, ...], dict[str, Any]], Any] | None = None
    value: bool = False


REQUIRED = object()


def _uniform(rng, shape, p):
    return rng.uniform(p["low"], p["high"], size=shape)


def _normal(rng, shape, p):
    return rng.normal(p["mean"], p["std"], size=shape)


def _integers(rng, shape, p):
    # int32 when it fits: the default i32 inputs draw exactly what they always drew
    fits = INT32[0] <= p["low"] and p["high"] - 1 <= INT32[1]
    return rng.integers(p["low"], p["high"], size=shape, dtype="int32" if fits else "int64")


def _constant(rng, shape, p):
    import numpy as np

    return np.full(shape, p["value"])


# The table of input kinds: adding one is adding a row (and its schema entry).
DISTRIBUTIONS: dict[str, Distribution] = {
    d.name: d
    for d in (
        Distribution(
            "uniform", {"low": -1.0, "high": 1.0}, True, "floats uniform in [low, high)", _uniform
        ),
        Distribution(
            "normal", {"mean": 0.0, "std": 1.0}, True, "floats, normal(mean, std)", _normal
        ),
        Distribution(
            "integers",
            {"low": REQUIRED, "high": REQUIRED},
            False,
            "whole numbers in [low, high): high is excluded, as in numpy",
            _integers,
        ),
        Distribution(
            "positive",
            {"low": 0.5, "high": 2.0},
            True,
            "floats uniform in [low, high), low > 0",
            _uniform,
        ),  # fmt: skip
        Distribution("constant", {}, False, "every element this number", _constant, value=True),
        Distribution("npy", {}, False, "the array in this .npy file of the project", value=True),
    )
}
DEFAULTS = {
    "float": {"uniform": {"low": -1.0, "high": 1.0}},
    "i32": {"integers": {"low": -8, "high": 9}},
}


@dataclass(frozen=True)
class InputProblem:
    """What is wrong with one argument's input spec; ``key`` is below the argument's entry."""

    message: str
    key: str = ""  # "integers.high", "" for the entry itself
    expected: str | None = None
    found: str | None = None
    hint: str | None = None


def parse(spec: Mapping[str, Any]) -> tuple[Distribution, dict[str, Any]]:
    """(distribution, parameters with defaults filled in) of a spec the schema accepted."""
    ((kind, given),) = spec.items()
    dist = DISTRIBUTIONS[kind]
    if dist.value:
        return dist, {"value": given}
    params = {k: v for k, v in dist.params.items()}
    params.update(given or {})
    return dist, params


def spec_problem(spec: Mapping[str, Any]) -> InputProblem | None:
    """What the schema cannot say about a spec: a range that holds no value, a bad path."""
    dist, params = parse(spec)
    name = dist.name
    if dist.value:
        value = params["value"]
        if name == "constant" and not math.isfinite(value):
            return InputProblem(
                "a constant input must be a finite number", name, "a finite number", str(value)
            )
        if name == "npy":
            path = Path(value)
            if path.is_absolute() or ".." in path.parts:
                return InputProblem(
                    "an npy input names a file outside the project",
                    name,
                    "a path relative to the project root, such as data/labels.npy",
                    repr(value),
                    "put the file in the project, so that a clean checkout has it too",
                )
        return None
    missing = [k for k, v in params.items() if v is REQUIRED]
    if missing:  # the schema requires them; a hand-made spec may not
        return InputProblem(f"{name} needs {' and '.join(missing)}", name, ", ".join(missing))
    for key, value in params.items():
        if not math.isfinite(value):
            return InputProblem(
                f"{name}.{key} must be a finite number", f"{name}.{key}", found=str(value)
            )
    if "low" in params and params["low"] >= params["high"]:
        shown = "low < high" + (" (high is excluded)" if name == "integers" else "")
        return InputProblem(
            f"{name} input has low {params['low']!r} >= high {params['high']!r}: no value to draw",
            name,
            shown,
            f"low: {params['low']!r}, high: {params['high']!r}",
            "a single value is written {constant: VALUE}"
            if params["low"] == params["high"]
            else None,
        )
    if name == "positive" and params["low"] <= 0:
        return InputProblem(
            "positive input has low <= 0", f"{name}.low", "low > 0", repr(params["low"])
        )
    if name == "normal" and params["std"] <= 0:
        return InputProblem(
            "normal input needs std > 0", f"{name}.std", "std > 0", repr(params["std"])
        )
    return None


def argument_problem(
    spec: Mapping[str, Any], dtype: str, shape: tuple[int, ...] | None, root: Path
) -> InputProblem | None:
    """What is wrong with ``spec`` for an argument of ``dtype`` and ``shape`` (None: unknown)."""
    dist, params = parse(spec)
    if dtype in INT_DTYPES and dist.floats_only:
        return InputProblem(
            f"a {dist.name} input draws floats, but the argument is {dtype}",
            dist.name,
            "integers: {low, high} or constant: N for an integer argument",
            dist.name,
        )
    if dtype in INT_DTYPES:
        values = [params["value"]] if dist.name == "constant" else []
        values += [params["low"], params["high"] - 1] if dist.name == "integers" else []
        for value in values:
            if value != int(value) or not INT32[0] <= value <= INT32[1]:
                return InputProblem(
                    f"{value!r} is not an {dtype} value",
                    dist.name,
                    f"whole numbers from {INT32[0]} to {INT32[1]}",
                    repr(value),
                )
    if dtype in FLOAT_MAX:
        problem = _float_range_problem(dist.name, params, dtype)
        if problem is not None:
            return problem
    if dist.name == "npy":
        return _npy_problem(params["value"], dtype, shape, root)
    return None


def _float_range_problem(name: str, params: dict[str, Any], dtype: str) -> InputProblem | None:
    """A parameter a float argument of ``dtype`` cannot hold: drawn, it would be inf.

    ``integers`` draws int64, so its range must also lie within int64.
    """
    top = FLOAT_MAX[dtype]
    if name == "integers":
        low, high = max(INT64[0], -math.floor(top)), min(INT64[1], math.floor(top))
        for key, value, ok in (
            ("low", params["low"], low <= params["low"]),
            ("high", params["high"], params["high"] - 1 <= high),
        ):
            if not ok:
                return InputProblem(
                    f"integers.{key} {value!r} is out of range: the argument is {dtype}",
                    f"integers.{key}",
                    f"low >= {low} and high <= {high + 1}"
                    f" (whole numbers within int64 and {dtype}'s range; high is excluded)",
                    repr(value),
                )
        return None
    keys = {"constant": ["value"], "npy": []}.get(name, ["low", "high", "mean", "std"])
    for key in keys:
        value = params.get(key)
        if value is not None and abs(value) > top:
            where = name if key == "value" else f"{name}.{key}"
            return InputProblem(
                f"{where} {value!r} is beyond {dtype}'s range",
                where,
                f"a number within ±{top:.17g} (the largest finite {dtype} value)",
                repr(value),
            )
    return None


def npy_dims(
    specs: Mapping[str, Any], params: Iterable[tuple[str, Any]], root: Path
) -> dict[str, tuple[int, str]]:
    """Dims fixed by ``.npy`` inputs: dim -> (size, the file that fixes it).

    ``params``: the kernel's (argument, dims), a dim a name or a size. An
    argument read from a file has that file's shape, so its named dims have
    those sizes; a file that cannot be read, or whose rank differs, fixes
    nothing here (the input check reports it).
    """
    fixed: dict[str, tuple[int, str]] = {}
    for arg, dims in params:
        spec = specs.get(arg)
        if not dims or not isinstance(spec, Mapping) or "npy" not in spec:
            continue
        path = spec["npy"]
        try:
            import numpy as np

            shape = np.load(root / path, mmap_mode="r", allow_pickle=False).shape
        except Exception:  # reported by the input check, with its line
            continue
        if len(shape) != len(dims):
            continue
        for dim, size in zip(dims, shape, strict=True):
            if isinstance(dim, str):
                fixed.setdefault(dim, (int(size), str(path)))
    return fixed


def _npy_problem(path: str, dtype: str, shape, root: Path) -> InputProblem | None:
    import numpy as np

    full = root / path
    try:
        array = np.load(full, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        return InputProblem(
            f"no such .npy file: {path}",
            "npy",
            "an existing .npy file, relative to the project root",
            str(full),
            "write it with numpy.save",
        )
    except Exception as exc:  # EOFError, ValueError, TokenError...: whatever the bytes hold
        return InputProblem(
            f"{path} is not a .npy file numpy can read",
            "npy",
            "a file written by numpy.save",
            str(exc) or type(exc).__name__,
        )
    if not isinstance(array, np.ndarray):
        return InputProblem(f"{path} holds no single array", "npy", "a .npy file", "an archive")
    if shape is not None and tuple(array.shape) != tuple(shape):
        return InputProblem(
            f"{path} has shape {list(array.shape)}, the argument {list(shape)}",
            "npy",
            f"an array of shape {list(shape)}",
            f"shape {list(array.shape)}",
        )
    accepted = accepted_npy_dtypes(dtype)
    if str(array.dtype) not in accepted:
        shown = [
            "bfloat16 (numpy.save of an ml_dtypes.bfloat16 array, read back as |V2)"
            if name == "|V2"
            else name
            for name in accepted
        ]
        save_as = {"i32": "int32", "bool": "bool_"}.get(dtype, "float32")
        return InputProblem(
            f"{path} holds {array.dtype} values, the argument is {dtype}",
            "npy",
            "dtype " + " or ".join(shown),
            str(array.dtype),
            f"save it as {save_as} with .astype(numpy.{save_as})",
        )
    return None


def accepted_npy_dtypes(dtype: str) -> tuple[str, ...]:
    """numpy dtype names a .npy file may hold for an argument of ``dtype``.

    A half-float argument also takes float32 (rounded to it when read): a
    bf16 output that ``kiln run --save-outputs`` wrote as float32 reads back
    exactly. numpy.save writes an ml_dtypes.bfloat16 array as 2-byte voids
    (``|V2``): a bf16 argument reads those as bf16 bits.
    """
    return {
        "f32": ("float32",),
        "f16": ("float16", "float32"),
        "bf16": ("|V2", "float32"),
        "i32": ("int32",),
        "bool": ("bool",),
    }.get(dtype, (dtype,))


def random_inputs(
    name: str, specs: Iterable, seed: int = 0, root: str | os.PathLike[str] | None = None
) -> list:
    """One array per ``(shape, dtype)`` or ``(shape, dtype, input spec)`` in ``specs``.

    The stream depends on ``name`` (the instance) and ``seed``; arguments
    draw from it in order (an ``npy`` input draws nothing). ``root`` is the
    directory ``npy`` paths are relative to. A spec that cannot be used
    raises KilnError.
    """
    import numpy as np

    from kiln.errors import KilnError
    from kiln.ir.interp import NUMPY_DTYPES

    rng = np.random.default_rng([zlib.crc32(name.encode()), seed])
    arrays = []
    for index, entry in enumerate(specs):
        shape, dtype = tuple(entry[0]), entry[1]
        spec = entry[2] if len(entry) > 2 else None
        if spec is None and dtype == "bool":
            arrays.append(rng.integers(0, 2, size=shape).astype(np.bool_))
            continue
        if spec is None:
            spec = DEFAULTS["i32" if dtype == "i32" else "float"]
        problem = spec_problem(spec) or argument_problem(spec, dtype, shape, Path(root or "."))
        if problem is not None:
            err = KilnError(
                f"argument {index}: {problem.message}",
                expected=problem.expected,
                found=problem.found,
                hint=problem.hint,
            )
            err.argument = index  # which argument: a caller can point at its spec
            raise err
        dist, params = parse(spec)
        if dist.name == "npy":
            values = np.load(Path(root or ".") / params["value"], allow_pickle=False)
            if values.dtype.kind == "V":  # bf16 as numpy.save writes it: its bits
                values = values.view(NUMPY_DTYPES["bf16"])
        else:
            values = dist.draw(rng, shape, params)
        if dtype == "i32":
            arrays.append(np.asarray(values).astype(np.int32))
        elif dtype == "bool":
            arrays.append(np.asarray(values).astype(np.bool_))
        else:
            if dist.name == "normal":  # a tail beyond the dtype's range: its largest value
                values = np.clip(values, -FLOAT_MAX[dtype], FLOAT_MAX[dtype])
            with np.errstate(over="ignore"):  # an f32 file's values beyond f16 round to inf
                values = np.asarray(values).astype(np.float32).astype(NUMPY_DTYPES[dtype])
            arrays.append(values)
    return arrays


def input_key(specs: Mapping[str, Any], root: str | os.PathLike[str]) -> dict[str, Any]:
    """What decides the arrays besides the name and seed: each spec, an npy by its content.

    Part of a test report's cache key: another distribution, or new bytes
    in an ``npy`` file, is another verdict.
    """
    key: dict[str, Any] = {}
    for arg, spec in sorted(specs.items()):
        if spec is None:
            continue
        dist, params = parse(spec)
        if dist.name == "npy":
            try:
                digest = hashlib.sha256((Path(root) / params["value"]).read_bytes()).hexdigest()
            except OSError:
                digest = None  # reading it again says why
            key[arg] = {"npy": digest}
        else:
            key[arg] = {dist.name: params}
    return key


def describe(array) -> dict:
    """Shape, dtype and summary statistics of one output (computed in f64)."""
    import numpy as np

    from kiln.ir.interp import kiln_dtype

    wide = np.asarray(array, dtype=np.float64)
    finite = wide[np.isfinite(wide)] if wide.size else wide
    stats = {
        "shape": list(array.shape),
        "dtype": kiln_dtype(array.dtype),
        "min": float(finite.min()) if finite.size else None,
        "max": float(finite.max()) if finite.size else None,
        "mean": float(finite.mean()) if finite.size else None,
        "std": float(finite.std()) if finite.size else None,
        "nonfinite": int(wide.size - finite.size),
    }
    return stats


def check_kernel_inputs(pipeline, spec, params, root: Path) -> None:
    """PipelineError at its line for an input spec the kernel cannot take.

    ``spec`` is the kernel's KernelSpec, ``params`` its signature as
    discovery read it: ``(argument, dims or None)``. Checked per shape set:
    an argument the function does not have, a float distribution for an
    integer argument, a value out of i32 range, a ``.npy`` file that is
    missing or holds another shape or dtype.
    """
    if not spec.inputs and not spec.set_inputs:
        return
    from kiln.errors import PipelineError
    from kiln.pipeline.yamlpos import did_you_mean

    args = dict(params)
    for set_name, bindings in spec.shapes:
        sizes = dict(bindings)
        for arg, input_spec in spec.input_specs(set_name).items():
            key_path = spec.input_key_path(set_name, arg)
            if arg not in args:
                raise PipelineError(
                    f"kernel {spec.entry or spec.name!r} has no argument {arg!r}",
                    location=pipeline.locate(key_path),
                    expected="an argument of the kernel: " + (", ".join(args) or "(none)"),
                    found=repr(arg),
                    hint=did_you_mean(arg, list(args)),
                )
            dims = args[arg]
            shape = None if dims is None else tuple(sizes.get(d, d) for d in dims)
            if shape is not None and not all(isinstance(n, int) for n in shape):
                shape = None  # a dim the set does not bind: its own error says so
            problem = argument_problem(input_spec, spec.arg_dtype(arg), shape, root)
            if problem is not None:
                at = f" at shape set {set_name!r}" if len(spec.shapes) > 1 else ""
                raise PipelineError(
                    f"argument {arg!r} of kernel {spec.name!r}{at}: {problem.message}",
                    location=pipeline.locate(
                        key_path + (f".{problem.key}" if problem.key else ""), value=True
                    ),
                    expected=problem.expected,
                    found=problem.found,
                    hint=problem.hint,
                )
