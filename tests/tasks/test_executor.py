"""Choosing the executor, and what a worker refuses."""

from __future__ import annotations

import importlib.util

import pytest
from kiln.tasks.executor import resolve_executor

from kiln.errors import KilnError


def test_local_is_the_default(monkeypatch):
    monkeypatch.delenv("KILN_EXECUTOR", raising=False)
    assert resolve_executor({}, ".") is None


def test_flags_override_the_file(monkeypatch):
    pytest.importorskip("distributed", reason="the dask executor needs kiln[distributed]")
    monkeypatch.setenv("KILN_EXECUTOR", "dask")
    monkeypatch.setenv("KILN_SCHEDULER", "tcp://10.1.2.3:8786")
    monkeypatch.setenv("KILN_JOBS", "3")
    found = resolve_executor({"kind": "local", "address": "tcp://other:1"}, ".")
    assert found == {"kind": "dask", "address": "tcp://10.1.2.3:8786", "workers": 3}


def test_dask_without_the_extra_is_one_message_naming_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "distributed" else real(name, *a),
    )
    monkeypatch.delenv("KILN_EXECUTOR", raising=False)
    with pytest.raises(KilnError) as info:
        resolve_executor({"kind": "dask"}, ".")
    assert "kiln[distributed]" in info.value.hint


def test_worker_refuses_a_client_with_other_stage_code():
    from kiln.tasks.chain_worker import run_chain

    payload = {
        "stages": [{"stage": "lir", "module": "kiln.stages.lir", "code": "0" * 16}],
        "machine": {},
        "input": b"",
        "input_module": "kiln.stages.visa",
    }
    result = run_chain(payload)
    assert "kiln.stages.lir" in result["refused"] and "0" * 16 in result["refused"]


def test_a_worker_takes_each_stage_input_from_bytes_as_read_takes_it_from_its_file(
    project, tmp_path_factory
):
    import importlib
    import types

    from kiln.tasks.chain_worker import _take_input

    from tests.conftest import run_kiln

    run_kiln(project, "compile", "vector_add", check=True)
    out = next(p.parent for p in (project / "build").rglob("kernel.edf"))
    work = tmp_path_factory.mktemp("worker")
    for module, name in (
        ("kiln.stages.trace", "graph.json"),
        ("kiln.stages.visa", "kernel.visa"),
        ("kiln.stages.lir", "kernel.lir"),
        ("kiln.stages.schedule", "kernel.sched"),
    ):
        stage = importlib.import_module(module)
        data = (out / name).read_bytes()
        assert _take_input(stage, data, work, 1) == stage.read(out / name), module
        # a stage without decode (a user's own) still works: through a file and read
        plain = types.SimpleNamespace(read=stage.read)
        assert _take_input(plain, data, work, 1) == stage.read(out / name), module
