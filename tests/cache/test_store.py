"""The local content-addressed store: round trips, damage, LRU gc, verify, concurrent writers."""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ProcessPoolExecutor

import pytest

from kiln.cache.store import LocalStore, default_cache_dir, parse_action_entry, sha256


def test_outputs_round_trip_by_content(tmp_path):
    store = LocalStore(tmp_path)
    digests = store.store("k" * 64, {"artifact": b"edf bytes"})
    assert digests == {"artifact": sha256(b"edf bytes")}
    assert store.blob_path(digests["artifact"]).read_bytes() == b"edf bytes"
    assert store.lookup("k" * 64) == {"artifact": b"edf bytes"}
    assert store.lookup("0" * 64) is None


def test_a_tilde_in_kiln_cache_dir_is_the_home_directory(monkeypatch, tmp_path):
    # a CI file's env: block passes ~ literally: the store went into ./~/ in the checkout
    from kiln.runners.iree import cache_dir

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KILN_CACHE_DIR", "~/ci-cache")
    assert default_cache_dir() == tmp_path / "ci-cache"
    assert cache_dir() == tmp_path / "ci-cache" / "iree"


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


def test_gc_keeps_a_blob_while_an_entry_still_names_it(tmp_path):
    store = LocalStore(tmp_path / "store")
    shared, own = b"s" * 4000, b"o" * 1000
    store.store("1" * 64, {"artifact": shared, "side/map": own})
    store.store("2" * 64, {"artifact": shared})
    orphan = store.put_blob(b"x" * 3000)  # a blob no entry names (a build killed mid-store)
    for path, when in (
        (store.blob_path(orphan), 900),
        (store.action_path("1" * 64), 1000),
        (store.action_path("2" * 64), 2000),
    ):
        os.utime(path, (when, when))
    entry = store.action_path("2" * 64).stat().st_size
    first_entry = store.action_path("1" * 64).stat().st_size
    removed, freed = store.gc(max_bytes=4000 + entry)
    assert not store.blob_path(orphan).exists()  # the oldest
    assert store.lookup("1" * 64) is None
    assert not store.blob_path(sha256(own)).exists()  # only entry 1 named it
    assert store.lookup("2" * 64) == {"artifact": shared}  # still named by entry 2
    assert (removed, freed) == (3, 3000 + first_entry + 1000)


GOOD = "a" * 64


@pytest.mark.parametrize(
    "outputs",
    [
        {"artifact": "../../../../tmp/victim_" + "a" * 41},  # a path dressed as a digest
        {"artifact": "A" * 64},  # not lower-case hex
        {"artifact": GOOD, "side/../../../escaped": GOOD},  # climbs out of the out dir
        {"artifact": GOOD, "side/sub/dir.json": GOOD},
        {"artifact": GOOD, "side/..": GOOD},
        {"artifact": GOOD, "side/": GOOD},
        {"notartifact": GOOD},  # no output Kiln writes
        {"artifact": GOOD, "report": GOOD},  # two primary outputs
        {"report": GOOD, "side/graph.map.json": GOOD},  # side artifacts belong to an artifact
        {},
    ],
)
def test_an_entry_naming_paths_or_foreign_outputs_is_not_ours(outputs):
    assert parse_action_entry(json.dumps({"outputs": outputs}).encode()) is None


@pytest.mark.parametrize(
    "outputs",
    [
        {"artifact": GOOD},
        {"artifact": GOOD, "side/graph.map.json": "b" * 64, "side/my map (1).json": GOOD},
        {"report": GOOD},
        {"vmfb": GOOD},
    ],
)
def test_entries_kiln_writes_are_ours(outputs):
    assert parse_action_entry(json.dumps({"outputs": outputs}).encode()) == outputs


def test_a_damaged_entry_naming_a_path_never_deletes_that_file(tmp_path):
    store = LocalStore(tmp_path / "store")
    # cas/<digest[:2]>/<digest> with digest "../outside/victim_aaa..." is tmp_path/outside/...
    digest = "../outside/victim_".ljust(64, "a")
    victim = tmp_path / "outside" / digest.rsplit("/", 1)[1]
    victim.parent.mkdir()
    victim.write_text("precious\n")
    (tmp_path / "store" / "cas").mkdir(parents=True)
    assert os.path.samefile(store._blob_file(digest), victim)  # noqa: SLF001 (the trap is real)
    entry = store.action_path(GOOD)
    entry.parent.mkdir(parents=True)
    entry.write_text(json.dumps({"outputs": {"artifact": digest}}))
    assert store.lookup(GOOD) is None
    assert victim.read_text() == "precious\n"
    assert not entry.exists()  # the damaged entry goes, not a file it names


def test_directories_in_the_place_of_a_blob_or_an_entry_are_cleared(tmp_path):
    store = LocalStore(tmp_path)
    digest = sha256(b"edf")
    store.blob_path(digest).mkdir(parents=True)
    (store.blob_path(digest) / "junk").write_text("x")
    store.action_path(GOOD).mkdir(parents=True)
    store.store(GOOD, {"artifact": b"edf"})  # stores over both, no error
    assert store.lookup(GOOD) == {"artifact": b"edf"}
    other = sha256(b"other")
    store.blob_path(other).mkdir(parents=True)
    checked, dropped = store.verify()
    assert dropped == [str(store.blob_path(other))]
    assert not store.blob_path(other).exists() and store.lookup(GOOD) == {"artifact": b"edf"}
