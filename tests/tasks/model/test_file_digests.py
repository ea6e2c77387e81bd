"""A remembered digest is used only while its file is the one it was remembered for."""

from __future__ import annotations

import os

from kiln.cache.store import sha256
from kiln.tasks.model.file_digests import digest_of, file_stat, remember, remembered


def test_a_remembered_digest_holds_until_the_file_changes(tmp_path):
    path = str(tmp_path / "kernel.lir")
    with open(path, "wb") as f:
        f.write(b"lir bytes")
    stat = file_stat(path)
    remember(path, stat, "d" * 64)  # as a write from the cache does
    assert digest_of(path) == "d" * 64 and remembered(path) == (stat, "d" * 64)
    os.replace(_written(tmp_path, b"other lir"), path)  # another file under the name
    assert digest_of(path) == sha256(b"other lir")
    assert file_stat(str(tmp_path / "missing")) is None


def _written(tmp_path, data: bytes) -> str:
    path = str(tmp_path / "new")
    with open(path, "wb") as f:
        f.write(data)
    return path
