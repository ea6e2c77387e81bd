"""Bad input through the real `kiln` CLI: a clear message at the right place, never a traceback.

Every case runs the CLI in a subprocess in a copy of one temporary project
that was built once for this module, then checks the message, where it
points (pipeline.yaml key path and line, or the kernel's own file, line
and source text), the exit code (2: bad input, 1: a failed build) and that
no artifact built before the failure was lost or changed.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.conftest import REPO, SMALL_PIPELINE, machines_yaml, run_kiln

BUILD = "build/kiln/kernel"
HEADER = re.compile(r"^(?P<file>\S+?):(?P<line>\d+)(?::(?P<col>\d+))?: error: (?P<msg>.*)$", re.M)


# -- the project, built once ---------------------------------------------------------


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """The conftest's small project (vector_add, softmax, gemm x2), fully built."""
    root = tmp_path_factory.mktemp("cli_errors") / "base"
    shutil.copytree(
        REPO / "kernels", root / "kernels", ignore=shutil.ignore_patterns("__pycache__")
    )
    (root / "pipeline.yaml").write_text(SMALL_PIPELINE + machines_yaml())
    run_kiln(root, "compile", check=True)
    return root


@pytest.fixture(scope="module")
def built(base) -> dict[str, tuple[str, int]]:
    """Every artifact of the base project: relative path -> (sha256, mtime_ns)."""
    return snapshot(base)


@pytest.fixture
def proj(base, tmp_path) -> Path:
    dest = tmp_path / "proj"
    shutil.copytree(base, dest, symlinks=True)
    return dest


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    out = {}
    for path in sorted((root / BUILD).rglob("*")):
        if path.is_file():
            rel = path.relative_to(root).as_posix()
            out[rel] = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
    return out


def assert_nothing_lost(root: Path, built: dict, rebuilt: tuple[str, ...] = ()) -> None:
    """Every artifact built before is still there; those of kernels not in ``rebuilt`` unchanged."""
    now = snapshot(root)
    for rel, (digest, _) in built.items():
        assert rel in now, f"{rel} was lost"
        kernel = rel[len(BUILD) + 1 :].split("/")[0]
        if kernel not in rebuilt:
            assert now[rel][0] == digest, f"{rel} changed"


def edit(root: Path, change) -> str:
    """Apply ``change`` ((old, new), a function of the text, or the new text) to pipeline.yaml."""
    path = root / "pipeline.yaml"
    text = path.read_text()
    if isinstance(change, tuple):
        old, new = change
        assert old in text, f"pipeline.yaml has no {old!r}"
        text = text.replace(old, new, 1)
    elif callable(change):
        text = change(text)
    else:
        text = change
    path.write_text(text)
    return text


def line_of(text: str, marker: str) -> int:
    hits = [n for n, line in enumerate(text.splitlines(), 1) if marker in line]
    assert len(hits) == 1, f"marker {marker!r} is on lines {hits}"
    return hits[0]


def assert_clean_failure(proc: subprocess.CompletedProcess, code: int) -> str:
    """Exit ``code``, no Python traceback anywhere; returns stdout + stderr."""
    text = proc.stdout + proc.stderr
    assert proc.returncode == code, f"exit {proc.returncode}, wanted {code}:\n{text}"
    assert "Traceback" not in proc.stdout and "Traceback" not in proc.stderr, text
    return text


def header(text: str) -> re.Match:
    match = HEADER.search(text)
    assert match, f"no `file:line: error:` header in:\n{text}"
    return match


# -- (a) malformed pipeline.yaml ------------------------------------------------------------


class Bad(NamedTuple):
    id: str
    change: tuple[str, str] | Callable[[str], str] | str
    message: str  # substring of the output
    key_path: str | None  # shown as `at key: ...`
    line: str  # marker of the line the header must name
    hint: str | None = None


def _append(block: str) -> Callable[[str], str]:
    return lambda text: text + block


def _drop(line: str) -> Callable[[str], str]:
    def drop(text: str) -> str:
        assert line in text
        return text.replace(line, "", 1)

    return drop


