"""Indexing, slicing and shape ops with static bounds, NumPy names and semantics.

``x[1:5, ::2]`` is one ``slice`` node (a strided window: targets read it in
place) followed by a ``reshape`` for integer indices and ``None``;
``concatenate`` is the ``concat`` op; everything else here (stack,
expand_dims, squeeze, flatten, swapaxes, flip) is written over those and
``reshape``/``transpose``.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.errors import TraceError
from kiln.lang import functions as F
from kiln.lang.tensor import Tensor, apply

_HINT = "indices must be Python ints, slices with int bounds, ..., or None"


def _index_items(x: Tensor, key: Any) -> list[Any]:
    """The key as one item per source axis or inserted axis (``...`` expanded)."""
    items = list(key) if isinstance(key, tuple) else [key]
    for item in items:
        if isinstance(item, Tensor):
            raise TraceError(
                "indexing with a tensor (gather) is not supported: indices must be static",
                hint=_HINT,
            )
        ok_int = isinstance(item, (int, np.integer)) and not isinstance(item, bool)
        ok_slice = isinstance(item, slice) and builtins.all(
            v is None or (isinstance(v, (int, np.integer)) and not isinstance(v, bool))
            for v in (item.start, item.stop, item.step)
        )
        if not (ok_int or ok_slice or item is None or item is Ellipsis):
            raise TraceError(
                f"unsupported index {item!r} for a tensor of shape {x.shape}", hint=_HINT
            )
    if items.count(Ellipsis) > 1:
        raise TraceError("an index can only have a single ellipsis ('...')")
    used = builtins.sum(1 for i in items if i is not None and i is not Ellipsis)
    if used > x.ndim:
        raise TraceError(f"too many indices for a tensor of shape {x.shape}: {used} given")
    fill = [slice(None)] * (x.ndim - used)
    if Ellipsis in items:
        at = items.index(Ellipsis)
        return items[:at] + fill + items[at + 1 :]
    return items + fill


def getitem(x: Tensor, key: Any) -> Tensor:
    """``x[key]`` for static ints, slices (any step), ``...`` and ``None``."""
    items = _index_items(x, key)
    starts, steps, sizes, out_shape, flips = [], [], [], [], []
    axis = 0
    for item in items:
        if item is None:
            out_shape.append(1)
            continue
        dim = x.shape[axis]
        if isinstance(item, slice):
            if item.step == 0:  # item.indices would raise a bare ValueError
                raise TraceError(
                    f"slice {_slice_text(item)} of axis {axis}: slice step cannot be zero",
                    expected="a step other than 0 (a negative one reads backwards)",
                    found=f"{_slice_text(item)}: step 0",
                )
            start, stop, step = item.indices(dim)
            size = len(range(start, stop, step))
            if size == 0:  # NumPy gives an empty array; a kernel's tensors are never empty
                raise TraceError(
                    f"slice {_slice_text(item)} of axis {axis} (size {dim}) is empty: "
                    "kernels cannot produce empty tensors",
                    expected=f"a slice that keeps at least one of the {dim} elements",
                    found=f"{_slice_text(item)} -> range({start}, {stop}, {step}): no elements",
                )
            if step < 0:  # read the same elements forwards, then flip them
                start, flips = (start + (size - 1) * step if size else 0), [*flips, axis]
                step = -step
            starts.append(start if size else 0)
            steps.append(step)
            sizes.append(size)
            out_shape.append(size)
        else:
            index = int(item)
            if not -dim <= index < dim:
                raise TraceError(
                    f"index {index} is out of bounds for axis {axis} with size {dim}",
                    expected=f"an index in [{-dim}, {dim - 1}]",
                    found=str(index),
                )
            starts.append(index % dim)
            steps.append(1)
            sizes.append(1)
        axis += 1
    out = x
    if tuple(sizes) != x.shape or builtins.any(s != 1 for s in steps):
        out = apply("slice", [x], starts=tuple(starts), steps=tuple(steps), sizes=tuple(sizes))
    for a in flips:
        out = flip(out, a)
    return F.reshape(out, tuple(out_shape))


def _slice_text(item: slice) -> str:
    """A slice as it is written: ``100:200``, ``::-1``."""
    parts = ["" if v is None else str(v) for v in (item.start, item.stop, item.step)]
    return ":".join(parts if item.step is not None else parts[:2])


def flip(x: Any, axis: Any = None) -> Tensor:
    """Reverse the order of elements along ``axis`` (all axes when None)."""
    x = F.as_tensor(x, "flip")
    for a in F.axes_of(x, axis, "flip"):
        if x.shape[a] > 1:
            parts = [
                apply("slice", [x], **_unit_slice(x.shape, a, i))
                for i in range(x.shape[a] - 1, -1, -1)
            ]
            x = apply("concat", parts, axis=a)
    return x


def _unit_slice(shape: tuple[int, ...], axis: int, index: int) -> dict:
    starts = tuple(index if a == axis else 0 for a in range(len(shape)))
    sizes = tuple(1 if a == axis else d for a, d in enumerate(shape))
    return {"starts": starts, "steps": (1,) * len(shape), "sizes": sizes}


def _axis(value: Any, rank: int, label: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TraceError(f"{label}: axis must be an int, got {value!r}")
    if not -rank <= value < rank:
        raise TraceError(
            f"{label}: axis {value} is out of range for rank {rank}",
            expected=f"an axis in [{-rank}, {rank - 1}]",
            found=str(value),
        )
    return int(value) % rank


def concatenate(tensors: Sequence[Any], axis: int | None = 0) -> Tensor:
    """Join tensors along an existing axis (dtypes promote as in arithmetic);
    ``axis=None`` flattens them first, as NumPy does."""
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise TraceError("concatenate needs a non-empty list or tuple of tensors")
    parts = [F.as_tensor(t, "concatenate") for t in tensors]
    if axis is None:
        parts, axis = [flatten(p) for p in parts], 0
    if builtins.any(p.ndim == 0 for p in parts):
        raise TraceError("concatenate: zero-dimensional tensors cannot be concatenated")
    a = _axis(axis, parts[0].ndim, "concatenate")
    for p in parts[1:]:
        if p.ndim != parts[0].ndim or builtins.any(
            d != e for i, (d, e) in enumerate(zip(p.shape, parts[0].shape, strict=False)) if i != a
        ):
            raise TraceError(
                f"concatenate: shapes {parts[0].shape} and {p.shape} differ off axis {a}",
                hint="all dims except the concatenation axis must match",
            )
    dtype = F.result_dtype(parts)
    parts = [F.cast_to(p, dtype) for p in parts]
    return parts[0] if len(parts) == 1 else apply("concat", parts, axis=a)


def stack(tensors: Sequence[Any], axis: int = 0) -> Tensor:
    """Join same-shape tensors along a new axis."""
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise TraceError("stack needs a non-empty list or tuple of tensors")
    parts = [F.as_tensor(t, "stack") for t in tensors]
    if builtins.any(p.shape != parts[0].shape for p in parts):
        raise TraceError(
            "stack: all tensors must have the same shape, got "
            + ", ".join(str(p.shape) for p in parts)
        )
    a = _axis(axis, parts[0].ndim + 1, "stack")
    return concatenate([expand_dims(p, a) for p in parts], axis=a)


def expand_dims(x: Any, axis: Any) -> Tensor:
    x = F.as_tensor(x, "expand_dims")
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    rank = x.ndim + len(axes)
    new = sorted(_axis(a, rank, "expand_dims") for a in axes)
    if len(set(new)) != len(new):
        raise TraceError(f"expand_dims: repeated axis in {axis!r}")
    dims = iter(x.shape)
    return F.reshape(x, tuple(1 if a in new else next(dims) for a in range(rank)))


def squeeze(x: Any, axis: Any = None) -> Tensor:
    x = F.as_tensor(x, "squeeze")
    if axis is None:
        drop = [a for a, d in enumerate(x.shape) if d == 1]
    else:
        drop = list(F.axes_of(x, axis, "squeeze"))
        for a in drop:
            if x.shape[a] != 1:
                raise TraceError(
                    f"squeeze: axis {a} has size {x.shape[a]}, not 1 (shape {x.shape})"
                )
    return F.reshape(x, tuple(d for a, d in enumerate(x.shape) if a not in drop))


def flatten(x: Any) -> Tensor:
    x = F.as_tensor(x, "flatten")
    return F.reshape(x, (x.size,))


def swapaxes(x: Any, axis1: int, axis2: int) -> Tensor:
    x = F.as_tensor(x, "swapaxes")
    a, b = _axis(axis1, x.ndim, "swapaxes"), _axis(axis2, x.ndim, "swapaxes")
    perm = list(range(x.ndim))
    perm[a], perm[b] = perm[b], perm[a]
    return F.transpose(x, tuple(perm))


def matrix_transpose(x: Any) -> Tensor:
    """``x.mT``: swap the last two axes."""
    x = F.as_tensor(x, "mT")
    if x.ndim < 2:
        raise TraceError(f"mT needs a tensor of rank >= 2, got shape {x.shape}")
    return swapaxes(x, -1, -2)


def moveaxis(x: Any, source: Any, destination: Any) -> Tensor:
    """``np.moveaxis``: ``source`` and ``destination`` are ints or sequences of them."""
    x = F.as_tensor(x, "moveaxis")
    src = _axis_list(source, x.ndim, "source")
    dst = _axis_list(destination, x.ndim, "destination")
    if len(src) != len(dst):
        raise TraceError(
            "moveaxis: source and destination must have the same number of axes",
            expected=f"{len(src)} destination axis(es), one per source axis",
            found=f"source {source!r}, destination {destination!r}",
        )
    order = [a for a in range(x.ndim) if a not in src]
    for d, s in sorted(zip(dst, src, strict=True)):
        order.insert(d, s)
    return F.transpose(x, tuple(order))


def _axis_list(value: Any, rank: int, name: str) -> list[int]:
    """NumPy's normalize_axis_tuple: an int or a sequence of ints, each in range, none twice."""
    items = list(value) if isinstance(value, (tuple, list)) else [value]
    axes = [_axis(a, rank, f"moveaxis {name}") for a in items]
    for i, a in enumerate(axes):
        if a in axes[:i]:
            raise TraceError(
                f"moveaxis: repeated axis in {name} {value!r}",
                expected=f"{name} axes that are all different",
                found=f"axis {items[i]} names axis {a} again",
            )
    return axes
