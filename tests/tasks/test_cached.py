"""Fetch-or-run in the stage action: a hit writes the artifact without numpy or the stages."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from kiln.errors import KilnError


def test_cache_hit_imports_neither_numpy_nor_the_stage(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from kiln.cache.config import CacheConfig
        from kiln.cache.store import LocalStore
        from kiln.tasks.cached import fetch_or_run, stage_key

        base = Path({str(tmp_path)!r})
        (base / "kernel.visa").write_bytes(b"visa text")
        config = CacheConfig(local_dir=str(base / "store"))
        spec = {{
            "root": str(base), "instance": "k.small", "stage": "lir",
            "module": "kiln.stages.lir", "options": {{}}, "machine": {{"sram": 1}},
            "input": str(base / "kernel.visa"), "input_module": "kiln.stages.visa",
            "artifact": str(base / "out" / "kernel.lir"), "dumps": [],
            "cache": config.to_dict(),
        }}
        LocalStore(config.local_dir).store(stage_key(spec), {{"artifact": b"lir bytes"}})

        def must_not_run(spec):
            raise AssertionError("a cache hit ran the stage")

        assert fetch_or_run(spec, must_not_run) == "hit"
        assert (base / "out" / "kernel.lir").read_bytes() == b"lir bytes"
        loaded = [m for m in sys.modules if m == "numpy" or m.startswith("kiln.stages")]
        assert not loaded, loaded
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True)


def test_stage_key_follows_the_input_bytes_not_its_path(tmp_path):
    from kiln.tasks.cached import stage_key

    for name in ("a", "b"):
        (tmp_path / name).write_bytes(b"same bytes")
    spec = {
        "root": str(tmp_path),
        "stage": "lir",
        "module": "kiln.stages.lir",
        "options": {},
        "machine": {},
        "input": str(tmp_path / "a"),
    }
    key = stage_key(spec)
    assert key == stage_key(dict(spec, input=str(tmp_path / "b")))
    (tmp_path / "b").write_bytes(b"other bytes")
    assert key != stage_key(dict(spec, input=str(tmp_path / "b")))
    assert key != stage_key(dict(spec, options={"tile": 8}))


def chain_specs(base, config) -> list[dict]:
    """Two stages of one instance, lir then schedule, chained as compile_tasks chains them."""
    common = {"root": str(base), "instance": "k.small", "options": {}, "machine": {"sram": 1}}
    common.update(dumps=[], cache=config.to_dict())
    lir = dict(common, stage="lir", stage_index=0, module="kiln.stages.lir")
    lir.update(input=str(base / "kernel.visa"), artifact=str(base / "out" / "kernel.lir"))
    sched = dict(common, stage="schedule", stage_index=1, module="kiln.stages.schedule")
    sched.update(input=lir["artifact"], artifact=str(base / "out" / "kernel.sched"))
    chain = [lir, sched]
    for spec in chain:
        spec["chain"] = chain
    return chain


def stored_chain(base) -> list[dict]:
    """chain_specs with both stages' outputs in the local store and nothing built yet."""
    from kiln.tasks.cached import stage_key

    from kiln.cache.config import CacheConfig
    from kiln.cache.store import LocalStore

    (base / "kernel.visa").write_bytes(b"visa text")
    config = CacheConfig(local_dir=str(base / "store"))
    lir, sched = chain_specs(base, config)
    store = LocalStore(config.local_dir)
    store.store(stage_key(lir), {"artifact": b"lir bytes"})
    (base / "out").mkdir()
    (base / "out" / "kernel.lir").write_bytes(b"lir bytes")  # to key the next stage
    store.store(stage_key(sched), {"artifact": b"sched bytes"})
    (base / "out" / "kernel.lir").unlink()
    return [lir, sched]


def test_a_fetched_stage_writes_the_rest_of_its_chain_and_lists_it(tmp_path):
    from kiln.tasks import manifest
    from kiln.tasks.cached import fetch_or_run

    lir, sched = stored_chain(tmp_path)

    def must_not_run(spec):
        raise AssertionError(f"{spec['stage']} ran although the store has it")

    assert fetch_or_run(lir, must_not_run) == "hit"
    # the walk wrote the schedule ahead, and the manifest lists both for the damage check
    assert (tmp_path / "out" / "kernel.sched").read_bytes() == b"sched bytes"
    assert set(manifest.read(str(tmp_path / "out"))) == {"kernel.lir", "kernel.sched"}
    # its own task only checks it: the store is not even asked
    for path in (tmp_path / "store").rglob("*"):
        if path.is_file():
            path.unlink()
    assert fetch_or_run(sched, must_not_run) == "hit"


