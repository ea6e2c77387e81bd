"""Choosing the executor, and what a worker refuses."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import pytest

from kiln.errors import KilnError
from kiln.tasks.execution import executor
from kiln.tasks.execution.executor import resolve_executor


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


@pytest.mark.parametrize("settings", [None, {"kind": "local"}])
def test_a_bad_kiln_jobs_is_refused_with_the_local_executor_too(clean_env, settings):
    clean_env.setenv("KILN_JOBS", "abc")
    err = error_of(settings)
    assert err.message == "KILN_JOBS is not a worker count" and err.found == "abc"


def test_a_bad_n_flag_names_the_flag(clean_env):
    pytest.importorskip("distributed")
    executor.note_flag("KILN_JOBS", "-n", "0")
    err = error_of({"kind": "dask"})
    assert err.message == "-n is not a worker count" and "-n" in err.hint


@pytest.mark.parametrize("value", ["0", "4"])
def test_a_whole_kiln_jobs_is_not_read_by_a_local_build(clean_env, value):
    clean_env.setenv("KILN_JOBS", value)
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
    assert "kiln-kernels[distributed]" in info.value.hint


def test_worker_refuses_a_client_with_other_stage_code():
    from kiln.driver import BuildInfo, ChainSpec, StageSpec, TraceSpec
    from kiln.tasks.chain.instance_spec import ChainJob, batch_to_wire
    from kiln.tasks.execution.chain_worker import decode_result, run_jobs

    chain = ChainSpec(
        instance="k.small",
        trace=TraceSpec(module="kernels.k", function="k", bindings=(("N", 4),)),
        stages=(
            StageSpec(
                name="lir",
                module="kiln.stages.lir",
                options="{}",
                code="0" * 16,
                artifact="kernel.lir",
            ),
        ),  # fmt: skip
        machine="{}",
        build=BuildInfo(kernel="kernels/k.py", shapes="small", compiler="c"),
    )
    # a job from another machine carries its sources: a worker checks the stage code first
    job = ChainJob(chain=chain, digests=(("kernels/k.py", "0" * 64),), sources=(("k.py", b""),))
    result, pid, refused = decode_result(run_jobs(batch_to_wire([job]))[0])
    assert result is None and pid == 0
    assert "kiln.stages.lir" in refused and "0" * 16 in refused


def compiled_vector_add(project):
    """(its InstanceSpec, its out dir) after a `kiln compile vector_add` of ``project``."""
    from doit.loader import generate_tasks

    from kiln.tasks.dag.compile import compile_tasks, instance_spec
    from kiln.tasks.model.project import Project
    from tests.conftest import run_kiln

    run_kiln(project, "compile", "vector_add", check=True)
    found = Project(project / "pipeline.yaml")
    (inst,) = [i for i in found.instances if i.name == "vector_add.small"]
    (task,) = [t for t in generate_tasks("compile", compile_tasks(found, [inst])) if t.actions]
    spec = instance_spec(task)
    return spec, Path(spec.out_dir)


def test_a_worker_takes_each_stage_input_from_bytes_as_read_takes_it_from_its_file(project):
    import types

    from kiln.driver import DECODE, Stage

    _, out = compiled_vector_add(project)
    for module, name in (
        ("kiln.stages.trace", "graph.json"),
        ("kiln.stages.visa", "kernel.visa"),
        ("kiln.stages.lir", "kernel.lir"),
        ("kiln.stages.schedule", "kernel.sched"),
    ):
        stage = Stage.load(module)
        data = (out / name).read_bytes()
        expected = stage.module.read(out / name)
        assert stage.decode(data, name) == expected, module
        # a stage without decode (a user's own) still works: through a file and read
        plain = Stage(types.SimpleNamespace(read=stage.module.read), frozenset())
        assert DECODE not in plain.capabilities
        assert plain.decode(data, name) == expected, module


@pytest.fixture
def project_imports(monkeypatch):
    """run_jobs imports the project's kernels in this process, as a pool worker does: undone."""
    import sys

    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.partition(".")[0] == "kernels":
            del sys.modules[name]


def test_a_pool_job_keeps_every_stage_the_record_vouches_for(project, project_imports):
    from kiln.tasks.chain import chain_record
    from kiln.tasks.chain.instance_spec import ChainJob, batch_to_wire, source_digests
    from kiln.tasks.execution.chain_worker import decode_result, run_jobs

    spec, out = compiled_vector_add(project)
    known = chain_record.read(str(out))
    assert list(known) == ["trace", "visa", "lir", "schedule", "edf"]
    digests = tuple(sorted(source_digests(spec).items()))
    job = ChainJob(
        chain=spec.chain, digests=digests, root=spec.root, out_dir=spec.out_dir,
        known=tuple(known.values()),
    )  # fmt: skip
    result, pid, refused = decode_result(run_jobs(batch_to_wire([job]))[0])
    assert refused is None and pid > 0
    # early cutoff in the worker: nothing ran, nothing to write, the same records
    assert result.ran == [] and result.files == {}
    assert result.records == list(known.values())
    # with no record, the whole chain runs and makes the very bytes the build wrote
    fresh = ChainJob(chain=spec.chain, digests=digests, root=spec.root, out_dir=spec.out_dir)
    result, _, _ = decode_result(run_jobs(batch_to_wire([fresh]))[0])
    assert result.ran == ["trace", "visa", "lir", "schedule", "edf"]
    for stage in spec.chain.stages:
        assert result.files[stage.artifact] == (out / stage.artifact).read_bytes()


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"executor": None, "scheduler": ""}, "--scheduler is empty"),
        ({"executor": "local", "scheduler": "tcp://h:1"}, "--executor local"),
    ],
)
def test_contradictory_or_empty_executor_flags_are_errors(clean_env, flags, message):
    import argparse

    from kiln.cli.cache_commands import apply_executor_flags

    with pytest.raises(KilnError) as info:
        apply_executor_flags(argparse.Namespace(process=None, **flags))
    assert message in info.value.message


