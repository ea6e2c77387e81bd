"""Stage source digests cover the compiler modules a stage imports, and nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kiln.tasks.model.digest as digest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def fresh_caches():
    caches = (
        digest.stage_module_info,
        digest._read,
        digest._file_imports,
        digest._subpackage_dir,
        digest._module_file,
    )
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
    assert digest.stage_module_info("kiln.stages.lir")[1] == "kernel.lir"
    assert digest.stage_module_info("kiln.stages.trace")[1] == "graph.json"


def test_editing_an_ir_module_a_stage_imports_changes_its_digest(fresh_caches, monkeypatch):
    names = ("kiln.stages.lir", "kiln.stages.schedule")
    before = {m: digest.stage_module_info(m)[0] for m in names}
    digest.stage_module_info.cache_clear()
    edited(monkeypatch, "kiln/ir/visa.py")  # lir reads vISA; schedule never imports it
    after = {m: digest.stage_module_info(m)[0] for m in names}
    assert after["kiln.stages.lir"] != before["kiln.stages.lir"]
    assert after["kiln.stages.schedule"] == before["kiln.stages.schedule"]


def test_unrelated_modules_leave_the_digest_alone(fresh_caches, monkeypatch):
    before = digest.stage_module_info("kiln.stages.visa")[0]
    digest.stage_module_info.cache_clear()
    edited(monkeypatch, "runners/iree_mlir.py")
    assert digest.stage_module_info("kiln.stages.visa")[0] == before


def test_config_stamps_are_files_named_by_their_content(tmp_path):
    stamps = digest.ConfigStamps(tmp_path / "config")
    a = stamps.path("lir", {"options": "1", "machine": "m"})
    assert a == stamps.path("lir", {"machine": "m", "options": "1"})
    b = stamps.path("lir", {"options": "2", "machine": "m"})
    assert a != b and Path(a).is_file() and Path(b).is_file()
    assert json.loads(Path(a).read_text()) == {"machine": "m", "options": "1"}
    assert digest.read_stamp(b) == {"machine": "m", "options": "2"}
    assert digest.read_stamp(str(tmp_path / "missing.json")) is None


def test_relative_imports_are_followed():
    src = b"from . import visa_plan\nfrom .visa_emit import emit\nfrom ..ir import lir\n"
    found = digest._imports(src, "kiln.stages.visa", is_package=False)
    assert {"kiln.stages.visa_plan", "kiln.stages.visa_emit", "kiln.stages.visa_emit.emit"} <= found
    assert {"kiln.ir", "kiln.ir.lir"} <= found
    inside_package = digest._imports(b"from .load import x\n", "kiln.pipeline", is_package=True)
    assert "kiln.pipeline.load" in inside_package


def test_a_relative_import_of_a_compiler_module_is_in_the_digest(fresh_caches, monkeypatch):
    """A stage that reaches an IR module only through a relative import still covers it."""
    real = digest._read.__wrapped__
    stage = str(REPO / "stages" / "schedule.py")

    def fake(path: str) -> bytes:
        data = real(path)
        return data + b"\nfrom ..ir import visa_text\n" if path == stage else data

    monkeypatch.setattr(digest, "_read", fake)
    before = digest.stage_module_info("kiln.stages.schedule")[0]
    digest.stage_module_info.cache_clear()
    edited_read = digest._read

    def fake_edit(path: str) -> bytes:
        data = edited_read(path)
        return data + b"\n# edited\n" if path.endswith("visa_text.py") else data

    monkeypatch.setattr(digest, "_read", fake_edit)
    assert digest.stage_module_info("kiln.stages.schedule")[0] != before


def test_digest_names_files_by_module_not_by_path(fresh_caches, monkeypatch, tmp_path):
    """The same bytes found at another path (a wheel, a copy of the checkout) give one digest."""
    before = digest.stage_module_info("kiln.stages.edf")[0]
    copy = tmp_path / "elsewhere" / "stages"
    copy.mkdir(parents=True)
    for f in (REPO / "stages").glob("*.py"):
        (copy / f.name).write_bytes(f.read_bytes())
    real_dir = digest._subpackage_dir.__wrapped__
    monkeypatch.setattr(
        digest, "_subpackage_dir", lambda n: str(copy) if n == "kiln.stages" else real_dir(n)
    )
    digest._module_file.cache_clear()
    digest.stage_module_info.cache_clear()
    assert digest._module_file("kiln.stages.edf") == str(copy / "edf.py")
    assert digest.stage_module_info("kiln.stages.edf")[0] == before
