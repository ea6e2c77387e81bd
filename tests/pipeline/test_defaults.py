"""Built-in defaults: a pipeline.yaml of project, packages and kernels builds; what it writes wins.

The built-in stage list, machine models and targets live in
kiln/pipeline/defaults.yaml; `kiln config` shows the merged pipeline and
where each entry came from.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest
import yaml

from kiln.cli.config_command import cmd_config
from kiln.errors import PipelineError
from kiln.pipeline import defaults as builtin_defaults
from kiln.pipeline import load_pipeline, load_pipeline_cached, load_schema
from kiln.pipeline.load import cache_key
from kiln.pipeline.model import DEFAULT_OUT_DIR, DEFAULT_TUNING_FILE

REPO = Path(__file__).resolve().parents[2]
DEFAULTS = REPO / "kiln" / "pipeline" / "defaults.yaml"
MINIMAL = """\
project: demo
packages: [ops]
kernels:
  scale:
    shapes: {N: 256}
"""
KERNEL = """\
from kiln import Tensor, device


@device
def scale(x: Tensor["N"]):
    return x * 2.0
"""
BUILTIN = "built-in default"
DODO = "from kiln.tasks.dag.loader import dodo_namespace\n\nglobals().update(dodo_namespace())\n"
BUILT_IN_STAGES = ["trace", "visa", "lir", "schedule", "edf"]


@pytest.fixture
def minimal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project of one kernel module whose pipeline.yaml says only project, packages, kernels."""
    (tmp_path / "ops.py").write_text(KERNEL)
    (tmp_path / "pipeline.yaml").write_text(MINIMAL)
    for name in ("KILN_PIPELINE_FILE", "KILN_PIPELINE", "KILN_OUT_DIR"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def write(root: Path, extra: str) -> Path:
    path = root / "pipeline.yaml"
    path.write_text(MINIMAL + extra)
    return path


def line_of(path: Path, text: str) -> int:
    (line,) = [i for i, s in enumerate(path.read_text().splitlines(), 1) if text in s]
    return line


def kiln_command() -> list[str]:
    """The venv's `kiln` script, as a user runs it (python -m kiln where there is none)."""
    script = Path(sys.executable).with_name("kiln")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "kiln"]


