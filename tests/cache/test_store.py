"""The local content-addressed store: round trips, damage, LRU gc, verify, concurrent writers."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ProcessPoolExecutor

from kiln.cache.store import LocalStore, sha256


def test_outputs_round_trip_by_content(tmp_path):
    store = LocalStore(tmp_path)
    digests = store.store("k" * 64, {"artifact": b"edf bytes"})
    assert digests == {"artifact": sha256(b"edf bytes")}
    assert store.blob_path(digests["artifact"]).read_bytes() == b"edf bytes"
    assert store.lookup("k" * 64) == {"artifact": b"edf bytes"}
    assert store.lookup("0" * 64) is None


def test_a_bit_flipped_blob_is_dropped_and_never_returned(tmp_path):
    store = LocalStore(tmp_path)
    digest = store.store("a" * 64, {"artifact": b"\x00\x01\x02"})["artifact"]
    store.blob_path(digest).write_bytes(b"\x00\x01\x03")
    assert store.lookup("a" * 64) is None
    assert not store.blob_path(digest).exists()


def test_a_foreign_action_entry_is_a_miss(tmp_path):
    store = LocalStore(tmp_path)
    store.action_path("b" * 64).parent.mkdir(parents=True)
    store.action_path("b" * 64).write_text('{"something": "else"}')
    assert store.lookup("b" * 64) is None


def test_gc_drops_least_recently_used_first(tmp_path):
    store = LocalStore(tmp_path)
    for i, key in enumerate(("1" * 64, "2" * 64, "3" * 64)):
        store.store(key, {"artifact": bytes([i]) * 1000})
        for path in (store.action_path(key), store.blob_path(sha256(bytes([i]) * 1000))):
            os.utime(path, (1000 + i, 1000 + i))
    store.lookup("1" * 64)  # used now: the newest
    entry = store.action_path("1" * 64).stat().st_size
    removed, freed = store.gc(max_bytes=2000 + 3 * entry)
    assert removed >= 1 and freed >= 1000
    assert store.size().bytes <= 2000 + 3 * entry
    assert store.lookup("1" * 64) == {"artifact": b"\x00" * 1000}
    assert store.lookup("2" * 64) is None
    assert store.lookup("3" * 64) == {"artifact": b"\x02" * 1000}


def test_verify_rehashes_and_drops_bad_entries(tmp_path):
    store = LocalStore(tmp_path)
    good = store.store("4" * 64, {"artifact": b"good"})["artifact"]
    bad = store.store("5" * 64, {"artifact": b"bad"})["artifact"]
    store.blob_path(bad).write_bytes(b"bat")
    store.action_path("6" * 64).parent.mkdir(parents=True, exist_ok=True)
    store.action_path("6" * 64).write_text("not json")
    checked, dropped = store.verify()
    assert checked == 5
    assert sorted(dropped) == sorted([str(store.blob_path(bad)), str(store.action_path("6" * 64))])
    assert store.blob_path(good).exists()
    assert store.size().entries == 2 and store.size().blobs == 1


def _write_many(root: str) -> None:
    store = LocalStore(root)
    for _ in range(50):
        store.store("7" * 64, {"artifact": b"x" * 100_000})


def test_concurrent_writers_of_one_key_leave_one_whole_object(tmp_path):
    seen_partial = []

    def read_loop():
        store = LocalStore(tmp_path)
        for _ in range(200):
            found = store.lookup("7" * 64)
            if found is not None and found["artifact"] != b"x" * 100_000:
                seen_partial.append(len(found["artifact"]))

    reader = threading.Thread(target=read_loop)
    reader.start()
    with ProcessPoolExecutor(3) as pool:
        list(pool.map(_write_many, [str(tmp_path)] * 3))
    reader.join()
    assert seen_partial == []
    assert LocalStore(tmp_path).lookup("7" * 64) == {"artifact": b"x" * 100_000}
    assert not [p for p in tmp_path.rglob("*.tmp")]
