"""Fetch-or-run in the stage action: a hit writes the artifact without numpy or the stages."""

from __future__ import annotations

import subprocess
import sys
import textwrap


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
