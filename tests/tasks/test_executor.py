"""Choosing the executor, and what a worker refuses."""

from __future__ import annotations

import importlib.util

import pytest
from kiln.tasks import executor
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
    assert found == {
        "kind": "dask",
        "address": "tcp://10.1.2.3:8786",
        "workers": 3,
        "source": "KILN_SCHEDULER",
    }


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("KILN_EXECUTOR", "KILN_SCHEDULER", "KILN_JOBS"):
        monkeypatch.setenv(name, "")  # recorded, so what note_flag sets is undone too
        monkeypatch.delenv(name)
    monkeypatch.setattr(executor, "_from_flags", {})
    return monkeypatch


def error_of(settings=None) -> KilnError:
    with pytest.raises(KilnError) as info:
        resolve_executor(settings or {}, ".")
    return info.value


@pytest.mark.parametrize("value", ["abc", "0", "-1", "2.5", "99999"])
def test_a_bad_kiln_jobs_is_one_message_naming_it(clean_env, value):
    pytest.importorskip("distributed")
    clean_env.setenv("KILN_JOBS", value)
    err = error_of({"kind": "dask"})
    assert err.message == "KILN_JOBS is not a worker count" and err.found == value


def test_a_bad_n_flag_names_the_flag(clean_env):
    pytest.importorskip("distributed")
    executor.note_flag("KILN_JOBS", "-n", "0")
    err = error_of({"kind": "dask"})
    assert err.message == "-n is not a worker count" and "-n" in err.hint


def test_kiln_jobs_is_not_read_by_a_local_build(clean_env):
    clean_env.setenv("KILN_JOBS", "abc")
    assert resolve_executor({}, ".") is None


@pytest.mark.parametrize(
    "address",
    ["notaurl", "tcp://host", "tcp://host:0", "tcp://host:99999", "ftp://host:1", "tcp://"],
)
def test_a_bad_address_is_one_message_naming_where_it_came_from(clean_env, address):
    pytest.importorskip("distributed")
    err = error_of({"kind": "dask", "address": address})
    assert err.message == "executor.address in pipeline.yaml is not a Dask scheduler address"
    assert err.found == address and "tcp://HOST:PORT" in err.expected
    clean_env.setenv("KILN_SCHEDULER", address)
    assert error_of().message.startswith("KILN_SCHEDULER is not")
    executor.note_flag("KILN_SCHEDULER", "--scheduler", address)
    assert error_of().message.startswith("--scheduler is not")


@pytest.mark.parametrize(
    "address", ["tcp://127.0.0.1:8786", "tls://sched.example:8786", "tcp://[::1]:1", "inproc://x"]
)
def test_good_addresses_pass(clean_env, address):
    pytest.importorskip("distributed")
    assert resolve_executor({"address": address}, ".")["address"] == address


def test_an_address_in_the_file_implies_dask_as_the_flag_does(clean_env):
    pytest.importorskip("distributed")
    found = resolve_executor({"address": "tcp://h:8786"}, ".")
    assert found["kind"] == "dask" and found["source"] == "executor.address in pipeline.yaml"


def test_an_address_with_kind_local_is_an_error(clean_env):
    err = error_of({"kind": "local", "address": "tcp://h:8786"})
    assert "executor.kind is local" in err.message
    clean_env.setenv("KILN_EXECUTOR", "local")  # the environment overrides the file
    assert resolve_executor({"kind": "local", "address": "tcp://h:8786"}, ".") is None


def test_local_executor_with_a_scheduler_is_an_error(clean_env):
    executor.note_flag("KILN_EXECUTOR", "--executor", "local")
    executor.note_flag("KILN_SCHEDULER", "--scheduler", "tcp://h:1")
    err = error_of()
    assert "--scheduler" in err.message and "--executor" in err.message


def test_an_unknown_executor_names_kiln_executor_and_case_does_not_matter(clean_env):
    clean_env.setenv("KILN_EXECUTOR", "ray")
    err = error_of()
    assert "KILN_EXECUTOR" in err.message and err.found == "ray"
    clean_env.setenv("KILN_EXECUTOR", "Local")
    assert resolve_executor({"kind": "dask"}, ".") is None


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


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"executor": None, "scheduler": ""}, "--scheduler is empty"),
        ({"executor": "local", "scheduler": "tcp://h:1"}, "--executor local"),
    ],
)
def test_contradictory_or_empty_executor_flags_are_errors(clean_env, flags, message):
    import argparse

    from kiln.commands_cache import apply_executor_flags

    with pytest.raises(KilnError) as info:
        apply_executor_flags(argparse.Namespace(process=None, **flags))
    assert message in info.value.message


def test_n_zero_with_dask_is_rejected_naming_the_flag(clean_env):
    pytest.importorskip("distributed")
    import argparse

    from kiln.commands_cache import apply_executor_flags

    args = argparse.Namespace(executor="dask", scheduler=None, process=0)
    apply_executor_flags(args)
    assert error_of().message == "-n is not a worker count"
    args = argparse.Namespace(executor=None, scheduler=None, process=None)
    apply_executor_flags(args)  # -n not given: the default, and args.process is 0 again
    assert args.process == 0


def test_dask_with_the_store_turned_off_is_an_error_not_a_silent_local_build(clean_env):
    # chains reach Dask only through the store: KILN_CACHE=0 built everything here, unsaid
    pytest.importorskip("distributed")
    clean_env.setenv("KILN_CACHE", "0")
    err = error_of({"kind": "dask", "address": "tcp://127.0.0.1:1"})
    assert "KILN_CACHE" in err.message and err.found == "KILN_CACHE=0"
    # kiln tune gets its trials back from Dask directly: the store may be off
    found = resolve_executor({"kind": "dask"}, ".", via_store=False)
    assert found is not None and found["kind"] == "dask"
