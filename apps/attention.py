"""One attention head: softmax(q @ k^T / sqrt(d)) @ v.

`kiln run attention --target sim` runs the three kernels on the target;
plain `python -m apps.attention` runs them eagerly.
"""

from __future__ import annotations

import numpy as np

import kernels.linalg as la
from kernels import attention, normalization

QUERIES, KEYS, HEAD_DIM = 16, 24, 32
SEED = 0


def head(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> dict[str, np.ndarray]:
    scores = attention.attention_scores(q, k)
    weights = normalization.softmax(scores)
    return {"weights": weights, "context": la.gemm(weights, v)}


def main() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    q, k, v = (rng.standard_normal((n, HEAD_DIM)).astype(np.float32) for n in (QUERIES, KEYS, KEYS))
    return head(q, k, v)


if __name__ == "__main__":
    for name, value in main().items():
        print(name, value.shape, value.dtype)