DUMPS = "dumps:\n  - kernels: [{kernels}]\n    kinds: [{kinds}]\n"
# fmt: off
BAD_PIPELINES = [
    Bad("unknown_top_level_key", ("project: e2e", "projekt: e2e"),
        "unknown key 'projekt'", "projekt", "projekt: e2e", "did you mean 'project'?"),
    Bad("unknown_kernel_key", ("  softmax:\n", "  softmax:\n    dtyp: f32\n"),
        "unknown key 'dtyp' in 'kernels.softmax'", "kernels.softmax.dtyp", "dtyp: f32",
        "did you mean 'dtype'?"),
    Bad("shapes_wrong_type", ("small: {N: 256}", "small: [256]"),
        "wrong type for 'kernels.vector_add.shapes.small'", "kernels.vector_add.shapes.small",
        "small: [256]"),
    Bad("negative_dim", ("small: {N: 256}", "small: {N: -4}"),
        "out of range", "kernels.vector_add.shapes.small.N", "{N: -4}"),
    Bad("unknown_dtype", ("  softmax:\n", "  softmax:\n    dtype: f64\n"),
        "invalid value for 'kernels.softmax.dtype'", "kernels.softmax.dtype", "dtype: f64"),
    Bad("cache_check_invalid", ("project: e2e\n", "project: e2e\ncache: {check: sha1}\n"),
        "invalid value for 'cache.check'", "cache.check", "check: sha1"),
    Bad("unknown_stage_module", ("module: kiln.stages.lir}", "module: kiln.stages.lirr}"),
        "stage 'lir' names a module that cannot be found", "stages[2].module", "kiln.stages.lirr"),
    Bad("stage_without_module", ("{name: lir, module: kiln.stages.lir}", "{name: lir}"),
        "missing required key 'module'", "stages[2].module", "{name: lir}"),
    Bad("duplicate_stage_name", ("name: lir,", "name: visa,"),
        "duplicate stage name 'visa'", "stages[2].name", "kiln.stages.lir"),
    Bad("duplicate_yaml_key", ("  gemm:\n", "  softmax:  # twice\n"),
        "duplicate key 'softmax'", "kernels.softmax", "# twice"),
    Bad("invalid_yaml_syntax", ("project: e2e", "project: e2e: oops"),
        "invalid YAML", None, "e2e: oops"),
    Bad("unknown_default_machine", ("machine: npu-v1\nkernels", "machine: npu-v3\nkernels"),
        "unknown machine 'npu-v3'", "machine", "npu-v3", "did you mean 'npu-v1'?"),
    Bad("unknown_target_machine", ("sim: {runner: sim, machine: npu-v1}",
                                   "sim: {runner: sim, machine: npu-v2}"),
        "unknown machine 'npu-v2'", "targets.sim.machine", "npu-v2", "did you mean 'npu-v1'?"),
    Bad("unknown_kernel_machine", ("  softmax:\n", "  softmax:\n    machine: npu-tiny2\n"),
        "unknown machine 'npu-tiny2'", "kernels.softmax.machine", "npu-tiny2",
        "did you mean 'npu-tiny'?"),
    Bad("kernel_not_in_any_package", ("  softmax:\n", "  softmaxx:\n"),
        "kernel 'softmaxx' is not a @device function in any package", "kernels.softmaxx",
        "softmaxx:", "did you mean 'softmax'?"),
    Bad("shape_symbol_unbound", ("small: {R: 8, C: 64}", "small: {R: 8}"),
        "shape symbol 'C' of argument 'x' of kernel 'softmax' is not bound by shape set 'small'",
        "kernels.softmax.shapes.small", "small: {R: 8}"),
    Bad("empty_file", "", "pipeline file is empty", None, ""),
    Bad("packages_missing", _drop("packages: [kernels]\n"),
        "missing required key 'packages'", "packages", "project: e2e"),
    Bad("packages_empty", ("packages: [kernels]", "packages: []"),
        "must not be empty", "packages", "packages: []"),
    Bad("dumps_kind_unknown", _append(DUMPS.format(kernels="softmax", kinds="visa, sched")),
        "invalid value for 'dumps[0].kinds[1]'", "dumps[0].kinds[1]", "kinds: [visa, sched]",
        "did you mean 'schedule'?"),
    Bad("dumps_kernel_unknown", _append(DUMPS.format(kernels="softmaks", kinds="visa")),
        "unknown kernel 'softmaks' in dumps", "dumps[0].kernels[0]", "[softmaks]",
        "did you mean 'softmax'?"),
    Bad("kernel_options_for_unknown_stage",
        ("  softmax:\n", "  softmax:\n    options: {visaa: {fusion: false}}\n"),
        "unknown stage 'visaa' in options of 'softmax'", "kernels.softmax.options.visaa",
        "visaa:", "did you mean 'visa'?"),
    Bad("machine_missing_field", _drop("    clock_mhz: 500\n"),
        "missing required key 'clock_mhz' in 'machines.npu-tiny'", "machines.npu-tiny.clock_mhz",
        "npu-tiny:"),
    Bad("target_runner_missing", ("sim: {runner: sim, machine: npu-v1}", "sim: {machine: npu-v1}"),
        "missing required key 'runner' in 'targets.sim'", "targets.sim.runner",
        "sim: {machine: npu-v1}"),
    Bad("unknown_runner", ("runner: sim,", "runner: simm,"),
        "unknown runner 'simm'", "targets.sim.runner", "simm", "did you mean 'sim'?"),
    Bad("unknown_machine_unit", ("units: {dma: 1, tensor: 1, vector: 1}",
                                 "units: {dma: 1, tensor: 1, vectr: 1}"),
        "unknown key 'vectr'", "machines.npu-tiny.units.vectr", "vectr",
        "did you mean 'vector'?"),
    Bad("tile_not_three_sizes", ("tile: [16, 16, 16]", "tile: [16, 16]"),
        "wrong number of items", "machines.npu-tiny.tensor.tile", "tile: [16, 16]"),
]
# fmt: on


