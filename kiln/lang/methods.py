"""Tensor methods with NumPy names beyond the v1 set (``x.clip()``, ``x.var()``, ``x.mT``).

A mixin of :class:`kiln.lang.tensor.Tensor`; each method is one line over the
op modules, which are imported on first use because they build on Tensor.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


def _ops() -> SimpleNamespace:
    from kiln.lang import contractions, elementwise, reductions, shapes

    return SimpleNamespace(
        contractions=contractions, elementwise=elementwise, reductions=reductions, shapes=shapes
    )


class NumpyMethods:
    """Elementwise, reduction and shape methods; Tensor inherits them."""

    __slots__ = ()

    def erf(self) -> Any:
        return _ops().elementwise.erf(self)

    def log1p(self) -> Any:
        return _ops().elementwise.log1p(self)

    def expm1(self) -> Any:
        return _ops().elementwise.expm1(self)

    def silu(self) -> Any:
        return _ops().elementwise.silu(self)

    def softplus(self) -> Any:
        return _ops().elementwise.softplus(self)

    def square(self) -> Any:
        return _ops().elementwise.square(self)

    def reciprocal(self) -> Any:
        return _ops().elementwise.reciprocal(self)

    def sign(self) -> Any:
        return _ops().elementwise.sign(self)

    def floor(self) -> Any:
        return _ops().elementwise.floor(self)

    def ceil(self) -> Any:
        return _ops().elementwise.ceil(self)

    def round(self, decimals: int = 0) -> Any:
        return _ops().elementwise.round(self, decimals)

    def __round__(self, ndigits: int | None = None) -> Any:  # round(x), like kiln.round(x)
        return _ops().elementwise.round(self, ndigits)

    def clip(self, *bounds: Any, **named: Any) -> Any:  # (a_min, a_max) or min=, max=
        return _ops().elementwise.clip(self, *bounds, **named)

    def prod(self, axis=None, keepdims: bool = False) -> Any:
        return _ops().reductions.prod(self, axis, keepdims)

    def var(self, axis=None, keepdims: bool = False, ddof: int = 0) -> Any:
        return _ops().reductions.var(self, axis, keepdims, ddof)

    def std(self, axis=None, keepdims: bool = False, ddof: int = 0) -> Any:
        return _ops().reductions.std(self, axis, keepdims, ddof)

    def argmax(self, axis=None, keepdims: bool = False) -> Any:
        return _ops().reductions.argmax(self, axis, keepdims)

    def argmin(self, axis=None, keepdims: bool = False) -> Any:
        return _ops().reductions.argmin(self, axis, keepdims)

    def flatten(self) -> Any:
        return _ops().shapes.flatten(self)

    def squeeze(self, axis=None) -> Any:
        return _ops().shapes.squeeze(self, axis)

    def swapaxes(self, axis1: int, axis2: int) -> Any:
        return _ops().shapes.swapaxes(self, axis1, axis2)

    @property
    def mT(self) -> Any:  # noqa: N802  (NumPy's name)
        return _ops().shapes.matrix_transpose(self)

    def dot(self, other) -> Any:
        return _ops().contractions.dot(self, other)
