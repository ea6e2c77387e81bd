"""Elementwise kernels."""

# ruff: noqa: F821  (Tensor["N"] names a dim, not a forward reference)

from kiln import Tensor, device


@device
def vector_add(a: Tensor["N"], b: Tensor["N"]):
    return a + b
