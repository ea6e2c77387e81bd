"""The project's own modules never run from bytecode older than their source."""

from __future__ import annotations

import importlib
import os
import sys
import time

from kiln.tasks.model.importpath import (
    FreshSourceLoader,
    add_project_root,
    holds_project_modules,
)
from tests.conftest import run_kiln


def _same_second(path, second: int, fraction_ns: int) -> None:
    """Give ``path`` an mtime inside ``second``: Python's .pyc check sees only the second."""
    stamp = second * 1_000_000_000 + fraction_ns
    os.utime(path, ns=(stamp, stamp))


def test_a_second_save_of_the_same_size_within_one_second_is_traced_from_source(tmp_path):
    """Save 3.0, build (its .pyc is written), save 4.0 in the same second: 4.0 is traced.

    The second is a little in the future, as a save's is after the .pyc a build wrote."""
    run_kiln(tmp_path, "init", "proj", check=True)
    project = tmp_path / "proj"
    env = {"PYTHONDONTWRITEBYTECODE": ""}  # a user's shell: Python writes .pyc files
    source = project / "kernels/example.py"
    second = int(time.time()) + 30
    graph = project / "build/kiln/kernel/scale_add/small/graph.json"
    for constant, fraction in (("3.0", 100_000_000), ("4.0", 200_000_000)):
        text = source.read_text()
        source.write_text(
            text.replace("return 2.0 * x", f"return {constant} * x", 1)
            if "2.0" in text
            else text.replace("return 3.0 * x", f"return {constant} * x", 1)
        )
        _same_second(source, second, fraction)
        run_kiln(project, "compile", "-q", env=env, check=True)
        assert f'"value": {constant}' in graph.read_text()
    assert list((project / "kernels/__pycache__").glob("example.*.pyc"))  # bytecode was written
    run_kiln(project, "test", "scale_add", "--target", "sim", env=env, check=True)


def test_only_directories_of_the_project_get_the_fresh_loader(tmp_path, monkeypatch):
    venv_site = tmp_path / ".venv/lib/site-packages"
    (tmp_path / "pkg").mkdir()
    venv_site.mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [str(venv_site), *sys.path])
    monkeypatch.setattr(sys, "path_hooks", list(sys.path_hooks))
    monkeypatch.setattr(sys, "path_importer_cache", dict(sys.path_importer_cache))
    add_project_root(tmp_path)
    assert holds_project_modules(str(tmp_path))
    assert holds_project_modules(str(tmp_path / "pkg"))
    assert not holds_project_modules(str(venv_site))  # its own sys.path entry claims it
    assert not holds_project_modules(str(venv_site / "numpy"))
    assert not holds_project_modules(os.path.dirname(os.__file__))


def test_the_fresh_loader_drops_bytecode_written_before_its_source(tmp_path, monkeypatch):
    module = tmp_path / "kiln_fresh_probe.py"
    module.write_text("VALUE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    loader = FreshSourceLoader("kiln_fresh_probe", str(module))
    loader.get_code("kiln_fresh_probe")  # writes the .pyc
    cached = importlib.util.cache_from_source(str(module))
    assert os.path.exists(cached)
    module.write_text("VALUE = 4\n")  # same size
    stamp = os.stat(cached).st_mtime_ns + 1_000  # saved after the .pyc, maybe in its second
    os.utime(module, ns=(stamp, stamp))
    namespace: dict = {}
    exec(loader.get_code("kiln_fresh_probe"), namespace)  # noqa: S102
    assert namespace["VALUE"] == 4
