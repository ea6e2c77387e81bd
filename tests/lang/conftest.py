"""One IREE compile cache for the whole test session (each new shape costs ~1 s)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def shared_iree_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KILN_CACHE_DIR", str(tmp_path_factory.mktemp("kiln-cache")))
        yield
