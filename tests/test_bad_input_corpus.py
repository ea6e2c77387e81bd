"""A corpus of malformed projects, each run through `kiln compile` and `doit compile`.

Every case breaks one copy of a project that was built once for the
session, then runs both entry points (in-process: ``kiln.cli.command.main`` and
doit with the namespace a dodo.py gets; a case that imports kernel code
runs in a subprocess, where module caches cannot leak between cases) and
asserts what a user is promised: a non-zero exit, no traceback, one
message naming the file:line or the key path, nothing built before
changed, and nothing written outside the project's out dir and state.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import REPO, SMALL_PIPELINE, machines_yaml, run_kiln

BUILD = "build/kiln/kernel"
DODO = "from kiln.tasks.dag.loader import dodo_namespace\n\nglobals().update(dodo_namespace())\n"
LOCATED = re.compile(r"^\S+?:\d+(?::\d+)?: error: |^\s+at key: ", re.M)


@dataclass
class Case:
    id: str
    breaks: Callable[[Path], None]  # what the case does to the project copy
    message: str  # a fragment of the message
    where: str | None = None  # a fragment naming the place: "pipeline.yaml:7", "at key: x"
    env: dict[str, str] = field(default_factory=dict)
    isolated: bool = False  # imports kernel code: run in a subprocess
    located: bool = True  # the message has a `file:line: error:` header or an `at key:`


# -- ways to break a project -------------------------------------------------------------


def replace(old: str, new: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        path = root / "pipeline.yaml"
        text = path.read_text()
        assert old in text, f"pipeline.yaml has no {old!r}"
        path.write_text(text.replace(old, new, 1))

    return apply


def append(block: str) -> Callable[[Path], None]:
    return lambda root: (root / "pipeline.yaml").write_text(
        (root / "pipeline.yaml").read_text() + block
    )


def pipeline_text(text: str | bytes) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        path = root / "pipeline.yaml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())

    return apply


def write(rel: str, content: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(content)

    return apply


def both(*changes: Callable[[Path], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        for change in changes:
            change(root)

    return apply


def file_in_place_of(rel: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        path = root / rel
        if path.is_dir():
            shutil.rmtree(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("not a directory\n")

    return apply


def remove(rel: str) -> Callable[[Path], None]:
    return lambda root: (root / rel).unlink()


def dangling_pipeline(root: Path) -> None:
    (root / "pipeline.yaml").unlink()
    (root / "pipeline.yaml").symlink_to(root / "nowhere.yaml")


def pipeline_is_dir(root: Path) -> None:
    (root / "pipeline.yaml").unlink()
    (root / "pipeline.yaml").mkdir()


def alias_bomb() -> str:
    rows = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for n in range(1, 10):
        rows.append(f"a{n}: &a{n} [" + ", ".join([f"*a{n - 1}"] * 9) + "]")
    return "\n".join(rows) + "\n"


STAGE = "  - {{name: {name}, module: {module}}}\n"
DUMPS = "dumps:\n  - kernels: [{kernels}]\n    kinds: [{kinds}]\n"
EXIT_AT_IMPORT = "import sys\n\nsys.exit(0)\n"
RAISE_AT_IMPORT = "raise RuntimeError('kernel package refuses to load')\n"

# fmt: off
CASES = [
    # malformed YAML
    Case("syntax_error", replace("project: e2e", "project: e2e: oops"),
         "invalid YAML", "pipeline.yaml:1:"),
    Case("unclosed_quote", replace("project: e2e", 'project: "e2e'),
         "unclosed quote", "pipeline.yaml:1:"),
    Case("tab_indentation", replace("    shapes:\n      small: {N: 256}", "\tshapes: {}"),
         "invalid YAML", "pipeline.yaml:"),
    Case("unclosed_bracket", replace("packages: [kernels]", "packages: [kernels"),
         "invalid YAML", "pipeline.yaml:"),
    Case("duplicate_key", replace("  softmax:\n", "  vector_add:\n"),
         "duplicate key 'vector_add'", "at key: kernels.vector_add"),
    Case("root_is_list", pipeline_text("- project: e2e\n"),
         "top level of the pipeline must be a mapping", "pipeline.yaml:1"),
    Case("root_is_scalar", pipeline_text("just words\n"),
         "top level of the pipeline must be a mapping", "pipeline.yaml:1"),
    Case("empty_file", pipeline_text(""), "pipeline file is empty", "pipeline.yaml:1"),
    Case("only_comments", pipeline_text("# nothing here\n"), "pipeline file is empty",
         "pipeline.yaml:1"),
    Case("nul_bytes", pipeline_text(b"project: e2e\x00\x00\n"), "invalid YAML", "pipeline.yaml"),
    Case("not_utf8", pipeline_text(b"project: e2e\nx: \xff\xfe\n"), "not UTF-8",
         "pipeline.yaml:2:4"),
    Case("binary_garbage", pipeline_text(bytes(range(256)) * 4), "not UTF-8", "pipeline.yaml:"),
    Case("alias_bomb", pipeline_text(alias_bomb()), "aliases expand to too many values",
         "pipeline.yaml:"),
    Case("deep_nesting_flow", pipeline_text("project: " + "[" * 10000 + "]" * 10000 + "\n"),
         "nest", "pipeline.yaml:1:"),
    Case("deep_nesting_block", pipeline_text(
        "project: e2e\nx:\n" + "".join(" " * (i + 1) + f"k{i}:\n" for i in range(120))),
         "nested too deeply", "pipeline.yaml:"),
    Case("python_object_tag",
         replace("project: e2e", "project: !!python/object/apply:os.getcwd []"),
         "not allowed", "pipeline.yaml:1:"),
    Case("python_name_tag", replace("project: e2e", "project: !!python/name:os.getcwd"),
         "could not determine a constructor", "pipeline.yaml:1:"),
    Case("undefined_alias", replace("packages: [kernels]", "packages: *pkgs"),
         "invalid YAML", "pipeline.yaml:2:"),
    Case("recursive_alias", append("extra: &loop [*loop]\n"), "recursive YAML alias",
         "pipeline.yaml:"),
    Case("mapping_as_key", append("? {a: 1}\n: 2\n"), "mapping keys must be plain names",
         "pipeline.yaml:"),
    Case("huge_file", pipeline_text("# " + "x" * (9 * 1024 * 1024) + "\n"),
         "pipeline file is too large", "pipeline.yaml", located=False),
    # schema violations
    Case("project_wrong_type", replace("project: e2e", "project: [e2e]"),
         "wrong type for 'project'", "at key: project"),
    Case("project_missing", replace("project: e2e\n", ""),
         "missing required key 'project'", "at key: project"),
    Case("packages_not_list", replace("packages: [kernels]", "packages: 7"),
         "wrong type for 'packages'", "at key: packages"),
    Case("package_item_number", replace("packages: [kernels]", "packages: [3]"),
         "packages[0]", "at key: packages[0]"),
    Case("kernels_not_mapping", lambda root: (root / "pipeline.yaml").write_text(re.sub(
        r"kernels:\n(  .*\n)+", "kernels: [vector_add]\n", (root / "pipeline.yaml").read_text())),
         "wrong type for 'kernels'", "at key: kernels"),
    Case("kernel_unknown_key", replace("  softmax:\n", "  softmax:\n    shapez: {}\n"),
         "unknown key 'shapez'", "at key: kernels.softmax.shapez"),
    Case("shapes_missing",
         replace("  softmax:\n    shapes:\n      small: {R: 8, C: 64}\n", "  softmax: {}\n"),
         "shape symbol 'R' of argument 'x' of kernel 'softmax' is not bound",
         "at key: kernels.softmax"),
    Case("dim_is_string", replace("small: {N: 256}", "small: {N: many}"),
         "kernels.vector_add.shapes.small", "pipeline.yaml:7:"),
    Case("dim_is_float", replace("small: {N: 256}", "small: {N: 2.5}"),
         "kernels.vector_add.shapes.small", "pipeline.yaml:7:"),
    Case("dim_is_zero", replace("small: {N: 256}", "small: {N: 0}"),
         "out of range", "at key: kernels.vector_add.shapes.small.N"),
    Case("dim_is_huge", replace("small: {N: 256}", "small: {N: 1099511627776}"),
         "too large", "pipeline.yaml:7:"),
    Case("dim_is_boolean", replace("small: {N: 256}", "small: {N: true}"),
         "kernels.vector_add.shapes.small", "pipeline.yaml:7:"),
    Case("dtype_unknown", replace("  softmax:\n", "  softmax:\n    dtype: f64\n"),
         "invalid value for 'kernels.softmax.dtype'", "at key: kernels.softmax.dtype"),
    Case("dtypes_unknown_argument", replace("  softmax:\n", "  softmax:\n    dtypes: {zz: i32}\n"),
         "has no argument 'zz'", "at key: kernels.softmax.dtypes.zz"),
    Case("stages_missing", replace("stages:\n", "stagez:\n"),
         "unknown key 'stagez'", "pipeline.yaml:"),
    Case("stages_empty", lambda root: (root / "pipeline.yaml").write_text(re.sub(
        r"stages:\n(  - .*\n)+", "stages: []\n", (root / "pipeline.yaml").read_text())),
         "stages", "at key: stages"),
    Case("stage_unknown_key", replace("{name: lir, module: kiln.stages.lir}",
                                      "{name: lir, module: kiln.stages.lir, opts: {}}"),
         "unknown key 'opts'", "at key: stages[2].opts"),
    Case("stage_name_invalid", replace("{name: lir,", "{name: 'l i r',"),
         "stages[2].name", "pipeline.yaml:"),
    Case("cache_check_invalid", replace("project: e2e\n", "project: e2e\ncache: {check: sha1}\n"),
         "invalid value for 'cache.check'", "at key: cache.check"),
    Case("out_dir_wrong_type", replace("project: e2e\n", "project: e2e\nout_dir: [a, b]\n"),
         "wrong type for 'out_dir'", "at key: out_dir"),
    Case("machine_clock_negative", replace("clock_mhz: 1000", "clock_mhz: -5"),
         "out of range", "clock_mhz"),
    Case("machine_unknown_unit", replace("units: {dma: 2, tensor: 1, vector: 2}",
                                         "units: {dma: 2, tensor: 1, vektor: 2}"),
         "unknown key 'vektor'", "at key: machines.npu-v1.units.vektor"),
    Case("targets_not_mapping",
         replace("targets:\n  cpu: {runner: cpu}\n  sim: {runner: sim, machine: npu-v1}\n",
                 "targets: [cpu, sim]\n"),
         "wrong type for 'targets'", "at key: targets"),
    Case("dump_kind_unknown", append(DUMPS.format(kernels="softmax", kinds="sched")),
         "invalid value for 'dumps[0].kinds[0]'", "at key: dumps[0].kinds[0]"),
    Case("kernel_name_with_slash", replace("  softmax:\n", "  ../softmax:\n"),
         "invalid name", "pipeline.yaml:"),
    Case("shape_set_with_slash", replace("small: {R: 8, C: 64}", "a/../../b: {R: 8, C: 64}"),
         "invalid name", "pipeline.yaml:"),
    Case("kernel_name_with_escape", replace("  softmax:\n", '  "\\e[2Jsoftmax":\n'),
         "control character", "\\x1b[2J"),
    Case("kernel_name_with_newline", replace("  softmax:\n", '  "softmax\\n":\n'),
         "control character", "softmax\\n"),
    Case("kernel_name_with_nul", replace("  softmax:\n", '  "soft\\0max":\n'),
         "control character", "\\x00"),
    # every other key of the schema: a wrong type or an out-of-range value
    *[Case(f"key_{path.replace('.', '_').replace('-', '_')}", change, path, f"at key: {path}")
      for path, change in [
          ("apps", append("apps: [demo]\n")),
          ("apps.demo.module", append("apps:\n  demo: {tests: [t.py]}\n")),
          ("apps.demo.shapes", append("apps:\n  demo: {module: demo, shapes: 3}\n")),
          ("apps.demo.tests", append("apps:\n  demo: {module: demo, tests: t.py}\n")),
          ("cache", replace("project: e2e\n", "project: e2e\ncache: md5\n")),
          ("dumps", append("dumps: {kinds: [visa]}\n")),
          ("dumps[0].kernels", append("dumps:\n  - kinds: [visa]\n")),
          ("kernels.softmax.function", replace("  softmax:\n", "  softmax:\n    function: 7\n")),
          ("kernels.softmax.machine", replace("  softmax:\n", "  softmax:\n    machine: [a]\n")),
          ("kernels.softmax.options", replace("  softmax:\n", "  softmax:\n    options: [visa]\n")),
          ("kernels.softmax.tolerance.atol",
           replace("  softmax:\n", "  softmax:\n    tolerance: {atol: -1}\n")),
          ("kernels.softmax.tolerance.rtol",
           replace("  softmax:\n", "  softmax:\n    tolerance: {rtol: lots}\n")),
          ("machine", replace("machine: npu-v1\nkernels", "machine: 3\nkernels")),
          ("machines", lambda root: (root / "pipeline.yaml").write_text(
              (root / "pipeline.yaml").read_text().split("machines:\n")[0] + "machines: 5\n")),
          ("machines.npu-v1.sram_bytes", replace("sram_bytes: 4194304", "sram_bytes: 0")),
          ("machines.npu-v1.dma.bytes_per_cycle",
           replace("bytes_per_cycle: 64", "bytes_per_cycle: 0")),
          ("machines.npu-v1.dma.latency", replace("latency: 100}", "latency: soon}")),
          ("machines.npu-v1.tensor.cycles_per_tile",
           replace("cycles_per_tile: 32", "cycles_per_tile: -1")),
          ("machines.npu-v1.units.dma", replace("units: {dma: 2,", "units: {dma: two,")),
          ("machines.npu-v1.vector.lanes", replace("lanes: 64", "lanes: many")),
          ("stages[1].options", replace("{name: visa, module: kiln.stages.visa}",
                                        "{name: visa, module: kiln.stages.visa, options: [x]}")),
          ("targets.cpu.options", replace("cpu: {runner: cpu}", "cpu: {runner: cpu, options: 1}")),
          ("targets.cpu.tolerance.atol",
           replace("cpu: {runner: cpu}", "cpu: {runner: cpu, tolerance: {atol: x}}")),
          ("tuning", replace("project: e2e\n", "project: e2e\ntuning: yes\n")),
          ("tuning.file", replace("project: e2e\n", "project: e2e\ntuning: {file: 3}\n")),
      ]],
    Case("sram_too_large_to_simulate",
         replace("sram_bytes: 4194304", "sram_bytes: 4611686018427387904"),
         "machines.npu-v1.sram_bytes", "at key: machines.npu-v1.sram_bytes"),
    # bad references
    Case("package_missing", replace("packages: [kernels]", "packages: [kernelz]"),
         "kernel package 'kernelz' was not found", "at key: packages[0]"),
    Case("package_syntax_error", write("kernels/normalization.py", "def f(:\n"),
         "cannot be parsed", "normalization.py:1"),
    Case("kernel_undefined", replace("  softmax:\n", "  softmaxx:\n"),
         "is not a @device function", "at key: kernels.softmaxx"),
    Case("kernel_function_undefined",
         replace("  softmax:\n", "  softmax:\n    function: kernels.nosuch.f\n"),
         "is not a @device function", "at key: kernels.softmax.function"),
    Case("default_machine_unknown", replace("machine: npu-v1\nkernels", "machine: npu-v9\nkernels"),
         "unknown machine 'npu-v9'", "at key: machine"),
    Case("target_machine_unknown", replace("sim: {runner: sim, machine: npu-v1}",
                                           "sim: {runner: sim, machine: npu-v7}"),
         "unknown machine 'npu-v7'", "at key: targets.sim.machine"),
    Case("runner_unknown", replace("runner: sim,", "runner: simm,"),
         "unknown runner 'simm'", "at key: targets.sim.runner"),
    Case("options_for_unknown_stage",
         replace("  softmax:\n", "  softmax:\n    options: {visaa: {}}\n"),
         "unknown stage 'visaa'", "at key: kernels.softmax.options.visaa"),
    Case("dump_kernel_unknown", append(DUMPS.format(kernels="softmaks", kinds="visa")),
         "unknown kernel 'softmaks'", "at key: dumps[0].kernels[0]"),
    Case("stage_module_missing", replace("module: kiln.stages.lir}", "module: kiln.stages.lirr}"),
         "cannot be found", "at key: stages[2].module"),
    Case("stage_module_is_os", replace("module: kiln.stages.lir}", "module: os}"),
         "not a Kiln stage", "at key: stages[2].module"),
    Case("stage_module_not_a_stage", replace("module: kiln.stages.lir}", "module: json.decoder}"),
         "not a Kiln stage", "at key: stages[2].module"),
    Case("stages_swapped", lambda root: (root / "pipeline.yaml").write_text(
        (root / "pipeline.yaml").read_text()
        .replace("module: kiln.stages.visa}", "module: TMP}")
        .replace("module: kiln.stages.lir}", "module: kiln.stages.visa}")
        .replace("module: TMP}", "module: kiln.stages.lir}")),
         "cannot follow", "at key: stages[1].module"),
    Case("duplicate_stage_name", replace("name: lir,", "name: visa,"),
         "duplicate stage name 'visa'", "at key: stages[2].name"),
    Case("package_exits_at_import", write("kernels/__init__.py", EXIT_AT_IMPORT),
         "sys.exit(0)", "kernels/__init__.py:3", isolated=True),
    Case("package_raises_at_import", write("kernels/__init__.py", RAISE_AT_IMPORT),
         "kernel package refuses to load", "kernels/__init__.py:1", isolated=True),
    # filesystem trouble
    Case("pipeline_missing", remove("pipeline.yaml"), "no pipeline file", None, located=False),
    Case("pipeline_is_directory", pipeline_is_dir, "is a directory, not a pipeline file", None,
         located=False),
    Case("pipeline_dangling_symlink", dangling_pipeline, "is a symbolic link to nothing", None,
         located=False),
    Case("state_dir_is_file", file_in_place_of(".kiln"), ".kiln", ".kiln", located=False),
    Case("out_dir_is_file", file_in_place_of(BUILD), "is a file", "at key: out_dir"),
    Case("out_dir_parent_is_file", file_in_place_of("build"), "is a file", "at key: out_dir"),
    Case("kiln_out_dir_env_is_file", write("outfile", "x\n"), "is a file", "$KILN_OUT_DIR",
         env={"KILN_OUT_DIR": "outfile"}, located=False),
    Case("kiln_pipeline_env_missing", lambda root: None, "KILN_PIPELINE names no pipeline", None,
         env={"KILN_PIPELINE": "nowhere/pipeline.yaml"}, located=False),
]
# fmt: on


# -- running them ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def corpus_base(tmp_path_factory) -> Path:
    """The conftest's small project with a dodo.py, fully built once."""
    root = tmp_path_factory.mktemp("corpus") / "base"
    shutil.copytree(
        REPO / "kernels", root / "kernels", ignore=shutil.ignore_patterns("__pycache__")
    )
    (root / "pipeline.yaml").write_text(SMALL_PIPELINE + machines_yaml())
    (root / "dodo.py").write_text(DODO)
    run_kiln(root, "compile", check=True)
    return root


