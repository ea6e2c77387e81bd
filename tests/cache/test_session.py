"""One build's cache session: actions fetched over a network land in the local store at once;
ones read from a directory on this machine's own disk are not copied."""

from __future__ import annotations

import multiprocessing

import pytest

pytest.importorskip("fsspec", reason="the remote cache needs kiln[distributed]")

from kiln.cache.config import CacheConfig  # noqa: E402
from kiln.cache.remote import RemoteStore  # noqa: E402
from kiln.cache.session import FETCHED, HIT, CacheSession, session_for  # noqa: E402
from kiln.cache.store import LocalStore, sha256  # noqa: E402

KEY = "f" * 64


def _team(tmp_path, data: bytes) -> str:
    url = f"file://{tmp_path}/team"
    RemoteStore(url).store(KEY, {"artifact": data}, {"artifact": sha256(data)})
    return url


def _session(tmp_path, url: str, *, network: bool = True) -> CacheSession:
    session = CacheSession(CacheConfig(local_dir=str(tmp_path / "local"), remote=url))
    # tmp_path is on a local disk: a network mount (NFS) of the same directory is not
    session.remote.local_disk = not network
    return session


def test_an_action_fetched_over_a_network_is_in_the_local_store_at_once(tmp_path):
    session = _session(tmp_path, _team(tmp_path, b"edf bytes"))
    assert session.lookup(KEY) == ({"artifact": b"edf bytes"}, FETCHED)
    fetched = session.remote.fetched_bytes
    assert LocalStore(tmp_path / "local").lookup(KEY) == {"artifact": b"edf bytes"}
    assert session.lookup(KEY) == ({"artifact": b"edf bytes"}, HIT)  # no second fetch
    assert session.remote.fetched_bytes == fetched


def test_an_action_read_from_a_local_disk_directory_is_not_copied(tmp_path):
    url = _team(tmp_path, b"edf bytes")
    session = CacheSession(CacheConfig(local_dir=str(tmp_path / "local"), remote=url))
    assert session.remote.local_disk
    assert session.lookup(KEY) == ({"artifact": b"edf bytes"}, FETCHED)
    assert session.lookup(KEY) == ({"artifact": b"edf bytes"}, FETCHED)  # read in place again
    assert LocalStore(tmp_path / "local").lookup(KEY) is None
    assert not list((tmp_path / "local").rglob("cas/*/*"))  # not one blob written twice


def _fetch_in_child(local_dir: str, url: str, queue) -> None:
    session = CacheSession(CacheConfig(local_dir=local_dir, remote=url))
    session.remote.local_disk = False  # as through a network mount
    session.lookup(KEY)
    # a worker process exits without atexit: the fetch is stored before lookup returns
    queue.put(LocalStore(local_dir).lookup(KEY))


def test_a_worker_process_writes_the_fetched_action_at_once(tmp_path):
    url = _team(tmp_path, b"lir bytes")
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_fetch_in_child, args=(str(tmp_path / "local"), url, queue))
    child.start()
    found = queue.get(timeout=60)
    child.join(60)
    assert found == {"artifact": b"lir bytes"}


def test_an_unwritable_local_store_warns_once_and_the_fetch_still_serves(tmp_path, capfd):
    blocker = tmp_path / "local"
    blocker.write_text("a file where the store's directory should be")
    session = _session(tmp_path, _team(tmp_path, b"bytes"))
    assert session.lookup(KEY)[0] == {"artifact": b"bytes"}
    assert session.warned_unwritable
    session.store_failed(NotADirectoryError(20, "Not a directory"))  # said once only
    # on the real stderr: a log record from inside a doit action was never seen
    err = capfd.readouterr().err
    assert err.count("kiln: warning: the artifact cache") == 1, err


def test_one_session_per_configuration(tmp_path):
    config = CacheConfig(local_dir=str(tmp_path / "a"))
    assert session_for(config) is session_for(CacheConfig(local_dir=str(tmp_path / "a")))
    assert session_for(config) is not session_for(CacheConfig(local_dir=str(tmp_path / "b")))