@pytest.mark.parametrize("case", BAD_PIPELINES, ids=[c.id for c in BAD_PIPELINES])
def test_malformed_pipeline_is_exit_2_at_its_key(proj, built, case: Bad):
    text = edit(proj, case.change)
    out = assert_clean_failure(run_kiln(proj, "compile"), 2)
    assert case.message in out, out
    head = header(out)
    assert Path(head["file"]).name == "pipeline.yaml", out
    assert int(head["line"]) == (line_of(text, case.line) if case.line else 1), out
    if case.key_path is not None:
        assert f"at key: {case.key_path}\n" in out, out
    if case.hint is not None:
        assert f"hint: {case.hint}" in out, out
    assert "expected: " in out and "found: " in out, out
    assert_nothing_lost(proj, built)


def test_there_are_at_least_20_malformed_pipelines():
    assert len(BAD_PIPELINES) >= 20 and len({c.id for c in BAD_PIPELINES}) == len(BAD_PIPELINES)


def test_missing_package_is_reported_at_packages(proj, built):
    edit(proj, ("packages: [kernels]", "packages: [kernelz]"))
    out = assert_clean_failure(run_kiln(proj, "compile"), 2)
    assert "kernelz" in out and "at key: packages[0]" in out, out


def test_filter_that_matches_nothing_lists_the_kernels(proj, built):
    out = assert_clean_failure(run_kiln(proj, "compile", "softmaks"), 2)
    assert "no kernel matches 'softmaks'" in out
    assert "kernels: gemm, softmax, vector_add" in out and "kiln compile softmax" in out
    assert_nothing_lost(proj, built)


# -- (b) broken kernels ---------------------------------------------------------------------

BROKEN = """\
import sys

import numpy as np

from kiln import Tensor, device


def helper_scale(x):
    return 1.0 / 0  # <- bk_helper


@device
def bk_shape_mismatch(a: Tensor["N"], b: Tensor["M"]):
    return a + b  # <- bk_shape_mismatch


@device
def bk_matmul_inner(a: Tensor["M", "K"], b: Tensor["J", "N"]):
    return a @ b  # <- bk_matmul_inner


@device
def bk_python_if(x: Tensor["N"]):
    if x.sum() > 0:  # <- bk_python_if
        return x
    return -x


@device
def bk_numpy_call(x: Tensor["N"]):
    return np.sin(x)  # <- bk_numpy_call


@device
def bk_unknown_method(x: Tensor["N"]):
    y = x * 2.0
    return y.cumsum()  # <- bk_unknown_method


@device
def bk_user_raise(x: Tensor["N"]):
    raise ValueError("boom from user code")  # <- bk_user_raise


@device
def bk_helper(x: Tensor["N"]):
    return x * helper_scale(x)


@device
def bk_return_type(x: Tensor["N"]):
    y = x + 1.0
    return 3  # <- bk_return_type


@device
def bk_reshape(x: Tensor["R", "C"]):
    return x.reshape(5, -1)  # <- bk_reshape


@device
def bk_axis(x: Tensor["R", "C"]):
    return x.sum(axis=2)  # <- bk_axis


@device
def bk_dtype(x: Tensor["N"]):
    return x.astype("f64")  # <- bk_dtype


@device
def bk_exit(x: Tensor["N"]):
    sys.exit(0)  # <- bk_exit


@device
def bk_keyword_only(x: Tensor["N"], *, y: Tensor["N"]):  # <- bk_keyword_only
    return x + y


@device
def bk_empty_slice(x: Tensor["N"]):
    return x[100:200]  # <- bk_empty_slice


@device
def bk_floor_divide(a: Tensor["N"]):
    return a // 2.0  # <- bk_floor_divide
"""

