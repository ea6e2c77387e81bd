"""A file's digest is reused only while the file is the one it was hashed from."""

from __future__ import annotations

import os

from kiln.cache.store import sha256
from kiln.tasks.model import file_digests
from kiln.tasks.model.file_digests import digest_of, file_stat


def test_a_digest_holds_until_the_file_changes(tmp_path, monkeypatch):
    path = str(tmp_path / "kernel.py")
    with open(path, "wb") as f:
        f.write(b"kernel bytes")
    assert digest_of(path) == sha256(b"kernel bytes")
    hashed = []
    monkeypatch.setattr(file_digests.fsutil, "file_digest", lambda p: hashed.append(p))
    assert digest_of(path) == sha256(b"kernel bytes") and hashed == []  # not read again
    monkeypatch.undo()
    os.replace(_written(tmp_path, b"other lir"), path)  # another file under the name
    assert digest_of(path) == sha256(b"other lir")
    assert file_stat(str(tmp_path / "missing")) is None


def _written(tmp_path, data: bytes) -> str:
    path = str(tmp_path / "new")
    with open(path, "wb") as f:
        f.write(data)
    return path