def test_an_artifact_changed_after_the_walk_is_not_taken_on_trust(tmp_path):
    import os

    from kiln.tasks.cached import fetch_or_run

    lir, sched = stored_chain(tmp_path)
    fetch_or_run(lir, lambda spec: None)
    target = tmp_path / "out" / "kernel.sched"
    (tmp_path / "out" / "edited").write_bytes(b"edited by hand!")
    os.replace(tmp_path / "out" / "edited", target)  # a new file under the artifact's name
    ran = []
    fetch_or_run(sched, lambda spec: ran.append(spec["stage"]))
    # looked up again: the store still has it, so the right bytes come back
    assert ran == [] and target.read_bytes() == b"sched bytes"


def test_an_artifact_edited_in_place_is_rebuilt_not_restored_from_its_blob(tmp_path):
    from kiln.tasks.cached import fetch_or_run

    from kiln.fsutil import write_bytes_atomic

    lir, sched = stored_chain(tmp_path)
    fetch_or_run(lir, lambda spec: None)
    target = tmp_path / "out" / "kernel.sched"
    with open(target, "r+b") as f:  # the same file as its blob in the store
        f.write(b"EDITED BY HAND!")  # longer: seen even where mtimes tick coarsely
    ran = []

    def rebuild(spec):
        ran.append(spec["stage"])
        write_bytes_atomic(spec["artifact"], b"sched bytes")

    # the damaged blob is found out by its digest and never written back
    assert fetch_or_run(sched, rebuild) == "compiled"
    assert ran == ["schedule"] and target.read_bytes() == b"sched bytes"


def test_a_known_digest_is_used_only_while_the_file_is_as_it_was(tmp_path):
    from kiln.tasks import manifest

    from kiln.cache.store import sha256

    artifact = tmp_path / "kernel.edf"
    artifact.write_bytes(b"real bytes")
    st = artifact.stat()
    stat = (st.st_size, st.st_mtime_ns, st.st_ino)
    # the caller's digest is trusted while the stat holds (no second read) ...
    manifest.record_artifacts(
        str(tmp_path), [(str(artifact), [])], known={str(artifact): (stat, "d" * 64)}
    )
    assert manifest.read(str(tmp_path))["kernel.edf"][2] == "d" * 64
    # ... and ignored once the file changed: the manifest hashes what is there
    artifact.write_bytes(b"other bytes!")
    manifest.record_artifacts(
        str(tmp_path), [(str(artifact), [])], known={str(artifact): (stat, "d" * 64)}
    )
    assert manifest.read(str(tmp_path))["kernel.edf"][2] == sha256(b"other bytes!")


def remote_chain(base, side: bytes | None = None) -> list[dict]:
    """visa, lir and schedule of one instance, every action in a team cache at base/team.

    ``side``: a side artifact of the lir stage (``kernel.lir.map``), as stored.
    """
    import pytest

    pytest.importorskip("fsspec", reason="the remote cache needs kiln[distributed]")
    from kiln.tasks.cached import stage_key

    from kiln.cache.config import CacheConfig
    from kiln.cache.remote import RemoteStore
    from kiln.cache.store import sha256

    (base / "graph.json").write_bytes(b"graph bytes")
    url = f"file://{base}/team"
    config = CacheConfig(local_dir=str(base / "store"), remote=url)
    common = {"root": str(base), "instance": "k.small", "options": {}, "machine": {"sram": 1}}
    common.update(dumps=[], cache=config.to_dict())
    chain, previous = [], str(base / "graph.json")
    for index, (stage, artifact) in enumerate(
        [("visa", "kernel.visa"), ("lir", "kernel.lir"), ("schedule", "kernel.sched")]
    ):
        spec = dict(common, stage=stage, stage_index=index, module=f"kiln.stages.{stage}")
        spec.update(input=previous, artifact=str(base / "out" / artifact))
        chain.append(spec)
        previous = spec["artifact"]
    for spec in chain:
        spec["chain"] = chain
    remote = RemoteStore(url)
    digest = None
    for spec in chain:
        outputs = {"artifact": f"{spec['stage']} bytes".encode()}
        if side is not None and spec["stage"] == "lir":
            outputs["side/kernel.lir.map"] = side
        digests = {name: sha256(data) for name, data in outputs.items()}
        remote.store(stage_key(spec, input_digest=digest), outputs, digests)
        digest = digests["artifact"]
    return chain


def must_not_run(spec):
    raise AssertionError(f"{spec['stage']} ran although the remote has it")


def test_a_clone_fetches_a_whole_chain_in_one_remote_trip(tmp_path, monkeypatch):
    from kiln.tasks.cached import fetch_or_run

    chain = remote_chain(tmp_path)
    from kiln.cache.remote import RemoteStore

    trips = []
    real = RemoteStore._call
    monkeypatch.setattr(
        RemoteStore,
        "_call",
        lambda self, what, *a, **kw: trips.append(what) or real(self, what, *a, **kw),
    )
    assert fetch_or_run(chain[0], must_not_run) == "fetched"
    for spec in chain:
        assert open(spec["artifact"], "rb").read() == f"{spec['stage']} bytes".encode()
    # the task's own action, the lir and the schedule actions together
    assert len(trips) == 1, trips