BROKEN_IMPORT = """\
from kiln import Tensor, device
import kiln_no_such_module  # <- bk_import


@device
def bk_import(x: Tensor["N"]):
    return x + 1.0
"""

SIZES = {"N": 4, "M": 5, "K": 3, "J": 2, "R": 4, "C": 6}
ARGS = {  # kernel -> dims its arguments use
    "bk_shape_mismatch": "NM",
    "bk_matmul_inner": "MKJN",
    "bk_reshape": "RC",
    "bk_axis": "RC",
}
# kernel, file, marker, fragments of the message
# fmt: off
BROKEN_CASES = [
    ("bk_shape_mismatch", "broken.py", "bk_shape_mismatch", ["shape mismatch", "(4,)", "(5,)"]),
    ("bk_matmul_inner", "broken.py", "bk_matmul_inner", ["inner dimensions differ"]),
    ("bk_python_if", "broken.py", "bk_python_if",
     ["data-dependent control flow is not supported", "kiln.where"]),
    ("bk_numpy_call", "broken.py", "bk_numpy_call", ["np.sin is not supported on kiln tensors"]),
    ("bk_unknown_method", "broken.py", "bk_unknown_method", ["no attribute 'cumsum'"]),
    ("bk_user_raise", "broken.py", "bk_user_raise", ["ValueError: boom from user code"]),
    ("bk_helper", "broken.py", "bk_helper", ["ZeroDivisionError"]),
    ("bk_return_type", "broken.py", "bk_return_type", ["not a Tensor"]),
    ("bk_reshape", "broken.py", "bk_reshape", ["cannot reshape", "(4, 6)"]),
    ("bk_axis", "broken.py", "bk_axis", ["axis 2 is out of range"]),
    ("bk_dtype", "broken.py", "bk_dtype", ["unsupported dtype 'f64'"]),
    ("bk_exit", "broken.py", "bk_exit", ["kernel 'bk_exit' called sys.exit(0) while tracing"]),
    ("bk_keyword_only", "broken.py", "bk_keyword_only",
     ["argument 'y' of kernel 'bk_keyword_only' is keyword-only",
      "kernel arguments must be positional"]),
    ("bk_empty_slice", "broken.py", "bk_empty_slice",
     ["slice 100:200 of axis 0 (size 4) is empty"]),
    ("bk_floor_divide", "broken.py", "bk_floor_divide", ["`//` (floor_divide) is not a kiln op"]),
    ("bk_import", "broken_import.py", "bk_import",
     ["importing kernel module 'kernels.broken_import' failed", "kiln_no_such_module"]),
]
# fmt: on


def marked(source: str, tag: str) -> tuple[int, str]:
    for number, text in enumerate(source.splitlines(), 1):
        if text.endswith(f"# <- {tag}"):
            return number, text
    raise AssertionError(f"no marker {tag}")


@pytest.fixture(scope="module")
def broken_proj(base, tmp_path_factory) -> Path:
    """The base project plus two modules of broken kernels, all listed in pipeline.yaml."""
    root = tmp_path_factory.mktemp("broken") / "proj"
    shutil.copytree(base, root, symlinks=True)
    (root / "kernels" / "broken.py").write_text(BROKEN)
    (root / "kernels" / "broken_import.py").write_text(BROKEN_IMPORT)
    rows = []
    for kernel, *_ in BROKEN_CASES:
        dims = ARGS.get(kernel, "N")
        rows.append(f"  {kernel}: {{shapes: {{{', '.join(f'{d}: {SIZES[d]}' for d in dims)}}}}}\n")
    edit(root, ("kernels:\n", "kernels:\n" + "".join(rows)))
    return root


@pytest.fixture(scope="module")
def broken_run(broken_proj) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    """Every broken kernel's trace in one run: doit's ``--continue``, passed through by `kiln`.

    One process instead of one per kernel (numpy is imported once); the
    diagnostics are the same ones `kiln compile KERNEL` prints. Returns the
    process and each failed task's message block.
    """
    tasks = [f"compile:{kernel}.default" for kernel, *_ in BROKEN_CASES]
    proc = run_kiln(broken_proj, "--continue", *tasks)
    blocks = {}
    for chunk in proc.stderr.split("FAILED ")[1:]:
        name, _, body = chunk.partition("\n")
        blocks[name] = body
    return proc, blocks


