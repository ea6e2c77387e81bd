"""The runner registry: built-in runners by name, plugins from the `kiln.runners` group."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

import kiln.runners.base as base
from kiln.errors import TargetError
from kiln.runners.base import BUILTIN_RUNNERS, Runner, load_runner_class


def fake_entry_points(*points: EntryPoint, seen: list | None = None):
    def entry_points(**kw):
        if seen is not None:
            seen.append(kw)
        return [p for p in points if p.group == kw.get("group")]

    return entry_points


@pytest.mark.parametrize("name", sorted(BUILTIN_RUNNERS))
def test_builtin_runners_load_by_name(name):
    cls = load_runner_class(name)
    assert issubclass(cls, Runner) and cls.kind == name


def test_unknown_runner_lists_the_builtins_and_the_plugin_group(monkeypatch):
    monkeypatch.setattr(base, "entry_points", fake_entry_points())
    with pytest.raises(TargetError) as info:
        load_runner_class("tpu9000")
    err = info.value
    assert err.message == "unknown runner 'tpu9000'" and err.found == "tpu9000"
    assert "cpu, iree, npu, sim" in err.expected and "'kiln.runners'" in err.expected
    assert "tpu9000" in err.render()


def test_a_plugin_in_the_kiln_runners_group_is_found(monkeypatch):
    seen: list = []
    plugin = EntryPoint("board", "kiln.runners.cpu:CpuRunner", "kiln.runners")
    other = EntryPoint("board", "json:JSONDecoder", "some.other.group")
    monkeypatch.setattr(base, "entry_points", fake_entry_points(other, plugin, seen=seen))
    from kiln.runners.cpu import CpuRunner

    assert load_runner_class("board") is CpuRunner
    assert seen == [{"group": "kiln.runners"}]


def test_a_builtin_name_is_never_taken_over_by_a_plugin(monkeypatch):
    evil = EntryPoint("sim", "kiln.runners.cpu:CpuRunner", "kiln.runners")
    monkeypatch.setattr(base, "entry_points", fake_entry_points(evil))
    from kiln.runners.sim import SimRunner

    assert load_runner_class("sim") is SimRunner


def test_the_base_runner_is_an_interface():
    r = Runner(options={"a": 1}, machine={"clock_mhz": 5})
    assert r.kind == "base" and r.unavailable() is None
    assert r.options == {"a": 1} and r.machine == {"clock_mhz": 5}
    with pytest.raises(NotImplementedError):
        r.prepare(None)
    with pytest.raises(NotImplementedError):
        r.run(None, [])


def test_options_are_copied_not_shared():
    given = {"device": "llvm-cpu"}
    r = Runner(options=given)
    r.options["device_index"] = 1  # what `kiln bench --device 1` does
    assert given == {"device": "llvm-cpu"}
    assert Runner().options == {} and Runner().machine is None


def test_unknown_target_names_the_pipeline_targets(project):
    from kiln.tasks.checks.targets import make_runner
    from kiln.tasks.model.project import Project

    p = Project(project / "pipeline.yaml")
    assert make_runner(p, "sim").kind == "sim"
    assert make_runner(p, "sim").machine["name"] == "npu-v1"
    assert make_runner(p, "iree").kind == "iree"  # a bare runner kind works as a target
    with pytest.raises(TargetError) as info:
        make_runner(p, "nope")
    err = info.value
    assert err.message == "unknown target 'nope'"
    assert err.expected == "one of: cpu, sim, iree-cpu, iree-cuda, iree, npu"  # one list
    assert "targets:" in err.hint


def test_unknown_target_on_the_command_line_is_a_message_not_a_traceback(project):
    from tests.conftest import run_kiln

    proc = run_kiln(project, "test", "vector_add", "--target", "nope")
    assert proc.returncode == 2
    assert "unknown target 'nope'" in proc.stderr and "one of: cpu, sim" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "compile:" not in proc.stdout  # refused before building anything


def test_a_plugin_registered_under_a_plain_name_is_a_target_runner(project, tmp_path):
    """docs/targets.md: `acme = ...` in the group, then `board: {runner: acme}`."""
    from tests.conftest import run_kiln
    from tests.support.board_plugin import install_plugin

    env = install_plugin(tmp_path / "site", "acme")
    pipeline = project / "pipeline.yaml"
    text = pipeline.read_text().replace("targets:\n", "targets:\n  board: {runner: acme}\n")
    pipeline.write_text(text)
    proc = run_kiln(project, "test", "vector_add.small", "--target", "board", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS    vector_add.small @ board" in proc.stdout
    # the plugin uninstalled: an error at the runner's line, no traceback
    bad = run_kiln(project, "test", "vector_add.small", "--target", "board")
    assert bad.returncode == 2
    assert "pipeline.yaml:22:19: error: unknown runner 'acme'" in bad.stderr
    assert "a plugin registered in the 'kiln.runners' entry-point group" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_a_plain_runner_name_nothing_registers_is_refused_while_loading(project):
    from kiln.errors import KilnError
    from kiln.pipeline import load_pipeline

    pipeline = project / "pipeline.yaml"
    pipeline.write_text(
        pipeline.read_text().replace("targets:\n", "targets:\n  b: {runner: simm}\n")
    )
    with pytest.raises(KilnError) as info:
        load_pipeline(pipeline)
    assert info.value.message == "unknown runner 'simm' for target 'b'"
