"""Stage source digests cover the compiler modules a stage imports, and nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tasks.digest as digest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh_caches():
    caches = (digest.stage_module_info, digest._read, digest._file_imports, digest._package_dir)
    for fn in caches:
        fn.cache_clear()
    yield
    for fn in caches:
        fn.cache_clear()


def edited(monkeypatch, relative: str) -> None:
    """Pretend one source file of the repo has changed."""
    target = str(REPO / relative)
    real = digest._read.__wrapped__

    def fake(path: str) -> bytes:
        data = real(path)
        return data + b"\n# edited\n" if path == target else data

    monkeypatch.setattr(digest, "_read", fake)


def test_imports_include_from_import_names_and_parenthesized_lists():
    src = (
        b"import kiln.ir.graph\n"
        b"from kiln.ir import (\n    visa,\n    lir as l,\n)\n"
        b"from x import y\n"
    )
    found = digest._imports(src)
    assert {"kiln.ir.graph", "kiln.ir", "kiln.ir.visa", "kiln.ir.lir", "x", "x.y"} <= found


def test_artifact_name_is_read_from_the_module(fresh_caches):
    assert digest.stage_module_info("stages.lir")[1] == "kernel.lir"
    assert digest.stage_module_info("stages.trace")[1] == "graph.json"


def test_editing_an_ir_module_a_stage_imports_changes_its_digest(fresh_caches, monkeypatch):
    before = {m: digest.stage_module_info(m)[0] for m in ("stages.lir", "stages.schedule")}
    digest.stage_module_info.cache_clear()
    edited(monkeypatch, "kiln/ir/visa.py")  # lir reads vISA; schedule never imports it
    after = {m: digest.stage_module_info(m)[0] for m in ("stages.lir", "stages.schedule")}
    assert after["stages.lir"] != before["stages.lir"]
    assert after["stages.schedule"] == before["stages.schedule"]


def test_unrelated_modules_leave_the_digest_alone(fresh_caches, monkeypatch):
    before = digest.stage_module_info("stages.visa")[0]
    digest.stage_module_info.cache_clear()
    edited(monkeypatch, "runners/iree_mlir.py")
    assert digest.stage_module_info("stages.visa")[0] == before


def test_config_stamps_are_files_named_by_their_content(tmp_path):
    stamps = digest.ConfigStamps(tmp_path / "config")
    a = stamps.path("lir", {"options": "1", "machine": "m"})
    assert a == stamps.path("lir", {"machine": "m", "options": "1"})
    b = stamps.path("lir", {"options": "2", "machine": "m"})
    assert a != b and Path(a).is_file() and Path(b).is_file()
    assert json.loads(Path(a).read_text()) == {"machine": "m", "options": "1"}
    assert digest.read_stamp(b) == {"machine": "m", "options": "2"}
    assert digest.read_stamp(str(tmp_path / "missing.json")) is None
