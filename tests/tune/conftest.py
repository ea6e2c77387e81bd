"""The tuner's tests trace the example kernels in this process: the repository's own
``kernels`` package must be the one imported, whatever project an earlier test ran
in-process (its ``kernels`` and its root on sys.path)."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import REPO


@pytest.fixture(autouse=True, scope="module")
def _example_kernels_first():
    own = str(REPO / "kernels")
    for name, module in list(sys.modules.items()):
        if name == "kernels" or name.startswith("kernels."):
            if not (getattr(module, "__file__", None) or "").startswith(own):
                del sys.modules[name]
    path = list(sys.path)
    sys.path.insert(0, str(REPO))
    yield
    sys.path[:] = path