def run(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, KILN_CACHE_DIR=str(root / ".cache"))
    for name in ("KILN_OUT_DIR", "KILN_PIPELINE_FILE", "KILN_PIPELINE", "PYTHONPATH"):
        env.pop(name, None)
    proc = subprocess.run(
        list(args), cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def config(root: Path, monkeypatch: pytest.MonkeyPatch, capsys, *, as_json: bool):
    monkeypatch.chdir(root)
    capsys.readouterr()
    assert cmd_config(argparse.Namespace(json=as_json)) == 0
    out = capsys.readouterr().out
    return json.loads(out) if as_json else out


# -- a minimal project builds ---------------------------------------------------------


def test_minimal_pipeline_compiles_and_tests_with_the_builtin_defaults(minimal: Path) -> None:
    run(minimal, *kiln_command(), "compile")
    out = minimal / DEFAULT_OUT_DIR / "scale" / "default"
    assert (out / "kernel.edf").is_file()  # the last built-in stage wrote the binary
    tested = run(minimal, *kiln_command(), "test", "--target", "sim")
    assert "PASS    scale.default @ sim" in tested.stdout
    # no --target: the built-in sim only; the built-in iree targets need --target
    default = run(minimal, *kiln_command(), "test")
    assert "@ sim" in default.stdout and "iree" not in default.stdout


def test_minimal_pipeline_builds_with_plain_doit(minimal: Path) -> None:
    (minimal / "dodo.py").write_text(DODO)
    proc = run(minimal, sys.executable, "-m", "doit", "compile")
    assert ". compile:scale.default\n" in proc.stdout  # one task runs the whole chain
    out = minimal / DEFAULT_OUT_DIR / "scale" / "default"
    for artifact in ("graph.json", "kernel.visa", "kernel.lir", "kernel.sched", "kernel.edf"):
        assert (out / artifact).is_file(), artifact


def test_minimal_pipeline_resolves_to_the_builtin_defaults(minimal: Path) -> None:
    p = load_pipeline(minimal / "pipeline.yaml")
    assert [s.name for s in p.stages] == BUILT_IN_STAGES
    assert [s.module for s in p.stages] == [f"kiln.stages.{n}" for n in BUILT_IN_STAGES]
    assert p.stage_options("scale", "visa") == {"fusion": True}
    assert p.machine == "npu-v1" and list(p.machines) == ["npu-v1", "npu-tiny"]
    assert p.machine_model()["clock_mhz"] == 1000 and p.kernel_machine("scale")["sram_bytes"]
    assert [t.name for t in p.targets] == ["cpu", "sim", "iree-cpu", "iree-cuda"]
    assert p.target("sim").machine is None  # the built-in sim follows `machine:`
    assert p.out_dir == DEFAULT_OUT_DIR and p.tuning_file == DEFAULT_TUNING_FILE


def test_the_schema_accepts_a_pipeline_of_project_packages_and_kernels() -> None:
    from jsonschema import Draft202012Validator

    schema = load_schema()
    assert schema["required"] == ["project", "packages", "kernels"]
    Draft202012Validator(schema).validate(yaml.safe_load(MINIMAL))


def test_defaults_file_agrees_with_the_model_and_ships_as_package_data() -> None:
    data = yaml.safe_load(DEFAULTS.read_text())
    assert data["out_dir"] == DEFAULT_OUT_DIR and data["tuning"]["file"] == DEFAULT_TUNING_FILE
    assert builtin_defaults.DEFAULTS_PATH == DEFAULTS
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    shipped = pyproject["tool"]["setuptools"]["package-data"]["kiln"]
    assert any(fnmatch("pipeline/defaults.yaml", pattern) for pattern in shipped)


# -- what the project writes wins -----------------------------------------------------


def test_a_machine_with_a_builtin_name_replaces_it_and_a_new_name_adds_one(
    minimal: Path,
) -> None:
    tiny = yaml.safe_load(DEFAULTS.read_text())["machines"]["npu-tiny"]
    own = json.dumps({**tiny, "sram_bytes": 131072})
    path = write(minimal, f"machine: npu-tiny\nmachines:\n  npu-tiny: {own}\n  board: {own}\n")
    p = load_pipeline(path)
    assert list(p.machines) == ["npu-v1", "npu-tiny", "board"]
    assert p.machine_model()["sram_bytes"] == 131072
    assert p.machine_model("board") == p.machine_model()
    assert p.machine_model("npu-v1")["sram_bytes"] == 4194304  # untouched built-in
    assert not p.is_builtin("machines.npu-tiny") and p.is_builtin("machines.npu-v1")


def test_a_project_that_adds_one_machine_compiles_for_it(minimal: Path) -> None:
    tiny = json.dumps(yaml.safe_load(DEFAULTS.read_text())["machines"]["npu-tiny"])
    path = write(minimal, f"machines:\n  board: {tiny}\n")
    p = load_pipeline(path)
    assert p.machine == "board" and not p.is_builtin("machine")
    assert p.origin("machine").endswith(f"pipeline.yaml:{line_of(path, 'board:')}")
    # replacing a built-in machine changes no default
    replaced = load_pipeline(write(minimal, f"machines:\n  npu-tiny: {tiny}\n"))
    assert replaced.machine == "npu-v1" and replaced.is_builtin("machine")


def test_omitting_machine_picks_npu_v1_even_with_project_targets(minimal: Path) -> None:
    path = write(minimal, "targets:\n  tiny-sim: {runner: sim, machine: npu-tiny}\n")
    p = load_pipeline(path)
    assert p.machine == "npu-v1" and p.is_builtin("machine")
    assert p.target("tiny-sim").machine == "npu-tiny"  # a built-in machine is there to name


def test_a_target_with_a_builtin_name_replaces_it_and_a_new_name_adds_one(
    minimal: Path,
) -> None:
    from kiln.tasks.checks.verdicts import default_targets
    from kiln.tasks.model.project import Project

    path = write(
        minimal,
        "targets:\n"
        "  sim: {runner: sim, machine: npu-tiny, tolerance: {atol: 0.5}}\n"
        "  board: {runner: 'acme.runner:Board'}\n",
    )
    p = load_pipeline(path)
    assert [t.name for t in p.targets] == ["cpu", "sim", "iree-cpu", "iree-cuda", "board"]
    assert p.target("sim").machine == "npu-tiny" and p.target("sim").tolerance == {"atol": 0.5}
    assert p.target("iree-cpu").options == (("device", "llvm-cpu"),)
    # `kiln test` without --target checks the targets the project declares
    assert default_targets(Project(path)) == ["sim", "board"]


def test_a_stages_list_replaces_the_builtin_one(minimal: Path) -> None:
    path = write(
        minimal,
        "stages:\n"
        "  - {name: trace, module: kiln.stages.trace}\n"
        "  - {name: visa, module: kiln.stages.visa, options: {fusion: false}}\n",
    )
    p = load_pipeline(path)
    assert [s.name for s in p.stages] == ["trace", "visa"]
    assert p.stage_options("scale", "visa") == {"fusion": False}
    assert not p.is_builtin("stages[1].options")


def test_cache_settings_merge_key_by_key(minimal: Path) -> None:
    path = write(minimal, "cache: {remote: 'file:///tmp/team'}\n")
    p = load_pipeline(path)
    assert p.cache_check == "timestamp" and p.cache_settings == {"remote": "file:///tmp/team"}
    assert p.is_builtin("cache.check") and not p.is_builtin("cache.remote")


# -- errors point at who wrote the value ----------------------------------------------


def broken_defaults(tmp_path: Path, old: str, new: str) -> Path:
    text = DEFAULTS.read_text()
    assert old in text
    copy = tmp_path / "broken-defaults.yaml"
    copy.write_text(text.replace(old, new, 1))
    return copy


def test_an_error_in_a_builtin_value_points_at_the_defaults_file_as_kilns_bug(
    minimal: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = broken_defaults(tmp_path, "sram_bytes: 65536", "sram_bytes: -1")
    monkeypatch.setattr(builtin_defaults, "DEFAULTS_PATH", bad)
    with pytest.raises(PipelineError) as info:
        load_pipeline(minimal / "pipeline.yaml")
    err = info.value
    assert err.location.file.endswith("broken-defaults.yaml")
    assert err.location.line == line_of(bad, "sram_bytes: -1")
    assert err.location.key_path == "machines.npu-tiny.sram_bytes"
    assert any("bug in Kiln" in note for note in err.notes), err.render()
    # a project that writes its own npu-tiny does not use the broken value
    tiny = json.dumps(yaml.safe_load(DEFAULTS.read_text())["machines"]["npu-tiny"])
    assert load_pipeline(write(minimal, f"machines:\n  npu-tiny: {tiny}\n")).machines


def test_an_error_in_a_project_value_points_at_its_line(minimal: Path) -> None:
    path = write(minimal, "targets:\n  board: {runner: sim, machine: npu-v2}\n")
    with pytest.raises(PipelineError) as info:
        load_pipeline(path)
    err = info.value
    assert Path(err.location.file).name == "pipeline.yaml" and not err.notes
    assert err.location.line == line_of(path, "npu-v2")
    assert err.location.key_path == "targets.board.machine"
    assert "npu-v1, npu-tiny" in err.expected and err.hint == "did you mean 'npu-v1'?"


# -- the cache covers the defaults ----------------------------------------------------


def test_changing_a_default_changes_the_pipeline_cache_key(
    minimal: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, cache = minimal / "pipeline.yaml", tmp_path / "cache"
    before = cache_key(path)
    assert load_pipeline_cached(path, cache).machine_model()["clock_mhz"] == 1000
    faster = broken_defaults(tmp_path, "clock_mhz: 1000", "clock_mhz: 2000")
    monkeypatch.setattr(builtin_defaults, "DEFAULTS_PATH", faster)
    assert cache_key(path) != before
    assert load_pipeline_cached(path, cache).machine_model()["clock_mhz"] == 2000


def test_changing_a_default_changes_the_compile_config_stamps(
    minimal: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The machine model that feeds the stamps is the resolved one, not pipeline.yaml's text."""
    from kiln.tasks.dag.compile import compile_tasks
    from kiln.tasks.model.project import Project

    def stamps() -> dict[str, str]:
        tasks = compile_tasks(Project(minimal / "pipeline.yaml"))
        return {t["name"]: t["file_dep"][-1] for t in tasks}

    before = stamps()
    bigger = broken_defaults(tmp_path, "sram_bytes: 4194304", "sram_bytes: 8388608")
    monkeypatch.setattr(builtin_defaults, "DEFAULTS_PATH", bigger)
    after = stamps()
    assert set(before) == set(after)
    assert all(before[name] != after[name] for name in before)  # every stage sees the machine


# -- kiln config ----------------------------------------------------------------------


PROJECT_WITH_OVERRIDES = """\
project: demo
packages: [ops]
kernels:
  scale:
    shapes: {N: 256}
out_dir: out
machines:
  npu-v1: {clock_mhz: 800, sram_bytes: 1048576, units: {dma: 1, tensor: 1, vector: 1},
           dma: {bytes_per_cycle: 32, latency: 50},
           tensor: {tile: [16, 16, 16], cycles_per_tile: 8},
           vector: {lanes: 32, latency: {default: 2}}}
targets:
  board: {runner: sim, machine: npu-tiny}
"""
BOARD_LINE = (
    PROJECT_WITH_OVERRIDES.splitlines().index("  board: {runner: sim, machine: npu-tiny}") + 1
)


def test_config_names_each_entrys_origin_with_its_line(
    minimal: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    path = minimal / "pipeline.yaml"
    path.write_text(PROJECT_WITH_OVERRIDES)
    record = config(minimal, monkeypatch, capsys, as_json=True)
    origins = record["origins"]
    at = {key: f"pipeline.yaml:{n}" for key, n in [
        ("project", 1), ("packages", 2), ("kernels.scale", 4), ("out_dir", 6),
        ("machines.npu-v1", 8), ("targets.board", BOARD_LINE),
    ]}  # fmt: skip
    for key, where in at.items():
        assert origins[key] == where, key
    for key in ("machine", "stages[0]", "stages[4]", "machines.npu-tiny", "targets.sim",
                "cache.check", "tuning.file"):  # fmt: skip
        assert origins[key] == BUILTIN, key
    resolved = record["pipeline"]
    assert resolved["machines"]["npu-v1"]["clock_mhz"] == 800 and resolved["out_dir"] == "out"
    assert [s["name"] for s in resolved["stages"]] == BUILT_IN_STAGES
    assert list(resolved["targets"]) == ["cpu", "sim", "iree-cpu", "iree-cuda", "board"]
    assert resolved["kernels"]["scale"] == {"dtype": "f32", "shapes": {"default": {"N": 256}}}


def test_config_yaml_loads_back_to_the_json_with_origins_as_comments(
    minimal: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    (minimal / "pipeline.yaml").write_text(PROJECT_WITH_OVERRIDES)
    record = config(minimal, monkeypatch, capsys, as_json=True)
    text = config(minimal, monkeypatch, capsys, as_json=False)
    assert yaml.safe_load(text) == record["pipeline"]
    lines = text.splitlines()

    def comment(start: str) -> str:
        (line,) = [s for s in lines if s.lstrip().startswith(start)]
        return line.rsplit("#", 1)[1].strip()

    assert comment("project:") == "from pipeline.yaml:1"
    assert comment("npu-v1:") == "from pipeline.yaml:8"
    assert comment("board:") == f"from pipeline.yaml:{BOARD_LINE}"
    assert comment("npu-tiny:") == "built-in" and comment("machine:") == "built-in"
    assert comment("- {name: trace") == "built-in"


def test_config_shows_a_kernels_inputs_and_fuzz_ranges(
    minimal: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    (minimal / "pipeline.yaml").write_text(
        MINIMAL.replace("    shapes: {N: 256}\n", "")
        + "    inputs: {x: {normal: {mean: 0, std: 2}}}\n"
        + "    shapes:\n      small: {N: 256, inputs: {x: {constant: 1}}}\n"
        + "    fuzz: {N: [1, 64]}\n"
    )
    record = config(minimal, monkeypatch, capsys, as_json=True)
    assert record["pipeline"]["kernels"]["scale"] == {
        "dtype": "f32",
        "inputs": {"x": {"normal": {"mean": 0, "std": 2}}},
        "shapes": {"small": {"N": 256, "inputs": {"x": {"constant": 1}}}},
        "fuzz": {"N": [1, 64]},
    }
    text = config(minimal, monkeypatch, capsys, as_json=False)
    assert "    inputs: {x: {normal: {mean: 0, std: 2}}}" in text.splitlines()
    assert "    fuzz: {N: [1, 64]}" in text.splitlines()
    assert yaml.safe_load(text) == record["pipeline"]


def test_config_points_at_a_stage_list_the_project_writes(
    minimal: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    path = write(minimal, "stages:\n  - name: trace\n    module: kiln.stages.trace\n")
    origins = config(minimal, monkeypatch, capsys, as_json=True)["origins"]
    assert origins["stages[0]"] == f"pipeline.yaml:{line_of(path, '- name: trace')}"
    assert "stages[1]" not in origins


def test_config_follows_a_cache_hit(minimal: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The second run reads the pickled pipeline: origins come from the source maps again."""
    shutil.rmtree(minimal / ".kiln", ignore_errors=True)
    first = config(minimal, monkeypatch, capsys, as_json=True)
    assert list((minimal / ".kiln").glob("pipeline-*.pickle"))
    assert config(minimal, monkeypatch, capsys, as_json=True) == first


def test_config_says_which_environment_variables_override_the_file(
    minimal: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from kiln.cli.config_command import ENVIRONMENT_OVERRIDES

    for name in ENVIRONMENT_OVERRIDES:
        monkeypatch.delenv(name, raising=False)
    text = config(minimal, monkeypatch, capsys, as_json=False)
    assert text.rstrip().endswith("# no KILN_* environment variable overrides this file")
    monkeypatch.setenv("KILN_REMOTE_CACHE", "file:///mnt/team-cache")
    monkeypatch.setenv("KILN_OUT_DIR", "out-ci")
    record = config(minimal, monkeypatch, capsys, as_json=True)
    assert record["environment"] == {
        "KILN_OUT_DIR": {"value": "out-ci", "overrides": "out_dir"},
        "KILN_REMOTE_CACHE": {"value": "file:///mnt/team-cache", "overrides": "cache.remote"},
    }
    text = config(minimal, monkeypatch, capsys, as_json=False)
    assert "#   KILN_REMOTE_CACHE=file:///mnt/team-cache  -> cache.remote" in text.splitlines()
    assert yaml.safe_load(text) == record["pipeline"]  # the overrides are comments
