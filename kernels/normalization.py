"""Row-wise normalizations: softmax and layer norm."""

# ruff: noqa: F821  (Tensor["N"] names a dim, not a forward reference)

from kiln import Tensor, device

LAYERNORM_EPS = 1e-5


@device
def softmax(x: Tensor["R", "C"]):
    # Subtract the row max first: exp never overflows, the result is unchanged.
    shifted = x - x.max(axis=-1, keepdims=True)
    e = shifted.exp()
    return e / e.sum(axis=-1, keepdims=True)


@device
def layernorm(x: Tensor["R", "C"], gamma: Tensor["C"], beta: Tensor["C"]):
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    var = (centered * centered).mean(axis=-1, keepdims=True)
    return centered * (var + LAYERNORM_EPS).rsqrt() * gamma + beta