def test_n_zero_with_dask_is_rejected_naming_the_flag(clean_env):
    pytest.importorskip("distributed")
    import argparse

    from kiln.cli.cache_commands import apply_executor_flags

    args = argparse.Namespace(executor="dask", scheduler=None, process=0)
    apply_executor_flags(args)
    assert error_of().message == "-n is not a worker count"
    args = argparse.Namespace(executor=None, scheduler=None, process=None)
    apply_executor_flags(args)  # -n not given: the default, and args.process is 0 again
    assert args.process == 0


def test_dask_with_the_store_turned_off_is_accepted(clean_env):
    # a chain's files come back from the worker directly, not through the store
    pytest.importorskip("distributed")
    clean_env.setenv("KILN_CACHE", "0")
    found = resolve_executor({"kind": "dask", "address": "tcp://127.0.0.1:1"}, ".")
    assert found is not None and found["address"] == "tcp://127.0.0.1:1"


def test_chains_go_in_batches_large_first_smaller_towards_the_end():
    from kiln.tasks.execution.ahead import MAX_BATCH, batch_sizes

    assert batch_sizes(0, 2) == []
    assert batch_sizes(1, 2) == [1]
    assert batch_sizes(7, 2) == [1] * 7  # too few to share: one chain per task
    assert batch_sizes(80, 2)[:3] == [10, 8, 7]  # a quarter of what is left per worker
    sizes = batch_sizes(1500, 2)
    assert sum(sizes) == 1500
    assert sizes[0] == MAX_BATCH  # a round trip per task: large while many are left
    assert sizes == sorted(sizes, reverse=True)
    assert sizes[-8:] == [1] * 8  # the workers finish together
    assert len(sizes) < 100
    assert sum(batch_sizes(100, 0)) == 100


def test_a_batch_answers_each_chain_in_its_order():
    from kiln.driver import BuildInfo, ChainSpec, StageSpec, TraceSpec
    from kiln.tasks.chain.instance_spec import ChainJob, batch_to_wire
    from kiln.tasks.execution.chain_worker import decode_result, run_jobs

    def job(code: str) -> ChainJob:
        stage = StageSpec(
            name="lir", module="kiln.stages.lir", options="{}", code=code, artifact="kernel.lir"
        )
        chain = ChainSpec(
            instance=f"k.{code[0]}",
            trace=TraceSpec(module="kernels.k", function="k", bindings=(("N", 4),)),
            stages=(stage,),
            machine="{}",
            build=BuildInfo(kernel="kernels/k.py", shapes="small", compiler="c"),
        )
        sources = (("k.py", b""),)
        return ChainJob(chain=chain, digests=(("k.py", "0" * 64),), sources=sources)

    wire = batch_to_wire([job("1" * 16), job("2" * 16)])
    answers = [decode_result(data)[2] for data in run_jobs(wire)]
    assert len(answers) == 2
    assert "1" * 16 in answers[0] and "2" * 16 in answers[1]


def test_a_batch_carries_each_source_file_once():
    """Every instance of a module sends it: the batch holds its bytes once, shared again."""
    from kiln.driver import BuildInfo, ChainSpec, TraceSpec
    from kiln.tasks.chain.instance_spec import ChainJob, batch_from_wire, batch_to_wire

    module = b"# kernels\n" * 20_000  # 200 KB, as a module of many kernels
    other = b"# another module\n"

    def job(name: str, files) -> ChainJob:
        chain = ChainSpec(
            instance=name,
            trace=TraceSpec(module="kernels.k", function=name, bindings=(("N", 4),)),
            stages=(),
            machine="{}",
            build=BuildInfo(kernel="kernels/k.py", shapes="small", compiler="c"),
        )
        return ChainJob(chain=chain, digests=(("kernels/k.py", "0" * 64),), sources=files)

    jobs = [job(f"k{i}", (("kernels/k.py", module),)) for i in range(16)]
    jobs.append(job("o", (("kernels/k.py", module), ("kernels/o.py", other))))
    wire = batch_to_wire(jobs)
    assert len(wire) < len(module) + 16 * 1024  # not 17 copies
    back = batch_from_wire(wire)
    assert [j.chain.instance for j in back] == [j.chain.instance for j in jobs]
    assert [j.sources for j in back] == [j.sources for j in jobs]
    assert all(j.sources[0][1] is back[0].sources[0][1] for j in back)
    assert back[-1].sources[1] == ("kernels/o.py", other)


