"""The remote store at an fsspec URL: verified fetches, one warning, a deadline, a breaker."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("fsspec", reason="the remote cache needs kiln[distributed]")

import fsspec  # noqa: E402
from fsspec.implementations.memory import MemoryFileSystem  # noqa: E402

from kiln.cache.remote import RemoteStore  # noqa: E402
from kiln.cache.store import sha256  # noqa: E402

KEY = "e" * 64


def _upload(remote: RemoteStore, data: bytes) -> str:
    digest = sha256(data)
    remote.store(KEY, {"artifact": data}, {"artifact": digest})
    return digest


def test_shared_directory_round_trip_is_atomic(tmp_path):
    remote = RemoteStore(f"file://{tmp_path}/team")
    digest = _upload(remote, b"lir bytes")
    assert (tmp_path / "team" / "cas" / digest[:2] / digest).read_bytes() == b"lir bytes"
    assert not list((tmp_path / "team").rglob("*.tmp"))
    assert RemoteStore(f"file://{tmp_path}/team").lookup(KEY) == {"artifact": b"lir bytes"}
    assert remote.uploaded_bytes == len(b"lir bytes")


@pytest.mark.parametrize("damage", ["truncate", "flip", "foreign"])
def test_damaged_remote_object_warns_once_naming_the_key_and_is_overwritten(
    tmp_path, capfd, damage
):
    remote = RemoteStore(f"file://{tmp_path}/team")
    digest = _upload(remote, b"0123456789")
    blob = tmp_path / "team" / "cas" / digest[:2] / digest
    entry = tmp_path / "team" / "ac" / KEY[:2] / KEY
    if damage == "truncate":
        blob.write_bytes(b"01234")
    elif damage == "flip":
        blob.write_bytes(b"0123456788")
    else:
        entry.write_bytes(b"<html>403 Forbidden</html>")
    reader = RemoteStore(f"file://{tmp_path}/team")
    assert reader.lookup(KEY) is None
    assert reader.lookup(KEY) is None
    err = capfd.readouterr().err
    assert err.count("warning") == 1 and KEY in err
    _upload(reader, b"0123456789")  # the rebuilt output overwrites the bad object
    assert RemoteStore(f"file://{tmp_path}/team").lookup(KEY) == {"artifact": b"0123456789"}


def test_read_only_remote_never_writes(tmp_path):
    remote = RemoteStore(f"file://{tmp_path}/team", upload=False)
    _upload(remote, b"abc")
    assert not (tmp_path / "team").exists()


class SlowFileSystem(MemoryFileSystem):
    protocol = "kilnslow"
    calls = 0

    def cat_file(self, path, *args, **kwargs):
        type(self).calls += 1
        time.sleep(5)
        return b""


class DeniedFileSystem(MemoryFileSystem):
    protocol = "kilndenied"
    calls = 0

    def cat_file(self, path, *args, **kwargs):
        type(self).calls += 1
        raise PermissionError(13, "Permission denied", path)


@pytest.mark.parametrize(
    "fs_class, reason",
    [(SlowFileSystem, "no answer within 0.3 s"), (DeniedFileSystem, "Permission denied")],
)
def test_failing_remote_warns_once_then_stays_off(capfd, fs_class, reason):
    fsspec.register_implementation(fs_class.protocol, fs_class, clobber=True)
    fs_class.calls = 0
    remote = RemoteStore(f"{fs_class.protocol}://cache", timeout=0.3)
    start = time.monotonic()
    for key in ("1" * 64, "2" * 64, "3" * 64):
        assert remote.lookup(key) is None
    _upload(remote, b"data")
    assert time.monotonic() - start < 2
    assert fs_class.calls == 1  # the breaker: no call after the first failure
    err = capfd.readouterr().err
    assert err.count("warning") == 1 and reason in err
    remote.close()


def test_a_verified_lookup_warns_once_for_a_corrupt_blob_and_never_for_a_miss(tmp_path, capfd):
    remote = RemoteStore(f"file://{tmp_path}/team")
    remote.store(
        "1" * 64,
        {"record": b"r", "file/kernel.edf": b"edf"},
        {"record": sha256(b"r"), "file/kernel.edf": sha256(b"edf")},
    )
    reader = RemoteStore(f"file://{tmp_path}/team")
    found, digests = reader.lookup_verified("1" * 64)
    assert found == {"record": b"r", "file/kernel.edf": b"edf"}
    assert digests["file/kernel.edf"] == sha256(b"edf")
    assert reader.fetched_bytes == len(b"redf")
    digest = sha256(b"edf")
    (tmp_path / "team" / "cas" / digest[:2] / digest).write_bytes(b"ed!")  # bit flip
    reader = RemoteStore(f"file://{tmp_path}/team")
    assert reader.lookup_verified("1" * 64) is None
    err = capfd.readouterr().err
    assert err.count("warning") == 1 and "1" * 64 in err and "corrupt" in err
    assert reader.lookup_verified("f" * 64) is None  # not there at all: no warning
    assert "warning" not in capfd.readouterr().err


class HangingConnectFileSystem(MemoryFileSystem):
    """A backend that connects in its constructor (as FTP does) to a server that never answers."""

    protocol = "kilnhangconnect"
    cachable = False

    def __init__(self, *args, **kwargs):
        time.sleep(5)
        super().__init__(*args, **kwargs)


class RefusedConnectFileSystem(MemoryFileSystem):
    protocol = "kilnrefused"
    cachable = False

    def __init__(self, *args, **kwargs):
        raise ConnectionRefusedError(111, "Connection refused")


@pytest.mark.parametrize(
    "fs_class, reason",
    [
        (HangingConnectFileSystem, "no answer within 0.3 s while connecting"),
        (RefusedConnectFileSystem, "Connection refused"),
    ],
)
def test_a_remote_that_cannot_be_connected_to_is_one_warning_within_the_deadline(
    capfd, fs_class, reason
):
    fsspec.register_implementation(fs_class.protocol, fs_class, clobber=True)
    start = time.monotonic()
    remote = RemoteStore(f"{fs_class.protocol}://cache", timeout=0.3)
    assert remote.lookup(KEY) is None
    _upload(remote, b"data")
    assert time.monotonic() - start < 2 and remote.broken
    err = capfd.readouterr().err
    assert err.count("warning") == 1 and reason in err


def test_a_directory_in_a_blobs_place_is_one_bad_object_not_a_dead_remote(tmp_path, capfd):
    remote = RemoteStore(f"file://{tmp_path}/team")
    digest = _upload(remote, b"0123456789")
    blob = tmp_path / "team" / "cas" / digest[:2] / digest
    blob.unlink()
    blob.mkdir()
    reader = RemoteStore(f"file://{tmp_path}/team")
    assert reader.lookup(KEY) is None and not reader.broken
    err = capfd.readouterr().err
    assert err.count("warning") == 1 and KEY in err and "unavailable" not in err
    _upload(reader, b"0123456789")  # the rebuilt output takes the directory's place
    assert RemoteStore(f"file://{tmp_path}/team").lookup(KEY) == {"artifact": b"0123456789"}


class NoBucketFileSystem(MemoryFileSystem):
    """s3fs answers a write into a bucket that does not exist with FileNotFoundError."""

    protocol = "kilnnobucket"

    def pipe_file(self, path, *args, **kwargs):
        raise FileNotFoundError(2, "The specified bucket does not exist", path)


def test_uploading_to_a_missing_bucket_warns_once(capfd):
    fsspec.register_implementation(NoBucketFileSystem.protocol, NoBucketFileSystem, clobber=True)
    remote = RemoteStore("kilnnobucket://teem/kiln", timeout=1)
    assert remote.lookup(KEY) is None and not remote.broken  # reading: only a miss
    _upload(remote, b"data")
    _upload(remote, b"more")
    err = capfd.readouterr().err
    assert err.count("warning") == 1 and "bucket does not exist" in err and remote.broken


def test_a_protocol_no_backend_can_open_is_one_warning_not_an_error(capfd):
    remote = RemoteStore("kilnnosuchprotocol://x/y", timeout=1)
    assert remote.broken and remote.lookup(KEY) is None
    _upload(remote, b"data")
    err = capfd.readouterr().err
    assert err.count("warning") == 1 and "kilnnosuchprotocol" in err
