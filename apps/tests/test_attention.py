"""Tests of the attention app. `kiln test attention --target sim` runs them on sim."""

import numpy as np

from apps import attention


def test_head_matches_plain_numpy_attention():
    rng = np.random.default_rng(attention.SEED)
    q, k, v = (
        rng.standard_normal((n, attention.HEAD_DIM)).astype(np.float32)
        for n in (attention.QUERIES, attention.KEYS, attention.KEYS)
    )
    scores = q @ k.T / np.sqrt(attention.HEAD_DIM)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights = e / e.sum(axis=-1, keepdims=True)
    got = attention.main()
    np.testing.assert_allclose(got["weights"], weights, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got["context"], weights @ v, rtol=1e-4, atol=1e-5)


def test_attention_weights_sum_to_one():
    weights = attention.main()["weights"]
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=1e-5)
