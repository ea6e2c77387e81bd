"""One build's cache session: fetched actions land in the local store, behind the build."""

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


def _session(tmp_path, url: str) -> CacheSession:
    return CacheSession(CacheConfig(local_dir=str(tmp_path / "local"), remote=url))


def test_a_fetched_action_is_in_the_local_store_at_once(tmp_path):
    session = _session(tmp_path, _team(tmp_path, b"edf bytes"))
    assert session.lookup(KEY) == ({"artifact": b"edf bytes"}, FETCHED)
    fetched = session.remote.fetched_bytes
    assert LocalStore(tmp_path / "local").lookup(KEY) == {"artifact": b"edf bytes"}
    assert session.lookup(KEY) == ({"artifact": b"edf bytes"}, HIT)  # no second fetch
    assert session.remote.fetched_bytes == fetched
    session.flush()  # no walk under way: returns at once


def test_a_fetch_held_back_is_stored_once_its_files_are_written(tmp_path):
    import os

    session = _session(tmp_path, _team(tmp_path, b"edf bytes"))
    fetched, how = session.lookup(KEY, keep=False)
    assert (fetched, how) == ({"artifact": b"edf bytes"}, FETCHED)
    assert session.held_back(KEY, fetched) == {"artifact": sha256(b"edf bytes")}
    assert session.held_back(KEY, {"artifact": b"edf bytes"}) is None  # not those very bytes
    store = LocalStore(tmp_path / "local")
    assert store.lookup(KEY) is None and KEY in session.unkept
    artifact = tmp_path / "kernel.edf"
    artifact.write_bytes(b"edf bytes")
    st = os.stat(artifact)
    source = (str(artifact), (st.st_size, st.st_mtime_ns, st.st_ino))
    session.keep_written(KEY, fetched, {"artifact": source})
    assert store.lookup(KEY) == {"artifact": b"edf bytes"} and session.unkept == {}
    assert os.path.samefile(store.blob_path(sha256(b"edf bytes")), artifact)
    session.keep_written(KEY, {"artifact": b"other bytes"})  # not held back: nothing stored
    assert store.lookup(KEY) == {"artifact": b"edf bytes"}


def test_a_held_back_action_kept_after_other_bytes_were_written_stores_what_was_fetched(
    tmp_path,
):
    import os

    session = _session(tmp_path, _team(tmp_path, b"edf bytes"))
    session.lookup(KEY, keep=False)
    artifact = tmp_path / "kernel.edf"
    artifact.write_bytes(b"EDF built elsewhere")
    st = os.stat(artifact)
    source = (str(artifact), (st.st_size, st.st_mtime_ns, st.st_ino))
    session.keep_written(KEY, {"artifact": b"EDF built elsewhere"}, {"artifact": source})
    store = LocalStore(tmp_path / "local")
    assert store.lookup(KEY) == {"artifact": b"edf bytes"}  # the verified fetch, copied
    assert not os.path.samefile(store.blob_path(sha256(b"edf bytes")), artifact)


def _fetch_in_child(local_dir: str, url: str, queue) -> None:
    session = CacheSession(CacheConfig(local_dir=local_dir, remote=url))
    session.lookup(KEY)
    # no flush: a worker process of -n N exits without atexit
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
    session.flush()
    assert session.warned_unwritable
    session.store_failed(NotADirectoryError(20, "Not a directory"))  # said once only
    # on the real stderr: a log record from inside a doit action was never seen
    err = capfd.readouterr().err
    assert err.count("kiln: warning: the artifact cache") == 1, err


def test_one_session_per_configuration(tmp_path):
    config = CacheConfig(local_dir=str(tmp_path / "a"))
    assert session_for(config) is session_for(CacheConfig(local_dir=str(tmp_path / "a")))
    assert session_for(config) is not session_for(CacheConfig(local_dir=str(tmp_path / "b")))