def test_a_clone_stores_each_fetched_action_as_a_link_to_the_file_it_wrote(tmp_path):
    import os

    from kiln.tasks.cached import fetch_or_run, stage_key
    from kiln.tasks.cached_outputs import ROOT_PLACEHOLDER

    from kiln.cache.config import CacheConfig
    from kiln.cache.session import session_for
    from kiln.cache.store import LocalStore, sha256

    portable_map = b'{"file": "' + ROOT_PLACEHOLDER + b'/kernels/k.py"}'
    chain = remote_chain(tmp_path, side=portable_map)
    assert fetch_or_run(chain[0], must_not_run) == "fetched"
    session = session_for(CacheConfig(**chain[0]["cache"]))
    assert session.unkept == {}  # every action held back was stored
    store = LocalStore(tmp_path / "store")
    for spec in chain:
        key = stage_key(spec)
        data = f"{spec['stage']} bytes".encode()
        assert store.get_action(key)["artifact"] == sha256(data)
        blob = store.blob_path(sha256(data))
        # one file, written once: the artifact is the blob
        assert os.path.samefile(blob, spec["artifact"]) and blob.read_bytes() == data
    # the side artifact names this clone's root; its blob keeps the portable bytes
    side = tmp_path / "out" / "kernel.lir.map"
    assert side.read_bytes() == portable_map.replace(ROOT_PLACEHOLDER, str(tmp_path).encode())
    blob = store.blob_path(sha256(portable_map))
    assert blob.read_bytes() == portable_map and not os.path.samefile(blob, side)
    assert store.lookup(stage_key(chain[1]))["side/kernel.lir.map"] == portable_map


def test_a_source_saved_during_its_trace_is_traced_again_and_never_stored_under_its_key(
    tmp_path,
):
    import os

    from kiln.tasks.cached import fetch_or_run, stage_key

    from kiln.cache.config import CacheConfig
    from kiln.cache.store import LocalStore
    from kiln.fsutil import write_bytes_atomic

    source = tmp_path / "k.py"
    source.write_text("version 1")
    config = CacheConfig(local_dir=str(tmp_path / "store"))
    spec = {"root": str(tmp_path), "instance": "k.small", "stage": "trace", "stage_index": 0}
    spec.update(module="kiln.stages.trace", options={}, machine={}, dumps=[])
    spec.update(trace={"module": "k", "function": "k"}, sources=[str(source)])
    spec.update(artifact=str(tmp_path / "out" / "graph.json"), cache=config.to_dict())
    key_v1 = stage_key(spec)
    traced = []

    def trace(spec):
        if not traced:  # an editor saves after the key was made, before the import reads
            source.write_text("version 2!")
            st = source.stat()
            os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        traced.append(source.read_text())
        write_bytes_atomic(spec["artifact"], f"graph of {traced[-1]}".encode())

    assert fetch_or_run(spec, trace) == "compiled"
    # traced again once the file held still: the artifact and doit's record agree
    assert traced == ["version 2!", "version 2!"]
    assert (tmp_path / "out" / "graph.json").read_text() == "graph of version 2!"
    store = LocalStore(config.local_dir)
    assert store.lookup(key_v1) is None  # version 2's graph is not version 1's
    assert store.lookup(stage_key(spec)) == {"artifact": b"graph of version 2!"}

    def always_saving(spec):  # an editor saving on every keystroke, faster than traces
        source.write_text(source.read_text() + "!")
        st = source.stat()
        os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        write_bytes_atomic(spec["artifact"], b"graph of a moving target")

    source.write_text("version 3")  # not in the store: each try traces
    with pytest.raises(KilnError) as info:  # never a graph of no saved version as built
        fetch_or_run(dict(spec, instance="k.other"), always_saving)
    assert "changed during each of 3 traces" in info.value.message
    assert info.value.location.file == str(source)


def test_a_fetched_stage_whose_file_cannot_be_written_is_still_stored(tmp_path):
    from kiln.tasks.cached import fetch_or_run, stage_key

    from kiln.cache.config import CacheConfig
    from kiln.cache.session import session_for
    from kiln.cache.store import LocalStore, sha256

    chain = remote_chain(tmp_path)
    (tmp_path / "out" / "kernel.lir").mkdir(parents=True)  # a directory in the lir's place
    assert fetch_or_run(chain[0], must_not_run) == "fetched"
    session = session_for(CacheConfig(**chain[0]["cache"]))
    assert session.unkept == {}  # nothing fetched is left out of the store
    store = LocalStore(tmp_path / "store")
    digest = sha256(b"visa bytes")
    for spec in chain[1:]:  # the lir that failed, and the schedule fetched with it
        data = f"{spec['stage']} bytes".encode()
        assert store.lookup(stage_key(spec, input_digest=digest)) == {"artifact": data}
        digest = sha256(data)
    assert not (tmp_path / "out" / "kernel.sched").exists()  # the walk stopped there