@pytest.mark.parametrize(
    "kernel, file, tag, fragments", BROKEN_CASES, ids=[c[0] for c in BROKEN_CASES]
)
def test_broken_kernel_names_its_file_line_and_source(
    broken_run, broken_proj, built, kernel, file, tag, fragments
):
    proc, blocks = broken_run
    assert_clean_failure(proc, 1)  # the pipeline is fine: a failed build
    out = blocks.get(f"compile:{kernel}.default")
    assert out is not None, proc.stdout + proc.stderr
    source = BROKEN if file == "broken.py" else BROKEN_IMPORT
    line, text = marked(source, tag)
    head = header(out)
    assert Path(head["file"]).name == file and Path(head["file"]).parent.name == "kernels", out
    assert int(head["line"]) == line, out
    assert f"| {text}" in out, out  # the kernel's own source line, as written
    for fragment in fragments:
        assert fragment in out, out
    assert "kiln/lang" not in out and "tracer.py" not in out, out  # no compiler frames
    assert_nothing_lost(broken_proj, built)


def test_every_broken_kernel_fails_and_is_counted(broken_run):
    proc, blocks = broken_run
    n = len(BROKEN_CASES)
    assert len(blocks) == n
    assert f"kiln: {n} tasks: 0 ran, 0 up to date, {n} failed" in proc.stdout


def test_broken_kernel_through_kiln_compile(broken_proj, built):
    out = assert_clean_failure(run_kiln(broken_proj, "compile", "bk_python_if"), 1)
    line, text = marked(BROKEN, "bk_python_if")
    assert "FAILED compile:bk_python_if.default\n" in out, out
    assert "while running stage 'trace' of bk_python_if.default" in out, out
    assert f"broken.py:{line}:8: error: data-dependent control flow is not supported" in out
    assert f"| {text}\n  |        ^" in out, out
    # one task for the whole chain: the later stages are neither run nor reported
    assert "kiln: 1 tasks: 0 ran, 0 up to date, 1 failed in " in out, out
    assert_nothing_lost(broken_proj, built)


def test_kernel_calling_sys_exit_fails_alone(broken_proj, built):
    """sys.exit() in a kernel body used to end the build silently, with exit 0."""
    proc = run_kiln(broken_proj, "compile", "bk_exit", "softmax")
    out = assert_clean_failure(proc, 1)
    line, text = marked(BROKEN, "bk_exit")
    assert f"broken.py:{line}:5: error: kernel 'bk_exit' called sys.exit(0) while tracing" in out
    assert re.search(r"kiln: 2 tasks: 1 ran, 0 up to date, 1 failed \(", out), out
    assert_nothing_lost(broken_proj, built)


EAGER_EXIT = """\
import sys

from kiln import Tensor, device


@device
def eager_exit(x: Tensor["N"]):
    if not x.is_traced:
        sys.exit("bye")  # <- eager_exit
    return x + 1.0
"""


def test_kernel_calling_sys_exit_in_the_oracle_is_an_error(proj):
    (proj / "kernels" / "eager_exit.py").write_text(EAGER_EXIT)
    edit(proj, ("kernels:\n", "kernels:\n  eager_exit: {shapes: {N: 4}}\n"))
    run_kiln(proj, "compile", "eager_exit", check=True)  # the trace does not exit
    # an ERROR of the target (exit 1): there is nothing to compare it with
    out = assert_clean_failure(run_kiln(proj, "test", "eager_exit", "--target", "sim"), 1)
    line, text = marked(EAGER_EXIT, "eager_exit")
    head = header("\n".join(row.lstrip() for row in out.splitlines()))  # indented in the report
    assert head["file"].endswith("eager_exit.py") and int(head["line"]) == line, out
    assert "kernel 'eager_exit' called sys.exit('bye') while running on the host" in out
    assert f"| {text}" in out, out


# -- files the command line asks for -------------------------------------------------------

# fmt: off
OUTPUT_CASES = [
    (("compile", "vector_add", "--dump-schedule", "adir"), "--dump-schedule: adir is a directory"),
    (("compile", "vector_add", "--dump-summary", "pipeline.yaml"),
     "--dump-summary: pipeline.yaml is a file, not a directory"),
    (("compile", "vector_add", "--dump-visa", "pipeline.yaml/v.visa"),
     "--dump-visa: pipeline.yaml (above pipeline.yaml/v.visa) is a file, not a directory"),
    (("test", "vector_add", "--target", "cpu", "--junit", "/proc/x.xml"),
     "--junit: cannot write /proc/x.xml: No such file or directory"),
    (("view", "-o", "/proc/x.html"), "-o/--output: cannot write /proc/x.html"),
    (("view", "-o", ""), "argument -o/--output: an empty path"),
    (("compile", "vector_add", "--dump-schedule", ""), "argument --dump-schedule: an empty path"),
    (("test", "vector_add", "--junit="), "argument --junit: an empty path"),
]
# fmt: on


