"""pipeline.yaml ``cache:`` and the environment that overrides it."""

from __future__ import annotations

import pytest

from kiln.cache.config import require_remote_support, resolve_cache_config
from kiln.errors import KilnError


def test_env_overrides_the_file(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KILN_REMOTE_CACHE", "file:///shared/team")
    monkeypatch.setenv("KILN_REMOTE_UPLOAD", "0")
    config = resolve_cache_config({"remote": "file:///elsewhere", "upload": True, "timeout": 3})
    assert config.remote == "file:///shared/team"
    assert config.upload is False
    assert config.timeout == 3.0
    assert config.local_dir == str(tmp_path / "store")


def test_empty_env_turns_the_remote_off(monkeypatch):
    monkeypatch.setenv("KILN_REMOTE_CACHE", "")
    assert resolve_cache_config({"remote": "file:///x"}).remote is None


def test_missing_extra_is_one_message_naming_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "s3fs" else real(name, *a)
    )
    with pytest.raises(KilnError) as info:
        require_remote_support("s3://bucket/prefix")
    assert "s3fs" in info.value.message
    assert "kiln[distributed]" in info.value.hint
