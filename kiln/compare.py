"""Comparing a target's outputs with the oracle's, under per-dtype tolerances."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

# dtype -> (rtol, atol). Half precisions round once per op, so they get room.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "f32": (1e-4, 1e-4),
    "f16": (1e-2, 1e-2),
    "bf16": (5e-2, 5e-2),
    "i32": (0.0, 0.0),
    "bool": (0.0, 0.0),
}


@dataclass
class Comparison:
    ok: bool
    output: int
    shape: tuple[int, ...]
    dtype: str
    rtol: float
    atol: float
    max_abs: float = 0.0
    max_rel: float = 0.0
    worst_index: tuple[int, ...] | None = None
    expected: float | None = None
    actual: float | None = None
    mismatched: int = 0
    problem: str | None = None  # shape/dtype/count mismatch

    def to_dict(self) -> dict:
        d = asdict(self)
        d["shape"] = list(self.shape)
        d["worst_index"] = list(self.worst_index) if self.worst_index is not None else None
        return d

    def describe(self) -> str:
        if self.problem:
            return f"output {self.output}: {self.problem}"
        text = (
            f"output {self.output} {self.dtype}{list(self.shape)}: max abs err "
            f"{self.max_abs:.3g}, max rel err {self.max_rel:.3g} (rtol {self.rtol:g}, "
            f"atol {self.atol:g})"
        )
        if not self.ok:
            text += (
                f"; {self.mismatched} element(s) out of tolerance; worst at index "
                f"{list(self.worst_index)}: expected {self.expected!r}, got {self.actual!r}"
            )
        return text


def tolerance_for(dtype: str, override: dict | None = None) -> tuple[float, float]:
    rtol, atol = DEFAULT_TOLERANCES.get(dtype, (1e-4, 1e-4))
    if override:
        rtol = float(override.get("rtol", rtol))
        atol = float(override.get("atol", atol))
    return rtol, atol


def compare(
    index: int, expected: np.ndarray, actual: np.ndarray, dtype: str, override: dict | None = None
) -> Comparison:
    """Elementwise |actual - expected| <= atol + rtol * |expected|; NaNs must match NaNs."""
    rtol, atol = tolerance_for(dtype, override)
    expected = np.asarray(expected)
    actual = np.asarray(actual)
    result = Comparison(True, index, tuple(expected.shape), dtype, rtol, atol)
    if actual.shape != expected.shape:
        result.ok = False
        result.problem = f"shape {list(actual.shape)} differs from expected {list(expected.shape)}"
        return result
    e = expected.astype(np.float64)
    a = actual.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        # Non-finite expected values must be matched exactly (NaN by NaN, +inf by +inf);
        # the tolerance only applies where the oracle is finite.
        finite = np.isfinite(e)
        same = (np.isnan(e) & np.isnan(a)) | (~finite & (a == e))
        err = np.where(same, 0.0, np.abs(a - e))
        err = np.where(np.isnan(err), np.inf, err)
        allowed = np.where(finite, atol + rtol * np.abs(e), 0.0)
        bad = err > allowed
        rel = err / np.maximum(np.abs(np.where(finite, e, 1.0)), np.finfo(np.float64).tiny)
    if e.size == 0:
        return result
    with np.errstate(invalid="ignore"):
        excess = np.where(bad, err - allowed, -np.inf)
    worst = np.unravel_index(int(np.argmax(excess if bad.any() else err)), e.shape)
    result.max_abs = float(err.max())
    result.max_rel = float(np.where(err == 0, 0.0, rel).max())
    result.mismatched = int(bad.sum())
    result.ok = not bad.any()
    result.worst_index = tuple(int(i) for i in worst)
    result.expected = e[worst].item()
    result.actual = a[worst].item()
    return result


def vacuity(expected: np.ndarray) -> str | None:
    """Why comparing with this oracle output checks little, or None.

    All zeros (a kernel returning zeros passes), one value everywhere (a
    constant passes; not said of a one-element output, which always is), or
    non-finite elements (only matched exactly, never within a tolerance).
    """
    e = np.asarray(expected)
    if e.size == 0:
        return None
    wide = e.astype(np.float64)
    finite = np.isfinite(wide)
    if not finite.all():
        bad = int(e.size - finite.sum())
        return f"has {bad} of {e.size} element(s) that are not finite (NaN or infinity)"
    if not wide.any():
        return "is all zeros" if e.size > 1 else "is zero"
    if e.size > 1 and (wide == wide.flat[0]).all():
        return f"is {wide.flat[0]:g} everywhere"
    return None