@pytest.mark.parametrize("argv, says", OUTPUT_CASES, ids=[" ".join(c[0]) for c in OUTPUT_CASES])
def test_an_unwritable_output_names_the_option_and_the_users_path(proj, built, argv, says):
    """Said before any work, and never as Kiln's temp file (.NAME.PID.HEX.tmp)."""
    (proj / "adir").mkdir()
    proc = run_kiln(proj, *argv)
    out = assert_clean_failure(proc, 2)
    assert says in out, out
    assert ".tmp" not in out and "PASS" not in out and "wrote" not in out, out
    assert (proj / "pipeline.yaml").is_file() and not list((proj / "adir").iterdir())
    assert_nothing_lost(proj, built)


def test_there_are_at_least_10_broken_kernels():
    assert len(BROKEN_CASES) >= 10


SYNTAX = """\
from kiln import Tensor, device


@device
def bk_syntax(x: Tensor["N"]):
    return x +* 2
"""


def _syntax_project(proj: Path) -> Path:
    (proj / "kernels" / "bk_syntax.py").write_text(SYNTAX)
    edit(proj, ("kernels:\n", "kernels:\n  bk_syntax: {shapes: {N: 4}}\n"))
    return proj


def test_syntax_error_in_kernel_module_names_file_and_line(proj, built):
    out = assert_clean_failure(run_kiln(_syntax_project(proj), "compile", "bk_syntax"), 2)
    assert "kernels.bk_syntax cannot be parsed" in out, out
    assert "bk_syntax.py" in out and "line 6" in out, out
    assert_nothing_lost(proj, built)


def test_a_module_that_does_not_parse_stops_only_the_kernels_it_may_hold(proj, built):
    """A scratch file beside the kernels: the build goes on, with one warning naming it."""
    (proj / "kernels" / "scratch.py").write_text("def scratch(:\n    pass\n")
    proc = run_kiln(proj, "compile", "gemm")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.count("scratch.py:1:13: warning: kernel module kernels.scratch") == 1
    assert "no kernel this build needs is in it" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_syntax_error_in_kernel_module_shows_the_source_line(proj):
    root = _syntax_project(proj)
    out = assert_clean_failure(run_kiln(root, "compile", "bk_syntax"), 2)
    head = header(out)
    assert Path(head["file"]).name == "bk_syntax.py" and int(head["line"]) == 6, out
    assert "|     return x +* 2" in out, out
    diag = json.loads(run_kiln(root, "compile", "--message-format", "json").stdout.splitlines()[0])
    assert diag["file"].endswith("bk_syntax.py") and diag["line"] == 6


def test_failing_build_keeps_every_artifact_built_before(proj, built):
    """softmax breaks after a full build: the whole build fails, nothing built is lost."""
    norm = proj / "kernels" / "normalization.py"
    lines = norm.read_text().splitlines()
    at = next(n for n, line in enumerate(lines) if line.startswith("def softmax("))
    lines.insert(at + 1, "    x = x @ x  # <- broken on purpose")  # (8, 64) @ (8, 64)
    norm.write_text("\n".join(lines) + "\n")
    out = assert_clean_failure(run_kiln(proj, "compile"), 1)
    assert "FAILED compile:softmax.small\n" in out, out
    assert "while running stage 'trace' of softmax.small" in out, out
    assert f"normalization.py:{at + 2}:" in out and "inner dimensions differ" in out, out
    assert "|     x = x @ x  # <- broken on purpose" in out, out
    # The build went on past softmax: the other kernels ran again (in this copy of the
    # project the doit state names the original's paths) and came out the same.
    now = snapshot(proj)
    assert set(built) <= set(now), "an artifact was lost"
    binaries = {rel: digest for rel, (digest, _) in built.items() if rel.endswith(".edf")}
    assert {rel: now[rel][0] for rel in binaries} == binaries


# -- (c) stage errors -------------------------------------------------------------------


def test_tile_larger_than_sram_names_kernel_tile_and_bytes(proj, built):
    edit(proj, ("machine: npu-v1\nkernels", "machine: npu-tiny\nkernels"))
    edit(
        proj,
        ("  gemm:\n", "  gemm:\n    options: {visa: {tile_m: 256, tile_n: 256, tile_k: 256}}\n"),
    )
    edit(proj, ("wide: {M: 32, K: 64, N: 64}", "wide: {M: 256, K: 256, N: 256}"))
    out = assert_clean_failure(run_kiln(proj, "compile", "gemm"), 1)
    assert "FAILED compile:gemm.wide\n" in out, out
    assert "while running stage 'lir' of gemm.wide" in out, out
    match = re.search(
        r"kernel gemm: tile %(\w+) needs (\d+) bytes of SRAM, only (\d+) available", out
    )
    assert match, out
    assert int(match[2]) == 256 * 256 * 4 and int(match[3]) == 65536, out
    assert "machine npu-tiny" in out and "hint: reduce the visa stage's tile options" in out
    assert_nothing_lost(proj, built, rebuilt=("gemm",))


