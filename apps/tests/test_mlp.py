"""Tests of the mlp app. `kiln test mlp --target sim` runs them with every kernel call on sim;
plain pytest runs them eagerly (the cpu oracle)."""

import numpy as np

from apps import mlp


def reference() -> dict[str, np.ndarray]:
    """The same network in plain numpy, no kernels."""
    rng = np.random.default_rng(mlp.SEED)
    p = mlp.init_params(rng)
    x = rng.standard_normal((mlp.BATCH, mlp.FEATURES)).astype(np.float32)
    hidden = np.maximum(x @ p["w1"] + p["b1"], 0)
    logits = hidden @ p["w2"]
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return {"hidden": hidden, "logits": logits, "probs": e / e.sum(axis=-1, keepdims=True)}


def test_outputs_match_a_plain_numpy_mlp():
    got, want = mlp.main(), reference()
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_probabilities_are_a_distribution_per_row():
    probs = mlp.main()["probs"]
    assert probs.shape == (mlp.BATCH, mlp.CLASSES)
    assert (probs >= 0).all()
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0, rtol=1e-5)
