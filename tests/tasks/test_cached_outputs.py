"""Writing a stage's cached outputs: fetched bytes become files once, and their blobs links."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("fsspec", reason="the remote cache needs kiln[distributed]")

from kiln.tasks.cached_outputs import write_outputs  # noqa: E402
from kiln.tasks.file_digests import remembered  # noqa: E402

from kiln.cache.config import CacheConfig  # noqa: E402
from kiln.cache.remote import RemoteStore  # noqa: E402
from kiln.cache.session import CacheSession  # noqa: E402
from kiln.cache.store import LocalStore, sha256  # noqa: E402

KEY = "e" * 64


def held_session(tmp_path, data: bytes) -> tuple[CacheSession, dict[str, bytes]]:
    """A session that fetched ``data`` under KEY and holds it back from its local store."""
    url = f"file://{tmp_path}/team"
    RemoteStore(url).store(KEY, {"artifact": data}, {"artifact": sha256(data)})
    session = CacheSession(CacheConfig(local_dir=str(tmp_path / "local"), remote=url))
    fetched, _ = session.lookup(KEY, keep=False)
    return session, fetched


def test_a_held_back_fetch_is_written_then_stored_as_a_link_to_its_file(tmp_path):
    session, fetched = held_session(tmp_path, b"edf bytes")
    artifact = tmp_path / "out" / "kernel.edf"
    write_outputs(artifact, fetched, str(tmp_path), session, KEY)
    blob = LocalStore(tmp_path / "local").blob_path(sha256(b"edf bytes"))
    assert os.path.samefile(blob, artifact) and os.stat(artifact).st_nlink == 2
    assert remembered(str(artifact))[1] == sha256(b"edf bytes")
    assert session.unkept == {}


def test_other_bytes_under_a_held_back_key_are_never_linked_as_its_blob(tmp_path):
    session, fetched = held_session(tmp_path, b"edf bytes")
    artifact = tmp_path / "out" / "kernel.edf"
    other = {"artifact": b"EDF from another store"}  # a local hit, say, for the same key
    write_outputs(artifact, other, str(tmp_path), session, KEY)
    assert artifact.read_bytes() == b"EDF from another store"
    assert remembered(str(artifact))[1] == sha256(b"EDF from another store")
    assert KEY in session.unkept  # still held: these are not its bytes
    write_outputs(artifact, fetched, str(tmp_path), session, KEY)
    store = LocalStore(tmp_path / "local")
    assert store.lookup(KEY) == {"artifact": b"edf bytes"}
    assert store.blob_path(sha256(b"edf bytes")).read_bytes() == b"edf bytes"


def test_a_write_that_fails_still_stores_the_fetch_and_raises(tmp_path):
    session, fetched = held_session(tmp_path, b"edf bytes")
    artifact = tmp_path / "out" / "kernel.edf"
    artifact.mkdir(parents=True)  # a directory in the artifact's place
    with pytest.raises(OSError):
        write_outputs(artifact, fetched, str(tmp_path), session, KEY)
    assert session.unkept == {}
    assert LocalStore(tmp_path / "local").lookup(KEY) == {"artifact": b"edf bytes"}