def test_a_batch_result_is_fetched_once_for_all_its_chains():
    """A Dask future fetches its result on every call: the batch asks once."""
    from kiln.tasks.execution.ahead import Batch

    fetched = []

    def wait(future):
        fetched.append(future)
        return [b"a", b"b", b"c"]

    batch = Batch(future="f")
    assert [batch.take(place, wait) for place in (2, 0, 1)] == [b"c", b"a", b"b"]
    assert fetched == ["f"]
    assert batch.results == [None, None, None]  # each result is let go once taken


class _SlowStart:
    """An executor whose start waits for the test: what a LocalCluster starting looks like."""

    def __init__(self):
        self.release = threading.Event()
        self.submitted: list[list[str]] = []
        self.futures: list = []
        self.closed = False

    def start(self):
        assert self.release.wait(10)
        return self

    def submit(self, jobs):
        from concurrent.futures import Future

        self.submitted.append([spec.instance for spec in jobs])
        self.futures.append(Future())
        return self.futures[-1]

    def close(self):
        self.closed = True


def _plan_with(monkeypatch, fake, stale, address=None):
    from types import SimpleNamespace

    from kiln.tasks.chain.instance_spec import ExecutorSettings
    from kiln.tasks.execution import ahead

    settings = ExecutorSettings(kind="dask", workers=2, address=address)
    plan = ahead.AheadPlan(settings, "/project")
    monkeypatch.setattr(plan, "_start", fake.start)
    monkeypatch.setattr(plan, "_stale", lambda first: stale)
    monkeypatch.setattr(plan, "_job", lambda spec, sources, known: (spec.instance, spec))
    monkeypatch.setattr(ahead, "batch_to_wire", lambda jobs: jobs)
    specs = {name: SimpleNamespace(instance=name) for name in ("a", "b", "c", "d")}
    return plan, specs


def test_chains_build_here_while_the_local_cluster_starts(monkeypatch):
    """The first stale chain starts the LocalCluster on a thread; chains whose turn
    comes before it is up build here, and the rest go to it."""
    fake = _SlowStart()
    plan, specs = _plan_with(monkeypatch, fake, [])
    monkeypatch.setattr(plan, "_stale", lambda first: [specs["b"], specs["c"], specs["d"]])
    assert plan.take(specs["a"], {}, {}) is None  # built here: the cluster is starting
    assert plan.take(specs["b"], {}, {}) is None  # its turn came first: built here too
    fake.release.set()
    plan.starting.join(10)
    assert fake.submitted == [["c"], ["d"]]  # only what is still waiting goes to the cluster
    batch, place = plan.take(specs["d"], {}, {})
    assert (batch.future, place) == (fake.futures[1], 0)
    plan.close()
    assert fake.closed


def test_a_local_cluster_started_early_takes_every_chain_once_up(monkeypatch):
    fake = _SlowStart()
    plan, specs = _plan_with(monkeypatch, fake, [])
    monkeypatch.setattr(plan, "_stale", lambda first: [specs["b"]])
    plan.start_early()  # a first build: before doit has loaded the tasks
    fake.release.set()
    plan.starting.join(10)
    batch, place = plan.take(specs["a"], {}, {})
    assert fake.submitted == [["a"], ["b"]] and (batch.future, place) == (fake.futures[0], 0)
    plan.close()


def test_a_local_cluster_that_cannot_start_is_one_warning_and_a_local_build(monkeypatch, capfd):
    fake = _SlowStart()
    plan, specs = _plan_with(monkeypatch, fake, [])

    def refuse():
        raise OSError("no room for workers")

    monkeypatch.setattr(plan, "_start", refuse)
    plan.start_early()
    plan.starting.join(10)
    assert capfd.readouterr().err == ""  # nothing to build yet: nothing said
    assert plan.take(specs["a"], {}, {}) is None
    assert plan.lost
    assert plan.take(specs["b"], {}, {}) is None
    err = capfd.readouterr().err
    assert err.count("warning") == 1 and "no room for workers" in err, err
    assert "the Dask client could not start: OSError" in err
    plan.close()


def test_a_scheduler_reached_early_takes_every_chain_the_first_one_waits_for_it(monkeypatch):
    """A scheduler of the user's is reached while doit loads; no chain builds here."""
    fake = _SlowStart()
    plan, specs = _plan_with(monkeypatch, fake, [], address="tcp://127.0.0.1:8786")
    monkeypatch.setattr(plan, "_stale", lambda first: [specs["b"]])
    plan.start_early()
    threading.Timer(0.2, fake.release.set).start()  # connected while the first chain waits
    batch, place = plan.take(specs["a"], {}, {})
    assert fake.submitted == [["a"], ["b"]] and (batch.future, place) == (fake.futures[0], 0)
    assert plan.take(specs["b"], {}, {})[0].future is fake.futures[1]
    plan.close()
