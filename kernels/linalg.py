"""Matrix products and layout changes."""

# ruff: noqa: F821  (Tensor["N"] names a dim, not a forward reference)

from kiln import Tensor, device


@device
def gemm(a: Tensor["M", "K"], b: Tensor["K", "N"]):
    return a @ b


@device
def gemm_bias_relu(a: Tensor["M", "K"], b: Tensor["K", "N"], bias: Tensor["N"]):
    return (a @ b + bias).relu()


@device
def batched_matmul(a: Tensor["B", "M", "K"], b: Tensor["B", "K", "N"]):
    return a @ b


@device
def transpose(x: Tensor["M", "N"]):
    return x.T