def digests(root: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if any(rel == s or rel.startswith(s + "/") for s in skip) or "__pycache__" in rel:
            continue
        if path.is_file() and not path.is_symlink():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def run_in_process(root: Path, entry: str, env: dict[str, str], monkeypatch) -> tuple[int, str]:
    from doit.cmd_base import ModuleTaskLoader
    from doit.doit_cmd import DoitMain

    from kiln import cli
    from kiln.tasks.dag.loader import dodo_namespace

    monkeypatch.chdir(root)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            if entry == "kiln":
                rc = cli.main(["compile"])
            else:  # what `doit compile` does: import dodo.py, then run doit on its namespace
                rc = DoitMain(ModuleTaskLoader(dodo_namespace())).run(["compile"])
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
    return rc, out.getvalue() + err.getvalue()


def run_subprocess(root: Path, entry: str, env: dict[str, str]) -> tuple[int, str]:
    if entry == "kiln":
        proc = run_kiln(root, "compile", env=env)
    else:
        full_env = dict(os.environ, KILN_CACHE_DIR=str(root / ".cache"), **env)
        proc = subprocess.run(
            [sys.executable, "-m", "doit", "compile"],
            cwd=root,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("entry", ["kiln", "doit"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_project_gets_one_clear_message(corpus_base, tmp_path, monkeypatch, case, entry):
    root = tmp_path / "proj"
    shutil.copytree(corpus_base, root, symlinks=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep.txt").write_text("the user's\n")
    built = digests(root / BUILD)
    case.breaks(root)
    owned = ("build", ".kiln", ".cache")
    before = digests(tmp_path, skip=tuple(f"proj/{o}" for o in owned))
    monkeypatch.setenv("KILN_CACHE_DIR", str(root / ".cache"))
    monkeypatch.delenv("KILN_OUT_DIR", raising=False)
    monkeypatch.delenv("KILN_PIPELINE", raising=False)
    for key, value in case.env.items():
        monkeypatch.setenv(key, value)
    if case.isolated:
        rc, out = run_subprocess(root, entry, case.env)
    else:
        rc, out = run_in_process(root, entry, case.env, monkeypatch)

    assert rc in (1, 2), f"exit {rc}:\n{out}"
    assert "Traceback" not in out, out
    assert case.message in out, out
    if case.where is not None:
        assert case.where in out, out
    if case.located:
        assert LOCATED.search(out), f"no file:line or key path in:\n{out}"
    assert len(max(out.splitlines() or [""], key=len)) < 400, "an unclipped line"
    assert "\x1b" not in out and "\x00" not in out, "a control character reached the terminal"
    if (root / BUILD).is_dir():
        now = digests(root / BUILD)
        changed = [rel for rel, digest in built.items() if now.get(rel, digest) != digest]
        assert not changed, f"changed: {changed}"
    assert digests(tmp_path, skip=tuple(f"proj/{o}" for o in owned)) == before


def test_corpus_has_at_least_60_cases():
    assert len(CASES) >= 60 and len({c.id for c in CASES}) == len(CASES)
