"""Saved outputs that anyone can read: plain ``np.load`` gives the right values.

``kiln run --save-outputs DIR`` writes each output as ``DIR/<name>.npy``
(``out0.npy``, ``out1.npy``, ... for a kernel; an app's outputs by name). A
dtype numpy has no name for in a .npy file (bf16, from ml_dtypes, would read
back as raw ``|V2`` bytes) is saved as its exact float32 widening: every
bf16 value is a float32 value, so nothing is lost. ``DIR/outputs.json``
records each output's original dtype and shape, and ``load_outputs(DIR)``
returns the arrays in their original dtypes.
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kiln.errors import KilnError

MANIFEST = "outputs.json"
FORMAT = 1


def _stored(array):
    """(the array np.save writes, Kiln's dtype name or numpy's) for one output."""
    import numpy as np

    from kiln.ir.interp import NUMPY_DTYPES

    name = NUMPY_DTYPES.name_of(array.dtype) or str(array.dtype)
    if array.dtype.kind == "V" and array.dtype.names is None:  # bf16 and its kin
        return array.astype(np.float32), name
    return array, name


def save_outputs(outputs: list[tuple[str, Any]], directory: str | os.PathLike[str]) -> list[Path]:
    """Write each ``(name, value)`` as ``directory/<name>.npy`` plus ``outputs.json``.

    A character a file name should not hold becomes ``_`` (an app's nested
    output ``stats.mean[0]``); ``outputs.json`` keeps the name as given, and
    ``load_outputs`` returns it. Each file is written atomically; returns
    the paths of the .npy files. A directory that cannot be made or written
    (a file in its place) is a KilnError naming ``--save-outputs``.
    """
    from kiln.outpaths import check_output, writing

    directory = Path(directory)
    check_output("--save-outputs", directory, directory=True)
    with writing("--save-outputs", directory, directory=True):
        return _save(outputs, directory)


def _save(outputs: list[tuple[str, Any]], directory: Path) -> list[Path]:
    import numpy as np

    from kiln.fsutil import write_bytes_atomic

    directory.mkdir(parents=True, exist_ok=True)
    written, entries = [], []
    for (name, value), stem in zip(outputs, file_stems([n for n, _ in outputs]), strict=True):
        array = np.asarray(value)
        stored, dtype = _stored(array)
        buffer = io.BytesIO()
        np.save(buffer, stored, allow_pickle=False)
        path = directory / (stem + ".npy")
        write_bytes_atomic(path, buffer.getvalue())
        written.append(path)
        entries.append(
            {"name": name, "file": path.name, "dtype": dtype, "shape": list(array.shape)}
            | ({"saved_as": str(stored.dtype)} if stored is not array else {})
        )
    manifest = {"format": FORMAT, "outputs": entries}
    write_bytes_atomic(directory / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())
    return written


def file_stems(names: list[str]) -> list[str]:
    """One distinct file name (without ``.npy``) per output name, in order.

    ``a/b`` becomes ``a_b``. Names that are file names already keep them;
    one that would meet another (``a/b`` beside ``a_b``, or ``A`` beside ``a``
    on a case-blind file system) gets ``~2``, ``~3``..., which no cleaned
    name holds.
    """
    cleaned = [re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "_" for name in names]
    order = sorted(range(len(names)), key=lambda i: cleaned[i] != names[i])  # stable
    taken: set[str] = set()
    stems = [""] * len(names)
    for i in order:
        stems[i] = _unique(cleaned[i], taken, str.casefold)
    return stems


def load_outputs(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The outputs saved in ``directory``, name -> array, in their original dtypes.

    ``kiln run gemm --save-outputs out/`` then ``kiln.load_outputs("out")["out0"]``.
    A bf16 output comes back as an ``ml_dtypes.bfloat16`` array with the very
    values the target computed. A directory without ``outputs.json`` (.npy
    files from elsewhere) gives each ``*.npy`` as numpy reads it. Raises
    KilnError when the directory or a file it lists cannot be read.
    """
    import numpy as np

    from kiln.ir.interp import NUMPY_DTYPES

    directory = Path(directory)
    if not directory.is_dir():
        raise KilnError(
            f"no saved outputs at {directory}",
            expected="a directory written by kiln run --save-outputs",
            found="nothing there" if not directory.exists() else "a file",
        )
    manifest = directory / MANIFEST
    if not manifest.is_file():
        files = sorted(directory.glob("*.npy"), key=_natural)
        return {p.stem: np.load(p, allow_pickle=False) for p in files}
    try:
        entries = json.loads(manifest.read_text(encoding="utf-8"))["outputs"]
        found = {}
        for entry in entries:
            array = np.load(directory / entry["file"], allow_pickle=False)
            dtype = entry.get("dtype")
            if dtype in NUMPY_DTYPES and array.dtype != NUMPY_DTYPES[dtype]:
                array = array.astype(NUMPY_DTYPES[dtype])
            found[entry["name"]] = array
        return found
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise KilnError(
            f"the outputs saved in {directory} cannot be read: {type(exc).__name__}: {exc}",
            hint="run kiln run --save-outputs again to write them",
        ) from None


