"""Seeded random inputs: every target of a kernel sees exactly the same arrays."""

from __future__ import annotations

import zlib

import numpy as np

from kiln.ir.interp import NUMPY_DTYPES


def random_inputs(name: str, specs, seed: int = 0) -> list[np.ndarray]:
    """One array per (shape, dtype) in ``specs``; the stream depends on ``name`` and ``seed``.

    Floats are uniform in [-1, 1) (positive in (0.5, 2) when ``positive`` is
    asked for by a spec's third element), i32 in [-8, 8]: small enough that
    sums and products stay exact in i32.
    """
    rng = np.random.default_rng([zlib.crc32(name.encode()), seed])
    arrays = []
    for spec in specs:
        shape, dtype = tuple(spec[0]), spec[1]
        if dtype == "i32":
            arr = rng.integers(-8, 9, size=shape, dtype=np.int32)
        elif dtype == "bool":
            arr = rng.integers(0, 2, size=shape).astype(np.bool_)
        else:
            arr = rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)
            arr = arr.astype(NUMPY_DTYPES[dtype])
        arrays.append(arr)
    return arrays


def describe(array: np.ndarray) -> dict:
    """Shape, dtype and summary statistics of one output (computed in f64)."""
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
