"""Attention building blocks."""

# ruff: noqa: F821  (Tensor["N"] names a dim, not a forward reference)

import math

from kiln import Tensor, device


@device
def attention_scores(q: Tensor["S", "D"], k: Tensor["T", "D"]):
    """Scaled dot-product scores of one head: (q @ k^T) / sqrt(D)."""
    return (q @ k.T) * (1.0 / math.sqrt(q.shape[-1]))
