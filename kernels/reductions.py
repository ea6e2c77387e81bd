"""Row reductions over the last axis."""

# ruff: noqa: F821  (Tensor["N"] names a dim, not a forward reference)

from kiln import Tensor, device


@device
def row_sum(x: Tensor["R", "C"]):
    return x.sum(axis=-1)


@device
def row_max(x: Tensor["R", "C"]):
    return x.max(axis=-1)
