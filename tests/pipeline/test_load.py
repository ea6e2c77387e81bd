"""load_pipeline: every mistake in pipeline.yaml is reported at its key; good files normalize."""

from __future__ import annotations

import dataclasses
import os
import pickle
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from kiln.errors import PipelineError
from kiln.pipeline import (
    DumpSpec,
    KernelSpec,
    Pipeline,
    StageSpec,
    load_pipeline,
    load_pipeline_cached,
    load_schema,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "pipeline.yaml"
FAKE = "kiln_fake_stages"  # stand-in stage modules, so these tests need no real stages
STAGE_NAMES = ("trace", "visa", "lir", "schedule", "edf")


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The example pipeline in tmp_path, its stage modules pointing at dummy modules."""
    site = tmp_path / "site"
    (site / FAKE).mkdir(parents=True)
    (site / FAKE / "__init__.py").write_text("")
    for name in STAGE_NAMES:
        (site / FAKE / f"{name}.py").write_text("def run(ir, options, machine):\n    return ir\n")
    monkeypatch.syspath_prepend(str(site))
    text = EXAMPLE.read_text(encoding="utf-8")
    assert "module: kiln.stages." in text
    path = tmp_path / "pipeline.yaml"
    path.write_text(text.replace("module: kiln.stages.", f"module: {FAKE}."), encoding="utf-8")
    yield path
    for name in [m for m in sys.modules if m == FAKE or m.startswith(FAKE + ".")]:
        del sys.modules[name]


def edit(path: Path, old: str, new: str) -> str:
    text = path.read_text(encoding="utf-8")
    assert old in text, f"the example pipeline no longer contains {old!r}"
    text = text.replace(old, new, 1)
    path.write_text(text, encoding="utf-8")
    return text


def line_of(text: str, marker: str) -> int:
    """1-based number of the one line containing marker (``^x``: starting with x)."""
    if marker.startswith("^"):
        hits = [i for i, line in enumerate(text.splitlines(), 1) if line.startswith(marker[1:])]
    else:
        hits = [i for i, line in enumerate(text.splitlines(), 1) if marker in line]
    assert len(hits) == 1, f"marker {marker!r} is on lines {hits}"
    return hits[0]


def _drop_block(key: str) -> Callable[[str], str]:
    return _replace_block(key, "")


def _replace_block(key: str, new: str) -> Callable[[str], str]:
    def replace(text: str) -> str:
        out, n = re.subn(rf"(?m)^{key}:\n(?:(?:  .*)?\n)+?(?=\S|\Z)", new, text)
        assert n == 1, f"no top-level {key}: block"
        return out

    return replace


class Case(NamedTuple):
    id: str
    change: tuple[str, str] | str | Callable[[str], str]  # (old, new), whole text, or function
    message: str  # substring of the error message
    key_path: str | None
    line: str  # marker of the line the error must point at
    at: str | None = None  # the caret must sit where this text starts on that line
    hint: str | None = None
    found: str | None = None  # substring of `found`


TRANSPOSE = "      small: {M: 64, N: 128}\n      large: {M: 512, N: 256}\n"
# fmt: off
CASES = [
    # 1. YAML syntax
    Case("yaml_syntax", ("out_dir: build/kiln/kernel", "out_dir: build/kiln/kernel: oops"),
         "invalid YAML", None, "^out_dir:", at=": oops"),
    Case("yaml_tab_indentation", ("  gemm:\n    dtype: f32", "  gemm:\n\tdtype: f32"),
         "a tab indents this line", None, "\tdtype: f32", at="\t",
         hint="replace the tab with spaces: YAML does not allow tabs in indentation"),
    Case("yaml_key_indented_too_little",
         ("  gemm:\n    dtype: f32\n", "  gemm:\n    dtype: f32\n   function: kernels.gemm\n"),
         "did not find expected key", None, "^   function:", at="function",
         hint="check the indentation of this line and the one above: the keys of one mapping "
         "start in the same column, and a key's value is indented further than the key"),
    Case("yaml_unclosed_flow_mapping", ("small: {M: 64, N: 128}", "small: {M: 64, N: 128"),
         "invalid YAML", None, "large: {M: 512, N: 256}"),
    # 2. duplicate keys
    Case("duplicate_kernel", ("  gemm_bias_relu:\n", "  gemm:  # again\n"),
         "duplicate key 'gemm'", "kernels.gemm", "gemm:  # again", at="gemm:", found="line 21"),
    Case("duplicate_dim_in_flow_mapping", ("small: {M: 64, N: 128}", "small: {M: 64, M: 128}"),
         "duplicate key 'M'", "kernels.transpose.shapes.small.M", "{M: 64, M: 128}", at="M: 128"),
    Case("merge_key_of_a_scalar", ("small: {M: 64, N: 128}", "small: {<<: 64, N: 128}"),
         "'<<' merge key needs a mapping", "kernels.transpose.shapes.small",
         "{<<: 64, N: 128}", at="<<", found="the value '64'"),
    Case("non_scalar_key", ("  check: timestamp\n", "  check: timestamp\n  [a, b]: 1\n"),
         "mapping keys must be plain names", "cache", "[a, b]: 1", at="[a, b]"),
    # 3. top level
    Case("top_level_list", "- project\n- kernels\n", "must be a mapping", None, "- project"),
    Case("empty_file", "# nothing here\n", "pipeline file is empty", None, "# nothing here"),
    Case("project_wrong_type", ("project: kiln-examples", "project: [kiln]"),
         "wrong type for 'project'", "project", "^project:", at="[kiln]", found="a list"),
    # 4. unknown keys
    Case("unknown_top_level_key", ("project: kiln-examples", "projekt: kiln-examples"),
         "unknown key 'projekt'", "projekt", "^projekt:", at="projekt",
         hint="did you mean 'project'?"),
    Case("unknown_kernel_key", ("  gemm:\n    dtype: f32", "  gemm:\n    dtyp: f32"),
         "unknown key 'dtyp' in 'kernels.gemm'", "kernels.gemm.dtyp", "dtyp: f32", at="dtyp",
         hint="did you mean 'dtype'?"),
    Case("unknown_machine_key", ("clock_mhz: 500", "clock_mzh: 500"),
         "unknown key 'clock_mzh'", "machines.npu-tiny.clock_mzh", "clock_mzh", at="clock_mzh",
         hint="did you mean 'clock_mhz'?"),
    Case("unknown_key_in_flow_mapping", ("units: {dma: 1, tensor: 1, vector: 1}",
                                         "units: {dma: 1, tensor: 1, vectr: 1}"),
         "unknown key 'vectr'", "machines.npu-tiny.units.vectr", "vectr", at="vectr",
         hint="did you mean 'vector'?"),
    Case("unknown_stage_key", ("options: {policy: critical", "option: {policy: critical"),
         "unknown key 'option'", "stages[3].option", "option: {policy", at="option",
         hint="did you mean 'options'?"),
    Case("unknown_vector_op_latency", ("latency: {default: 4}}", "latency: {default: 4, expp: 8}}"),
         "unknown vector op 'expp' in 'machines.npu-tiny.vector.latency'",
         "machines.npu-tiny.vector.latency.expp", "expp: 8", at="expp",
         hint="did you mean 'exp'?", found="'expp'"),
    Case("unknown_target_key", ("cpu: {runner: cpu}", "cpu: {runer: cpu}"),
         "unknown key 'runer'", "targets.cpu.runer", "runer", at="runer",
         hint="did you mean 'runner'?"),
    Case("unknown_cache_key", ("  check: timestamp", "  chek: timestamp"),
         "unknown key 'chek'", "cache.chek", "chek:", at="chek", hint="did you mean 'check'?"),
    # 5. wrong types, ranges, enums
    Case("shape_set_is_a_string", ("small: {M: 64, N: 128}", 'small: "M=64"'),
         "wrong type", "kernels.transpose.shapes.small", 'small: "M=64"', at='"M=64"',
         found="a string"),
    Case("dim_quoted", ("small: {M: 64, N: 128}", 'small: {M: "64", N: 128}'),
         "wrong type", "kernels.transpose.shapes.small.M", '{M: "64"', at='"64"',
         found="a string '64'", hint="write the number without quotes: 64"),
    Case("rtol_quoted", ("  gemm:\n    dtype: f32", "  gemm:\n    tolerance: {rtol: '1e-5'}\n"
                         "    dtype: f32"),
         "wrong type", "kernels.gemm.tolerance.rtol", "rtol: '1e-5'", at="'1e-5'",
         found="a string '1e-5'", hint="write the number without quotes: 1e-5"),
    Case("dim_in_scientific_notation", ("small: {M: 64, N: 128}", "small: {M: 1e3, N: 128}"),
         "wrong type", "kernels.transpose.shapes.small.M", "{M: 1e3", at="1e3",
         found="a number 1000.0",
         hint="write it as a whole number without a dot or exponent: 1000"),
    Case("dim_too_large_for_exact_digits", ("small: {M: 64, N: 128}", "small: {M: 9e99, N: 128}"),
         "wrong type", "kernels.transpose.shapes.small.M", "{M: 9e99", at="9e99",
         hint="write it as a whole number without a dot or exponent"),
    Case("project_yes_is_a_boolean", ("project: kiln-examples", "project: yes"),
         "wrong type for 'project'", "project", "^project: yes", at="yes",
         found="a boolean True",
         hint="YAML reads unquoted yes/no/on/off/true/false as a boolean: quote the word"),
    Case("project_number", ("project: kiln-examples", "project: 2024"),
         "wrong type for 'project'", "project", "^project: 2024", at="2024",
         hint='quote it to make it a string: "2024"'),
    Case("dim_zero", ("small: {M: 64, N: 128}", "small: {M: 0, N: 128}"),
         "out of range", "kernels.transpose.shapes.small.M", "{M: 0, N: 128}", at="0, N"),
    Case("dim_not_an_integer", ("small: {M: 64, N: 128}", "small: {M: 64, N: 12.5}"),
         "wrong type", "kernels.transpose.shapes.small.N", "N: 12.5", at="12.5"),
    Case("sram_negative", ("sram_bytes: 65536", "sram_bytes: -1"),
         "out of range", "machines.npu-tiny.sram_bytes", "sram_bytes: -1", at="-1"),
    Case("dtype_enum", ("  vector_add:\n    dtype: f32", "  vector_add:\n    dtype: f64"),
         "invalid value", "kernels.vector_add.dtype", "dtype: f64", at="f64"),
    Case("cache_check_enum", ("check: timestamp", "check: md4"),
         "invalid value for 'cache.check'", "cache.check", "check: md4", at="md4",
         hint="did you mean 'md5'?"),
    Case("dump_kind_enum", ("kinds: [visa, schedule, summary]", "kinds: [visa, schedul, summary]"),
         "invalid value", "dumps[0].kinds[1]", "schedul,", at="schedul",
         hint="did you mean 'schedule'?"),
    Case("tile_needs_three_sizes", ("tile: [16, 16, 16]", "tile: [16, 16]"),
         "wrong number of items", "machines.npu-tiny.tensor.tile", "tile: [16, 16]", at="[16"),
    Case("packages_empty", ("packages:\n  - kernels\n", "packages: []\n"),
         "must not be empty", "packages", "packages: []", at="[]"),
    # 6. missing keys
    Case("missing_project", ("project: kiln-examples\n", ""), "missing required key 'project'",
         "project", "^out_dir:", found="keys: out_dir, cache, packages,"),
    Case("stages_empty", _replace_block("stages", "stages: []\n"), "'stages' must not be empty",
         "stages", "^stages: []", at="[]"),
    Case("kernels_empty", lambda text: _replace_block("kernels", "kernels: {}\n")(
        _drop_block("dumps")(_drop_block("apps")(text))),
         "declares no kernel", "kernels", "^kernels: {}", at="{}", found="an empty mapping"),
    Case("missing_latency_default", ("latency: {default: 4}}", "latency: {exp: 4}}"),
         "missing required key 'default'", "machines.npu-tiny.vector.latency.default",
         "latency: {exp: 4}", at="latency: {exp"),  # points at the mapping that lacks it
    Case("machine_neither_declared_nor_built_in",
         lambda text: _drop_block("machines")(text).replace("machine: npu-v1\n", "machine: x\n"),
         "unknown machine 'x'", "machine", "^machine: x", at="x",
         hint="declare it under a `machines:` section", found="'x'"),
    # 7. references
    Case("unknown_default_machine", ("machine: npu-v1\n\nkernels", "machine: npu-v2\n\nkernels"),
         "unknown machine 'npu-v2'", "machine", "^machine: npu-v2", at="npu-v2",
         hint="did you mean 'npu-v1'?"),
    Case("unknown_target_machine", ("machine: npu-v1}", "machine: npu-v9}"),
         "unknown machine 'npu-v9'", "targets.sim.machine", "npu-v9", at="npu-v9",
         hint="did you mean 'npu-v1'?"),
    Case("unknown_kernel_machine", ("  row_max:\n    dtype: f32",
                                    "  row_max:\n    machine: npu-tiny2\n    dtype: f32"),
         "unknown machine 'npu-tiny2'", "kernels.row_max.machine", "npu-tiny2", at="npu-tiny2",
         hint="did you mean 'npu-tiny'?"),
    Case("stage_module_missing", (f"module: {FAKE}.lir", f"module: {FAKE}.lirr"),
         "stage 'lir' names a module that cannot be found", "stages[2].module", "lirr",
         at=f"{FAKE}.lirr", found="no such module"),
    Case("stage_module_package_missing", (f"module: {FAKE}.lir", "module: no_such_pkg_xyz.lir"),
         "cannot be found", "stages[2].module", "no_such_pkg_xyz", at="no_such_pkg_xyz",
         found="package 'no_such_pkg_xyz' not found"),
    Case("kernel_options_name_unknown_stage", ("  gemm:\n    dtype: f32",
                                               "  gemm:\n    options: {visaa: {}}\n    dtype: f32"),
         "unknown stage 'visaa'", "kernels.gemm.options.visaa", "visaa", at="visaa",
         hint="did you mean 'visa'?"),
    Case("dump_kind_twice", ("kinds: [visa, schedule, summary]", "kinds: [visa, schedule, visa]"),
         "'dumps[0].kinds' lists an item twice: 'visa'", "dumps[0].kinds[2]", "kinds: [visa",
         at="visa]", found="'visa' at dumps[0].kinds[0] and dumps[0].kinds[2]",
         hint="remove the second 'visa'"),
    Case("dump_kernel_twice", ("kernels: [softmax]", "kernels: [softmax, gemm, softmax]"),
         "'dumps[0].kernels' lists an item twice: 'softmax'", "dumps[0].kernels[2]",
         "kernels: [softmax, gemm", at="softmax]"),
    Case("dump_names_unknown_kernel", ("kernels: [softmax]", "kernels: [softmaxx]"),
         "unknown kernel 'softmaxx'", "dumps[0].kernels[0]", "[softmaxx]", at="softmaxx",
         hint="did you mean 'softmax'?"),
    Case("unknown_runner", ("runner: sim,", "runner: simm,"),
         "unknown runner 'simm'", "targets.sim.runner", "simm", at="simm",
         hint="did you mean 'sim'?"),
    # 8. duplicate names
    Case("duplicate_stage_name", ("- name: lir", "- name: visa  # twice"),
         "duplicate stage name 'visa'", "stages[2].name", "# twice", at="visa  #",
         found="first at stages[1]"),
    # 9. shapes
    Case("flat_dim_not_identifier", (TRANSPOSE, "      M: 64\n      2N: 128\n"),
         "invalid dim name '2N'", "kernels.transpose.shapes.2N", "2N: 128", at="2N"),
    Case("set_dim_not_identifier", ("small: {M: 64, N: 128}", "small: {M: 64, N-1: 128}"),
         "invalid name 'N-1'", "kernels.transpose.shapes.small.N-1", "N-1", at="N-1",
         hint="did you mean 'N_1'?"),
    Case("flat_dims_mixed_with_sets", ("      small: {M: 64, N: 128}\n", "      M: 64\n"),
         "mixes flat dims and named shape sets", "kernels.transpose.shapes.large",
         "large: {M: 512, N: 256}", at="{M: 512"),
    Case("kernel_name_not_identifier", ("  row_sum:\n", "  row-sum:\n"),
         "invalid name 'row-sum'", "kernels.row-sum", "row-sum:", at="row-sum",
         hint="did you mean 'row_sum'?"),
    # 10. fuzz ranges
    Case("fuzz_range_low_above_high", (TRANSPOSE, TRANSPOSE + "    fuzz: {M: [9, 2]}\n"),
         "fuzz range of dim 'M' of kernel 'transpose' is empty: low 9 is above high 2",
         "kernels.transpose.fuzz.M", "fuzz: {M: [9, 2]}", at="[9, 2]", hint="write [2, 9]"),
    Case("fuzz_range_of_three", (TRANSPOSE, TRANSPOSE + "    fuzz: {M: [1, 2, 3]}\n"),
         "wrong number of items", "kernels.transpose.fuzz.M", "fuzz: {M: [1, 2, 3]}",
         at="[1, 2, 3]", found="3 items"),
    Case("fuzz_size_zero", (TRANSPOSE, TRANSPOSE + "    fuzz: {N: 0}\n"),
         "value out of range", "kernels.transpose.fuzz.N", "fuzz: {N: 0}", at="0}"),
    # 11. machine numbers and tolerances: finite, and small or large enough for the stages
    Case("clock_nan", ("clock_mhz: 500", "clock_mhz: .nan"),
         "'machines.npu-tiny.clock_mhz' is not a finite number", "machines.npu-tiny.clock_mhz",
         "clock_mhz: .nan", at=".nan", found=".nan"),
    Case("clock_inf", ("clock_mhz: 500", "clock_mhz: .inf"),
         "'machines.npu-tiny.clock_mhz' is not a finite number", "machines.npu-tiny.clock_mhz",
         "clock_mhz: .inf", at=".inf", found=".inf"),
    Case("bytes_per_cycle_tiny", ("bytes_per_cycle: 16", "bytes_per_cycle: 1.0e-300"),
         "value out of range", "machines.npu-tiny.dma.bytes_per_cycle", "1.0e-300",
         at="1.0e-300", found="1e-300"),
    Case("dma_latency_huge", ("latency: 200}", "latency: 100000000000000000000}"),
         "value out of range", "machines.npu-tiny.dma.latency", "100000000000000000000",
         at="100000000000000000000"),
    Case("kernel_rtol_inf", ("  gemm:\n    dtype: f32", "  gemm:\n    tolerance: {rtol: .inf}\n"
                             "    dtype: f32"),
         "'kernels.gemm.tolerance.rtol' is not a finite number", "kernels.gemm.tolerance.rtol",
         "rtol: .inf", at=".inf", found=".inf"),
    Case("target_atol_nan", ("cpu: {runner: cpu}", "cpu: {runner: cpu, tolerance: {atol: .nan}}"),
         "'targets.cpu.tolerance.atol' is not a finite number", "targets.cpu.tolerance.atol",
         "atol: .nan", at=".nan", found=".nan"),
    # 12. paths the operating system must accept
    Case("out_dir_nul", ("out_dir: build/kiln/kernel", 'out_dir: "a\\x00b"'),
         "'out_dir' is not a usable path: it contains a NUL character", "out_dir", "^out_dir:",
         at='"a', found="'a\\x00b'", hint="remove the \\x00 (or \\0) escape from the string"),
    Case("tuning_file_nul", ("out_dir: build/kiln/kernel", 'tuning: {file: "t\\0.jsonl"}'),
         "'tuning.file' is not a usable path", "tuning.file", "^tuning:", at='"t'),
    Case("app_test_path_nul", ("tests: [apps/tests/test_mlp.py]", 'tests: ["apps/\\0.py"]'),
         "'apps.mlp.tests[0]' is not a usable path", "apps.mlp.tests[0]", "apps/\\0.py",
         at='"apps'),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed_pipeline_is_reported_at_its_key(project: Path, case: Case) -> None:
    if isinstance(case.change, tuple):
        text = edit(project, *case.change)
    else:
        old = project.read_text(encoding="utf-8")
        text = case.change if isinstance(case.change, str) else case.change(old)
        project.write_text(text, encoding="utf-8")

    with pytest.raises(PipelineError) as info:
        load_pipeline(project)

    err = info.value
    assert type(err) is PipelineError
    assert case.message in err.message
    loc = err.location
    assert loc is not None and Path(loc.file).name == "pipeline.yaml"
    assert loc.key_path == case.key_path
    line = line_of(text, case.line)
    assert loc.line == line, err.render()
    source = text.splitlines()[line - 1]
    assert loc.source == source
    if case.at is not None:
        assert loc.column == source.index(case.at) + 1, err.render()
    if case.hint is not None:
        assert err.hint == case.hint
    if case.found is not None:
        assert case.found in (err.found or "")
    assert err.expected and err.found, err.render()


def test_a_non_finite_machine_number_says_what_range_it_needs(project: Path) -> None:
    edit(project, "clock_mhz: 500", "clock_mhz: .nan")
    with pytest.raises(PipelineError) as info:
        load_pipeline(project)
    assert info.value.expected == "a finite number >= 0.001 and <= 1000000"
    edit(project, "clock_mhz: .nan", "clock_mhz: 0.001")
    edit(project, "bytes_per_cycle: 16", "bytes_per_cycle: -.inf")
    with pytest.raises(PipelineError) as info:
        load_pipeline(project)
    assert info.value.message == "'machines.npu-tiny.dma.bytes_per_cycle' is not a finite number"
    assert info.value.expected == "a finite number >= 0.001 and <= 1073741824"
    assert info.value.found == "-.inf"


def test_there_are_enough_malformed_cases() -> None:
    assert len(CASES) >= 22 and len({c.id for c in CASES}) == len(CASES)


def test_unknown_key_lists_the_valid_keys(project: Path) -> None:
    edit(project, "  gemm:\n    dtype: f32", "  gemm:\n    dtyp: f32")
    with pytest.raises(PipelineError) as info:
        load_pipeline(project)
    for key in ("function", "dtype", "dtypes", "shapes", "options", "tolerance", "machine"):
        assert key in info.value.expected
    rendered = info.value.render()
    assert "pipeline.yaml:" in rendered and "did you mean 'dtype'?" in rendered
    assert "\n  |     dtyp: f32\n  |     ^\n" in rendered  # the source line, a caret under the key


def test_missing_file_is_a_pipeline_error(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="not found"):
        load_pipeline(tmp_path / "nope.yaml")


# -- normalization --------------------------------------------------------------------


MINIMAL = """\
project: tiny
packages: [kernels]
kernels:
  scale:
    shapes: {N: 8, M: 4}
stages:
  - name: trace
    module: {module}
"""


def test_example_pipeline_normalizes_in_file_order(project: Path) -> None:
    p = load_pipeline(project)
    assert p.path == project and p.path.is_absolute() and p.root == project.parent
    assert p.project == "kiln-examples" and p.packages == ("kernels",)
    assert p.machine == "npu-v1" and p.cache_check == "timestamp"
    assert [k.name for k in p.kernels][:3] == ["vector_add", "gemm", "gemm_bias_relu"]
    gemm = p.kernel("gemm")
    assert gemm.shapes[0] == ("small", (("M", 64), ("K", 64), ("N", 64)))
    assert gemm.shape_set("large") == {"M": 256, "K": 256, "N": 256}
    assert gemm.shape_set_names[:2] == ("small", "large")
    assert [s.name for s in p.stages] == list(STAGE_NAMES)
    assert p.stages[1] == StageSpec("visa", f"{FAKE}.visa", (("fusion", True),))
    assert p.dumps[0].kernels == ("softmax",) and p.dumps[0].kinds[0] == "visa"
    assert p.target("sim").runner == "sim" and p.target("sim").machine == "npu-v1"
    assert p.target("iree-cpu").options == (("device", "llvm-cpu"),)
    assert list(p.machines) == ["npu-v1", "npu-tiny"]
    assert p.app("mlp").module == "apps.mlp" and p.app("mlp").tests == ("apps/tests/test_mlp.py",)
    with pytest.raises(KeyError):
        p.kernel("nope")
    with pytest.raises(KeyError):
        p.target("nope")


def test_defaults_and_flat_shapes_become_the_default_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tiny_trace.py").write_text("")
    path = tmp_path / "pipeline.yaml"
    path.write_text(MINIMAL.replace("{module}", "tiny_trace"))
    monkeypatch.delenv("KILN_OUT_DIR", raising=False)
    p = load_pipeline(path)  # tiny_trace is found next to pipeline.yaml, not on sys.path
    assert str(tmp_path) not in sys.path
    assert p.kernels == (KernelSpec("scale", shapes=(("default", (("N", 8), ("M", 4))),)),)
    assert p.kernels[0].dtype == "f32" and p.kernels[0].arg_dtype("x") == "f32"
    assert p.out_dir == "build/kiln/kernel" and p.cache_check == "timestamp"
    assert p.stages == (StageSpec("trace", "tiny_trace"),) and p.dumps == () and p.apps == ()
    # what the file leaves out comes from Kiln's built-in defaults
    assert p.machine == "npu-v1" and list(p.machines) == ["npu-v1", "npu-tiny"]
    assert [t.name for t in p.targets] == ["cpu", "sim", "iree-cpu", "iree-cuda"]
    assert p.is_builtin("machines.npu-v1.clock_mhz") and not p.is_builtin("stages[0]")
    assert p.resolve_out_dir() == tmp_path / "build" / "kiln" / "kernel"


def test_stage_module_is_located_not_imported(tmp_path: Path) -> None:
    (tmp_path / "boom_stage.py").write_text("raise RuntimeError('imported!')\n")
    path = tmp_path / "pipeline.yaml"
    path.write_text(MINIMAL.replace("{module}", "boom_stage"))
    load_pipeline(path)
    assert "boom_stage" not in sys.modules


def test_stage_options_merge_kernel_overrides(project: Path) -> None:
    edit(project, "  gemm:\n    dtype: f32", "  gemm:\n    options:\n      visa: {tile: 16}\n"
         "      schedule: {policy: greedy}\n    dtype: f32")  # fmt: skip
    p = load_pipeline(project)
    assert p.stage_options("gemm", "visa") == {"fusion": True, "tile": 16}
    assert p.stage_options(p.kernel("gemm"), "schedule") == {"policy": "greedy"}
    assert p.stage_options("softmax", "visa") == {"fusion": True}
    assert p.stage_options("softmax", "trace") == {}


def test_overlapping_dump_entries_ask_for_each_dump_once(project: Path) -> None:
    edit(project, "  - kernels: [softmax]\n    kinds: [visa, schedule, summary]\n",
         "  - {kernels: [softmax, gemm], kinds: [visa]}\n"
         "  - {kernels: [softmax], kinds: [visa, summary]}\n"
         "  - {kernels: [gemm, softmax], kinds: [summary, visa, dfg]}\n")  # fmt: skip
    assert load_pipeline(project).dumps == (
        DumpSpec(("softmax", "gemm"), ("visa",)),
        DumpSpec(("softmax",), ("summary",)),
        DumpSpec(("gemm",), ("summary", "dfg")),
        DumpSpec(("softmax",), ("dfg",)),
    )


@pytest.mark.parametrize(
    "written, value",
    [("1e-5", 1e-5), ("1E3", 1e3), ("1.0e5", 1e5), (".5e1", 5.0), ("+3e0", 3.0)],
)
def test_scientific_notation_without_a_dot_is_a_number(
    project: Path, written: str, value: float
) -> None:
    edit(project, "  gemm:\n    dtype: f32", f"  gemm:\n    tolerance: {{atol: {written}}}\n"
         "    dtype: f32")  # fmt: skip
    edit(project, "clock_mhz: 500", "clock_mhz: 5e2")
    p = load_pipeline(project)
    assert p.kernel("gemm").tolerance == {"atol": value}
    assert p.machine_model("npu-tiny")["clock_mhz"] == 500.0


def test_a_kernel_of_fixed_sizes_needs_no_shapes(project: Path) -> None:
    edit(project, "  transpose:\n    dtype: f32\n    shapes:\n" + TRANSPOSE,
         "  transpose:\n    dtype: f32\n  fixed: {shapes: {s: {}}}\n")  # fmt: skip
    p = load_pipeline(project)
    assert p.kernel("transpose").shapes == (("default", ()),)
    assert p.kernel("fixed").shapes == (("s", ()),)


def test_an_empty_shapes_mapping_is_still_an_error(project: Path) -> None:
    edit(project, "  transpose:\n    dtype: f32\n    shapes:\n" + TRANSPOSE,
         "  transpose:\n    dtype: f32\n    shapes: {}\n")  # fmt: skip
    with pytest.raises(PipelineError, match="kernel 'transpose' has no shape sets") as info:
        load_pipeline(project)
    assert info.value.location.key_path == "kernels.transpose.shapes"


def test_per_argument_dtypes_tolerance_and_function(project: Path) -> None:
    edit(project, "  gemm:\n    dtype: f32", "  gemm:\n    function: kernels.linalg.gemm\n"
         "    dtypes: {b: f16}\n    tolerance: {rtol: 0.001}\n    dtype: bf16")  # fmt: skip
    gemm = load_pipeline(project).kernel("gemm")
    assert gemm.function == "kernels.linalg.gemm" and gemm.dtype == "bf16"
    assert gemm.dtypes == (("b", "f16"),) and gemm.arg_dtype("b") == "f16"
    assert gemm.arg_dtype("a") == "bf16" and gemm.tolerance == {"rtol": 0.001}


def test_machine_model_default_named_and_unknown(project: Path) -> None:
    p = load_pipeline(project)
    assert p.machine_model()["clock_mhz"] == 1000
    assert p.machine_model("npu-tiny")["tensor"]["tile"] == [16, 16, 16]
    assert p.kernel_machine("gemm") is p.machine_model()
    with pytest.raises(PipelineError, match="unknown machine 'npu-x'"):
        p.machine_model("npu-x")
    edit(project, "machine: npu-v1\n\nkernels", "kernels")  # no `machine:`: the built-in default
    unnamed = load_pipeline(project)
    assert unnamed.machine == "npu-v1" and unnamed.is_builtin("machine")
    assert unnamed.machine_model() == p.machine_model()


def test_runner_plugin_names_are_accepted(project: Path) -> None:
    edit(project, "cpu: {runner: cpu}", "cpu: {runner: 'acme_npu.runner:Runner'}")
    assert load_pipeline(project).target("cpu").runner == "acme_npu.runner:Runner"


def test_anchors_and_merge_keys_share_settings(project: Path) -> None:
    edit(project, "  vector_add:\n    dtype: f32", "  vector_add: &base\n    dtype: f16")
    edit(project, "  row_max:\n    dtype: f32", "  row_max:\n    <<: *base\n    dtype: f32")
    p = load_pipeline(project)
    assert p.kernel("row_max").dtype == "f32"  # an explicit key wins over the merged one
    assert p.kernel("row_max").shapes == p.kernel("row_sum").shapes
    assert p.kernel("vector_add").dtype == "f16"


def test_out_dir_env_then_file_then_default(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = load_pipeline(project)
    monkeypatch.setenv("KILN_OUT_DIR", "/abs/out")
    assert p.resolve_out_dir() == Path("/abs/out")
    monkeypatch.setenv("KILN_OUT_DIR", "rel/out")
    assert p.resolve_out_dir() == project.parent / "rel" / "out"
    monkeypatch.delenv("KILN_OUT_DIR")
    edit(project, "out_dir: build/kiln/kernel", "out_dir: elsewhere")
    assert load_pipeline(project).resolve_out_dir() == project.parent / "elsewhere"


def test_model_is_frozen(project: Path) -> None:
    p = load_pipeline(project)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.project = "x"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.kernels[0].dtype = "f16"  # type: ignore[misc]


def test_locate_points_at_keys_for_later_checks(project: Path) -> None:
    text = project.read_text()
    p = load_pipeline(project)
    loc = p.locate("kernels.gemm.shapes.small")
    line = text.splitlines().index("      small: {M: 64, K: 64, N: 64}") + 1
    assert (loc.line, loc.column, loc.key_path) == (line, 7, "kernels.gemm.shapes.small")
    assert p.locate("kernels.gemm.shapes.small", value=True).column == 14
    missing = p.locate("kernels.gemm.shapes.small.B")  # not written: falls back to the set
    assert missing.key_path == "kernels.gemm.shapes.small.B" and missing.line == line
    assert p.locate("stages[1].options").source == "    options: {fusion: true}"
    err = p.error("kernel 'gemm' not found in packages", "kernels.gemm", expected="x", found="y")
    assert isinstance(err, PipelineError) and err.location.source == "  gemm:"


def test_vector_latency_keys_are_the_vector_units_visa_ops() -> None:
    from kiln.ir.visa_records import OPS

    machine = load_schema()["$defs"]["machine"]["properties"]
    names = machine["vector"]["properties"]["latency"]["propertyNames"]["enum"]
    assert names == ["default", *(name for name, spec in OPS.items() if spec.unit == "vector")]


def test_schema_is_valid_draft_2020_12() -> None:
    from jsonschema import Draft202012Validator

    schema = load_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)


# -- the cached form ------------------------------------------------------------------


def test_cached_load_returns_an_equal_pipeline(project: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = load_pipeline_cached(project, cache)
    assert len(list(cache.glob("*.pickle"))) == 1 and not list(cache.glob("*.tmp"))
    second = load_pipeline_cached(project, cache)
    assert second == first == load_pipeline(project) and second is not first
    assert second.locate("kernels.gemm").line == first.locate("kernels.gemm").line


def test_cache_hit_does_not_parse_yaml(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    load_pipeline_cached(project, tmp_path / "cache")

    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("parsed YAML on a cache hit")

    monkeypatch.setattr("kiln.pipeline.load.load_yaml", fail)
    assert load_pipeline_cached(project, tmp_path / "cache").project == "kiln-examples"


def test_cache_is_invalidated_by_an_edit(project: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert load_pipeline_cached(project, cache).project == "kiln-examples"
    edit(project, "project: kiln-examples", "project: renamed-project")
    assert load_pipeline_cached(project, cache).project == "renamed-project"
    edit(project, "  gemm:\n    dtype: f32", "  gemm:\n    dtyp: f32")
    with pytest.raises(PipelineError, match="unknown key 'dtyp'"):
        load_pipeline_cached(project, cache)


def test_corrupt_cache_is_rebuilt(project: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    load_pipeline_cached(project, cache)
    (pickled,) = cache.glob("*.pickle")
    pickled.write_bytes(b"not a pickle")
    assert load_pipeline_cached(project, cache) == load_pipeline(project)
    assert pickle.loads(pickled.read_bytes())[1].project == "kiln-examples"


def test_cache_hit_does_not_import_jsonschema(project: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    load_pipeline_cached(project, cache)
    code = textwrap.dedent(f"""
        import sys
        import kiln
        before = set(sys.modules)
        from kiln.pipeline import load_pipeline_cached
        p = load_pipeline_cached({str(project)!r}, {str(cache)!r})
        assert p.kernel("gemm").name == "gemm"
        print(sorted(m for m in ("jsonschema", "yaml") if m in sys.modules and m not in before))
    """)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_large_pipeline_round_trips_through_the_cache(project: Path, tmp_path: Path) -> None:
    text = project.read_text()
    many = "".join(f"  k{i}:\n    shapes:\n      small: {{M: {i + 1}, N: 8}}\n" for i in range(600))
    project.write_text(text.replace("kernels:\n", "kernels:\n" + many, 1))
    first = load_pipeline_cached(project, tmp_path / "cache")
    again = load_pipeline_cached(project, tmp_path / "cache")
    assert again == first and len(again.kernels) == 610
    assert again.kernel("k599").shape_set("small") == {"M": 600, "N": 8}
    k599_small = line_of(text, "^kernels:") + 3 * 599 + 3
    assert again.locate("kernels.k599.shapes.small.M").line == k599_small


def test_pickle_leaves_out_the_source_map(project: Path) -> None:
    p = load_pipeline(project)
    p.kernel("gemm")  # builds the private index
    clone = pickle.loads(pickle.dumps(p))
    assert clone == p and clone._source is None and clone._index is None
    assert isinstance(clone, Pipeline) and clone.kernel("gemm") == p.kernel("gemm")
