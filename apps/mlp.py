"""Two-layer MLP inference: dense + relu, dense, softmax over the classes.

Run it with `kiln run mlp --target sim`: every kernel call below goes to
the target's compiled artifact; plain `python -m apps.mlp` runs it eagerly.
"""

from __future__ import annotations

import numpy as np

from kernels.linalg import gemm, gemm_bias_relu
from kernels.normalization import softmax as row_softmax

BATCH, FEATURES, HIDDEN, CLASSES = 8, 64, 128, 16
SEED = 0


def init_params(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Seeded weights, scaled so activations stay around unit size."""
    return {
        "w1": (rng.standard_normal((FEATURES, HIDDEN)) / np.sqrt(FEATURES)).astype(np.float32),
        "b1": (0.1 * rng.standard_normal(HIDDEN)).astype(np.float32),
        "w2": (rng.standard_normal((HIDDEN, CLASSES)) / np.sqrt(HIDDEN)).astype(np.float32),
    }


def forward(x: np.ndarray, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    hidden = gemm_bias_relu(x, params["w1"], params["b1"])
    logits = gemm(hidden, params["w2"])
    return {"hidden": hidden, "logits": logits, "probs": row_softmax(logits)}


def main() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    params = init_params(rng)
    x = rng.standard_normal((BATCH, FEATURES)).astype(np.float32)
    return forward(x, params)


if __name__ == "__main__":
    for name, value in main().items():
        print(name, value.shape, value.dtype)