def test_tile_larger_than_the_kernels_own_machine(proj, built):
    tiles = "    options: {visa: {tile_m: 256, tile_n: 256, tile_k: 256}}\n"
    edit(proj, ("  gemm:\n", "  gemm:\n    machine: npu-tiny\n" + tiles))
    edit(proj, ("wide: {M: 32, K: 64, N: 64}", "wide: {M: 256, K: 256, N: 256}"))
    out = assert_clean_failure(run_kiln(proj, "compile", "gemm"), 1)
    assert "only 65536 available (machine npu-tiny)" in out, out


def test_unknown_stage_option_lists_the_valid_ones(proj, built):
    text = edit(
        proj,
        (
            "{name: visa, module: kiln.stages.visa}",
            "{name: visa, module: kiln.stages.visa, options: {tile_mm: 32}}",
        ),
    )
    # checked with the pipeline, before any task runs: a configuration error, exit 2
    out = assert_clean_failure(run_kiln(proj, "compile", "vector_add"), 2)
    assert "unknown option 'tile_mm' for stage 'visa'" in out, out
    assert "FAILED" not in out and "tasks:" not in out, out
    assert (
        "expected: one of: fusion, reduce_split, tile_k, tile_m, tile_n, tile_order, vector_tile"
        in out
    ), out
    assert "hint: did you mean 'tile_m'?" in out and "at key: stages[1].options" in out, out
    head = header(out)
    assert Path(head["file"]).name == "pipeline.yaml"
    assert int(head["line"]) == line_of(text, "tile_mm"), out
    assert_nothing_lost(proj, built)  # nothing was built, so nothing changed


def test_machine_with_zero_units_of_a_needed_kind(proj, built):
    kind, kernel, op = "tensor", "gemm", "mma"
    edit(proj, ("units: {dma: 2, tensor: 1, vector: 2}", "units: {dma: 2, tensor: 0, vector: 2}"))
    out = assert_clean_failure(run_kiln(proj, "compile", kernel), 1)
    assert f"kernel {kernel}: machine npu-v1 has no {kind} units" in out, out
    assert f"needs one for {op}" in out and f"give the machine model a {kind} unit" in out, out
    assert_nothing_lost(proj, built, rebuilt=(kernel,))


HAND_GRAPH_STAGE = '''\
"""Test-only stage 0: ignores the kernel and emits a hand-written graph with an op
the visa stage has no lowering for."""

import json
from dataclasses import dataclass
from pathlib import Path

from kiln.ir.graph import Graph

NAME = "trace"
ARTIFACT = "graph.json"
DUMPS = {}
GRAPH = {
    "format": "kiln.graph/1", "name": "vector_add", "bindings": {"N": 256},
    "nodes": [
        {"id": 0, "op": "arg", "inputs": [], "shape": [256], "dtype": "f32",
         "attrs": {"index": 0, "name": "a"}},
        {"id": 1, "op": "cumsum", "inputs": [0], "shape": [256], "dtype": "f32", "attrs": {}},
    ],
    "outputs": [1], "edges": [[0, 1]],
}


@dataclass(frozen=True)
class Options:
    pass


def run(request, options, machine):
    return Graph.from_dict(GRAPH)


def serialize(graph):
    return graph.to_json()


def read(path):
    return Graph.from_json(Path(path).read_bytes())


def verify(graph, machine):
    pass
'''


def test_op_the_visa_stage_cannot_lower(proj, built):
    (proj / "hand_graph.py").write_text(HAND_GRAPH_STAGE)
    edit(proj, ("{name: trace, module: kiln.stages.trace}", "{name: trace, module: hand_graph}"))
    out = assert_clean_failure(run_kiln(proj, "compile", "vector_add"), 1)
    assert "FAILED compile:vector_add.small\n" in out, out
    assert "while running stage 'visa' of vector_add.small" in out, out
    assert "kernel vector_add: the visa stage cannot lower op 'cumsum' (node 1)" in out, out
    assert_nothing_lost(proj, built, rebuilt=("vector_add",))


# -- kiln inspect on damaged EDF files ----------------------------------------------------------