def _natural(path: Path) -> tuple:
    """out2 before out10."""
    import re

    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.stem))


def flatten_outputs(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Named leaves of what main returned: dict keys and sequence indices, joined by '.'.

    Each name is unique. A key holding a dot can spell another leaf's path
    (``{"c": [x, y], "c.0": z}``): the leaf whose own key it is (the shorter
    path) keeps the name, the other becomes ``c.0~2``.
    """
    leaves = _leaves(value, (prefix,) if prefix else ())
    named = [(".".join(path) or "out", path, item) for path, item in leaves]
    first = sorted(range(len(named)), key=lambda i: len(named[i][1]))  # stable: ties in order
    taken: set[str] = set()
    names = [""] * len(named)
    for i in first:
        names[i] = _unique(named[i][0], taken, str)
    return [(name, item) for name, (_, _, item) in zip(names, named, strict=True)]


def _leaves(value: Any, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], Any]]:
    if isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(value)]
    elif value is None:
        return []
    else:
        return [(path, value)]
    out = []
    for key, item in items:
        out.extend(_leaves(item, (*path, key)))
    return out


def _unique(name: str, taken: set[str], fold: Callable[[str], str]) -> str:
    """``name``, else ``name~2``, ``name~3``...: the first whose ``fold`` is not taken; takes it."""
    chosen, n = name, 1
    while fold(chosen) in taken:
        n += 1
        chosen = f"{name}~{n}"
    taken.add(fold(chosen))
    return chosen


def _numbers(array) -> tuple[Any, bool] | None:
    """(the values widened exactly to float64 or int64, whether they are integers), or None.

    numpy's own numbers have kind b/i/u/f; an ml_dtypes type (bf16, the float8s,
    int4...) has kind V, and is widened through its registered casts.
    """
    import numpy as np

    dtype = array.dtype
    if dtype.kind in "biu":
        return (array if dtype.kind == "u" else array.astype(np.int64)), True
    if dtype.kind == "f":
        return array.astype(np.float64), False
    if dtype.kind != "V" or dtype.names is not None or dtype.type.__module__ != "ml_dtypes":
        return None
    import ml_dtypes

    try:
        ml_dtypes.iinfo(dtype)
    except ValueError:  # a float type
        return array.astype(np.float64), False
    return array.astype(np.int64), True


def _integer_stat(value: float) -> str:
    """A mean or std of integers: exact when whole, else every digit of its integer part."""
    if abs(value) >= 2**53:  # past float64's integers: its digits would only look exact
        return f"{value:.6g}"
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.{max(6, len(str(int(abs(value)))) + 2)}g}"


def describe_output(name: str, value: Any) -> str:
    """One summary line of an output: its dtype (Kiln's name, else numpy's), shape and stats.

    Integers print exactly (an i32 sum of 50331651 is not 5.03317e+07); floats
    of any width, bf16 included, with six significant digits.
    """
    import numpy as np

    from kiln.ir.interp import NUMPY_DTYPES

    label = "  out" if name == "out" else f"  out {name}"
    array = np.asarray(value) if isinstance(value, (np.ndarray, np.generic, int, float)) else None
    numbers = None if array is None else _numbers(array)
    if array is not None and array.dtype.kind == "c" and array.size:  # complex: |z|
        size = np.abs(array)
        shape = list(array.shape)
        return f"{label}: {array.dtype}{shape}  |z| min {size.min():.6g}  max {size.max():.6g}"
    if numbers is None:
        return f"{label}: {value!r}"[:200]
    # int64, float64, float8... from the app's own numpy: numpy's name
    dtype = NUMPY_DTYPES.name_of(array.dtype) or str(array.dtype)
    shape = list(array.shape)
    wide, integers = numbers
    if not wide.size:
        return f"{label}: {dtype}{shape}  (no values)"
    if integers:
        mean, std = wide.mean(dtype=np.float64), wide.std(dtype=np.float64)
        return (
            f"{label}: {dtype}{shape}  min {int(wide.min())}  max {int(wide.max())}"
            f"  mean {_integer_stat(mean)}  std {_integer_stat(std)}"
        )
    finite = wide[np.isfinite(wide)]
    if not finite.size:
        return f"{label}: {dtype}{shape}  (no finite values)"
    nonfinite = wide.size - finite.size
    return (
        f"{label}: {dtype}{shape}  min {finite.min():.6g}  max {finite.max():.6g}"
        f"  mean {finite.mean():.6g}  std {finite.std():.6g}"
        + (f"  non-finite {nonfinite}" if nonfinite else "")
    )