def _truncate(data: bytes) -> bytes:
    return data[: len(data) // 3]


def _flip_body(data: bytes) -> bytes:
    b = bytearray(data)
    b[len(b) // 2] ^= 0x10
    return bytes(b)


def _flip_magic(data: bytes) -> bytes:
    return bytes([data[0] ^ 0x01]) + data[1:]


def _flip_trailer(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 0x80])


@pytest.mark.parametrize(
    "damage, check",
    [
        (_truncate, "size check failed"),
        (_flip_body, "section-checksum check failed"),
        (_flip_magic, "magic check failed"),
        (_flip_trailer, "checksum check failed"),
        (lambda data: b"", "size check failed"),
    ],
    ids=["truncated", "bit-flip-body", "bit-flip-magic", "bit-flip-trailer", "empty"],
)
def test_inspect_damaged_edf_names_the_file_and_the_check(base, tmp_path, damage, check):
    good = (base / BUILD / "gemm" / "small" / "kernel.edf").read_bytes()
    bad = tmp_path / "damaged.edf"
    bad.write_bytes(damage(good))
    out = assert_clean_failure(run_kiln(tmp_path, "inspect", "damaged.edf"), 2)
    assert out.startswith("damaged.edf: error: corrupt EDF file:"), out
    assert check in out, out


def test_inspect_of_a_file_that_is_not_an_edf(base, tmp_path):
    shutil.copy(base / BUILD / "gemm" / "small" / "graph.json", tmp_path / "graph.edf")
    out = assert_clean_failure(run_kiln(tmp_path, "inspect", "graph.edf"), 2)
    assert "graph.edf: error:" in out and "EDF" in out, out
    out = assert_clean_failure(run_kiln(tmp_path, "inspect", "missing.edf"), 2)
    assert "missing.edf: error: cannot read EDF file" in out, out


def test_inspect_of_the_intact_file_still_works(base):
    proc = run_kiln(base, "inspect", f"{BUILD}/gemm/small/kernel.edf", check=True)
    assert "magic        KEDF" in proc.stdout and "OK" in proc.stdout


# -- --message-format json -----------------------------------------------------------------


def _json_lines(proc: subprocess.CompletedProcess) -> list[dict]:
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return [json.loads(line) for line in lines]  # every line of stdout is one JSON object


def test_json_diagnostic_for_a_pipeline_error(proj, built):
    text = edit(proj, ("  softmax:\n", "  softmax:\n    dtyp: f32\n"))
    proc = run_kiln(proj, "compile", "--message-format", "json")
    assert_clean_failure(proc, 2)
    (diag,) = _json_lines(proc)
    assert Path(diag["file"]).name == "pipeline.yaml"
    assert diag["line"] == line_of(text, "dtyp: f32") and diag["column"] == 5
    assert diag["key_path"] == "kernels.softmax.dtyp"
    assert diag["kind"] == "error" and diag["hint"] == "did you mean 'dtype'?"
    assert proc.stderr == ""
    assert_nothing_lost(proj, built)


def test_json_diagnostic_for_a_broken_kernel(broken_proj, built):
    proc = run_kiln(broken_proj, "compile", "bk_shape_mismatch", "--message-format", "json")
    assert_clean_failure(proc, 1)
    diags = _json_lines(proc)
    errors = [d for d in diags if d["kind"] == "error"]
    assert len(errors) == 1 and diags[-1]["kind"] == "summary" and diags[-1]["failed"] == 1
    (err,) = errors
    line, text = marked(BROKEN, "bk_shape_mismatch")
    assert Path(err["file"]).name == "broken.py" and err["line"] == line
    assert err["source"] == text and err["key_path"] is None
    assert err["task"] == "compile:bk_shape_mismatch.default"
    assert "shape mismatch" in err["message"]


def test_json_diagnostic_for_a_stage_error(proj, built):
    text = edit(
        proj,
        (
            "{name: schedule, module: kiln.stages.schedule}",
            "{name: schedule, module: kiln.stages.schedule, options: {policy: random}}",
        ),
    )
    proc = run_kiln(proj, "compile", "vector_add", "--message-format", "json")
    # stage options are checked with the pipeline, before any task runs: exit 2, no task
    assert_clean_failure(proc, 2)
    diags = _json_lines(proc)
    assert [d["kind"] for d in diags] == ["error"]  # no summary: nothing ran
    (err,) = diags
    assert Path(err["file"]).name == "pipeline.yaml" and err["line"] == line_of(text, "random")
    assert err["key_path"] == "stages[3].options" and err["found"] == "random"
    assert err["message"] == "unknown scheduling policy 'random'"
    assert err["expected"] == "one of: critical-path, in-order"
    assert "task" not in err
    assert_nothing_lost(proj, built)
