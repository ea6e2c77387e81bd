"""The `kiln` command end to end: own commands and doit pass-through."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO, run_kiln


def test_doit_commands_pass_through(project):
    listed = run_kiln(project, "list", "--all", check=True).stdout
    assert "compile:gemm.small" in listed and "compile:softmax.small" in listed
    assert "compile:gemm.small.trace" not in listed  # one task per instance: its whole chain
    run_kiln(project, "compile", "vector_add", check=True)
    info = run_kiln(project, "info", "compile:vector_add.small", check=True).stdout
    assert "vector_add" in info and "file_dep" in info
    run_kiln(project, "clean", "compile:vector_add.small", check=True)
    assert not (project / "build/kiln/kernel/vector_add/small/kernel.edf").exists()
    run_kiln(project, "forget", check=True)


def test_kiln_list_says_what_each_task_group_is_as_doit_list_does(project):
    listed = run_kiln(project, "list", check=True).stdout.splitlines()
    assert [line.split()[0] for line in listed] == ["compile", "report", "test"]
    assert all(line.endswith(" tasks of e2e") and line == line.rstrip() for line in listed), listed


def test_quiet_test_prints_only_failures_and_the_summary(project):
    quiet = run_kiln(project, "-q", "test", "vector_add", "--target", "sim", check=True).stdout
    assert "PASS" not in quiet and "kiln test: 1 pass, 0 fail, 0 error, 0 skipped" in quiet, quiet
    loud = run_kiln(project, "test", "vector_add", "--target", "sim", check=True).stdout
    assert "PASS    vector_add.small @ sim" in loud


def test_config_shows_a_unicode_project_name_as_written(tmp_path):
    from kiln.cli.scaffold import init_project

    init_project(tmp_path, name="プロジェクト")
    shown = run_kiln(tmp_path, "config", check=True).stdout
    assert 'project: "プロジェクト"' in shown or "project: プロジェクト" in shown, shown


def _files(root) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_clean_removes_what_bench_shape_built_with_its_kernel(project):
    """docs/quickstart.md: clean deletes the files Kiln wrote for the kernels selected,
    the instances `kiln bench --shape` built at sizes pipeline.yaml does not declare too."""
    out = project / "build/kiln/kernel"
    bench = ("bench", "gemm", "--shape", "M=8,K=8,N=8", "--target", "sim", "--iter", "1")
    run_kiln(project, *bench, check=True)
    shaped = out / "gemm/shape_K8_M8_N8"
    built = sorted(p.name for p in shaped.iterdir())
    assert {"kernel.edf", "bench-sim.json", ".kiln-manifest.json"} <= set(built)
    (shaped / "notes.txt").write_text("mine\n")
    for others in ("softmax", "gemm.small"):  # not the whole kernel: left alone
        run_kiln(project, "clean", others, check=True)
        assert sorted(p.name for p in shaped.iterdir()) == sorted([*built, "notes.txt"])
    dry = run_kiln(project, "clean", "-n", "gemm", check=True)
    assert "kiln: would remove build/kiln/kernel/gemm/shape_K8_M8_N8/kernel.edf" in dry.stdout
    proc = run_kiln(project, "clean", "gemm", check=True)
    assert "kiln: removed build/kiln/kernel/gemm/shape_K8_M8_N8/bench-sim.json" in proc.stdout
    assert sorted(p.name for p in shaped.iterdir()) == ["notes.txt"]  # the user's stays


def test_clean_without_a_filter_removes_a_renamed_kernels_build(project):
    """Its out dir belongs to no declared kernel: a FILTER cannot name it, a whole clean does."""
    out = project / "build/kiln/kernel"
    run_kiln(project, "compile", "vector_add", check=True)
    pipe = project / "pipeline.yaml"
    pipe.write_text(pipe.read_text().replace("  vector_add:\n", "  vadd:\n", 1))
    kernels = project / "kernels/elementwise.py"
    kernels.write_text(kernels.read_text().replace("def vector_add(", "def vadd("))
    (out / "vector_add/notes.txt").write_text("mine\n")
    run_kiln(project, "compile", "vadd", check=True)
    run_kiln(project, "clean", "vadd", check=True)
    assert (out / "vector_add/small/kernel.edf").is_file()  # not the selected kernel's
    proc = run_kiln(project, "clean", check=True)
    assert "kiln: removed build/kiln/kernel/vector_add/small/kernel.edf" in proc.stdout
    assert sorted(p.name for p in (out / "vector_add").rglob("*")) == ["notes.txt"]


def test_clean_filter_cleans_the_selected_instances_and_their_results_only(project):
    out = project / "build/kiln/kernel"
    run_kiln(project, "test", "vector_add", "gemm", check=True)
    bench = ("bench", "gemm.small", "--target", "sim", "--iter", "1", "--warmup", "0")
    run_kiln(project, *bench, check=True)
    run_kiln(project, "view", check=True)
    mine = {  # the user's, beside Kiln's: never removed
        "gemm/small/notes.txt": "notes\n",
        "gemm/small/bench-mine.json": '{"target": "yours"}\n',
        "gemm/small/test-x.json": "not json\n",
    }
    for rel, text in mine.items():
        (out / rel).write_text(text)
    kilns = {"gemm/small/test-sim.json", "gemm/small/bench-sim.json", "report.html"}
    assert kilns | {"test-report.json"} <= set(_files(out))
    wide_before = [f for f in _files(out) if f.startswith(("gemm/wide/", "vector_add/"))]

    proc = run_kiln(project, "clean", "gemm.small", check=True)
    assert "executing" not in proc.stdout  # doit's line per task: Kiln says what it removes
    assert "kiln: removed build/kiln/kernel/gemm/small/test-sim.json" in proc.stdout
    assert "kiln: removed build/kiln/kernel/gemm/small/bench-sim.json" in proc.stdout
    left = _files(out)
    assert [f for f in left if f.startswith("gemm/small/")] == sorted(mine)
    assert [f for f in left if f.startswith(("gemm/wide/", "vector_add/"))] == wide_before
    assert "report.html" in left and "test-report.json" in left  # the whole project's

    dry = run_kiln(project, "clean", "-n", "vector*", check=True)
    assert "kiln: would remove build/kiln/kernel/vector_add/small/test-sim.json" in dry.stdout
    assert _files(out) == left
    # the artifacts too: the dry run names every file the clean removes
    would = {  # each file's line (the last line counts them)
        line.split()[-1]
        for line in dry.stdout.splitlines()
        if line.startswith("kiln: would remove")
    }
    assert "build/kiln/kernel/vector_add/small/kernel.edf" in would
    gone = run_kiln(project, "clean", "vector*", check=True).stdout
    assert would == {line.split()[-1] for line in gone.splitlines() if "kiln: removed" in line}

    run_kiln(project, "clean", check=True)
    assert _files(out) == sorted(mine)
    assert sorted(p.name for p in out.iterdir()) == ["gemm"]  # emptied directories went too


def test_clean_of_a_filter_matching_nothing_is_the_filter_error(project):
    proc = run_kiln(project, "clean", "nosuch")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "nosuch" in proc.stderr and "ERROR: 'nosuch' is not a task" not in proc.stderr


def test_info_of_an_unknown_task_is_one_line_not_a_traceback(project):
    for name, says in [
        ("compile:nosuch", "`kiln list --all` lists the tasks"),
        ("compile:vector_ad.small", "Did you mean 'compile:vector_add.small'?"),
    ]:
        proc = run_kiln(project, "info", name)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr
        assert f"ERROR: '{name}' is not a task. {says}" in proc.stderr


def test_dumpdb_prints_the_state_kiln_keeps_in_sqlite(project):
    run_kiln(project, "compile", "vector_add", check=True)
    proc = run_kiln(project, "dumpdb", check=True)
    assert "Traceback" not in proc.stderr and "DBM type" not in proc.stdout
    lines = [line for line in proc.stdout.splitlines() if " -> {" in line]
    assert [line.split(" -> ")[0] for line in lines] == ["compile:vector_add.small"]
    assert "kernels/elementwise.py" in proc.stdout  # a file_dep of the task, with its stamp
    assert "'ran': ['trace', 'visa', 'lir', 'schedule', 'edf']" in proc.stdout  # its values


OVERFLOWING_CASTS = """\
import kiln
from kiln import Tensor, device


@device
def cast_oob(x: Tensor["N"]):
    return (x * 1e10).astype("int32"), (x * 1e5).astype("float16"), kiln.log(x).astype("int32")


@device
def f16_overflow(x: Tensor["N"]):
    return x * 70000.0, kiln.exp(x * 20.0)
"""


def test_overflowing_casts_pass_without_numpy_warnings(project):
    """Casts that overflow are legal (f16 to inf, float to i32 wraps): no RuntimeWarning
    from Kiln's own files in the user's output."""
    (project / "kernels" / "casts.py").write_text(OVERFLOWING_CASTS)
    text = (project / "pipeline.yaml").read_text()
    rows = "  cast_oob: {shapes: {N: 64}}\n  f16_overflow: {dtype: f16, shapes: {N: 64}}\n"
    (project / "pipeline.yaml").write_text(text.replace("kernels:\n", "kernels:\n" + rows, 1))
    env = {"PYTHONWARNINGS": "always"}
    built = run_kiln(project, "compile", "cast_oob", "f16_overflow", env=env, check=True)
    tested = run_kiln(project, "test", "cast_oob", "f16_overflow", "--target", "sim", env=env)
    out = built.stdout + built.stderr + tested.stdout + tested.stderr
    assert tested.returncode == 0, out
    assert "PASS    cast_oob.default @ sim" in tested.stdout
    assert "Warning" not in out, out


def test_parallel_compile(project):
    proc = run_kiln(project, "-n", "2", "compile", check=True)
    assert "failed" not in proc.stderr.lower()
    assert (project / "build/kiln/kernel/gemm/wide/kernel.edf").is_file()


def test_run_kernel_on_cpu_prints_shapes_and_statistics(project):
    out_dir = project / "outs"
    proc = run_kiln(
        project,
        "run",
        "gemm",
        "--target",
        "cpu",
        "--shapes",
        "wide",
        "--save-outputs",
        str(out_dir),
        check=True,
    )
    assert "gemm.wide on cpu" in proc.stdout
    assert "in  a: f32[32, 64]" in proc.stdout and "out 0: f32[32, 64]" in proc.stdout
    assert "mean" in proc.stdout and "std" in proc.stdout
    saved = np.load(out_dir / "out0.npy")
    assert saved.shape == (32, 64) and saved.dtype == np.float32


def test_run_is_deterministic_across_runs(project):
    a = run_kiln(project, "run", "softmax", "--target", "cpu", check=True).stdout
    b = run_kiln(project, "run", "softmax", "--target", "cpu", check=True).stdout

    def values(text):
        return [line for line in text.splitlines() if line.startswith(("  in ", "  out "))]

    assert values(a) and values(a) == values(b)


def test_run_unknown_kernel_and_target(project):
    proc = run_kiln(project, "run", "nosuch", "--target", "cpu")
    assert proc.returncode == 2 and "no kernel matches 'nosuch'" in proc.stderr
    proc = run_kiln(project, "run", "gemm", "--target", "tpu")
    assert proc.returncode == 2 and "unknown target 'tpu'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_message_format_json_for_pipeline_errors(project):
    pipe = project / "pipeline.yaml"
    pipe.write_text(pipe.read_text().replace("packages: [kernels]", "pakages: [kernels]"))
    proc = run_kiln(project, "compile", "--message-format", "json")
    assert proc.returncode == 2
    diag = json.loads(proc.stdout.strip().splitlines()[0])
    assert diag["key_path"] == "pakages" and diag["line"] == 2
    assert "packages" in (diag["hint"] or "")


def test_out_dir_from_environment(project):
    run_kiln(
        project,
        "compile",
        "vector_add",
        env={"KILN_OUT_DIR": str(project / "elsewhere")},
        check=True,
    )
    assert (project / "elsewhere/vector_add/small/kernel.edf").is_file()


def test_log_info_to_a_file(project):
    log = project / "kiln.log"
    run_kiln(
        project,
        "compile",
        "vector_add",
        env={"KILN_LOG_INFO": "1", "KILN_LOG_FILE": str(log)},
        check=True,
    )
    text = log.read_text()
    assert "kiln.tasks INFO: loaded" in text
    assert "vector_add.small: wrote graph.json" in text


def test_an_unwritable_log_file_is_one_error_for_kiln_and_doit(project):
    env = {"KILN_LOG_INFO": "1", "KILN_LOG_FILE": str(project / "no-dir" / "kiln.log")}
    (project / "dodo.py").write_text((REPO / "dodo.py").read_text())
    doit = subprocess.run(
        [sys.executable, "-m", "doit", "list"],
        cwd=project,
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
    )
    for proc in (run_kiln(project, "status", env=env), doit):
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert "error: KILN_LOG_FILE cannot be opened for the logs" in proc.stderr
        assert "no-dir/kiln.log: No such file or directory" in proc.stderr


def test_an_empty_log_file_means_stderr(project):
    proc = run_kiln(project, "list", env={"KILN_LOG_INFO": "1", "KILN_LOG_FILE": ""})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "kiln.tasks INFO: loaded" in proc.stderr


def test_dump_mlir_writes_the_iree_input(project):
    target = project / "k.mlir"
    proc = run_kiln(project, "compile", "softmax", "--dump-mlir", str(target), check=True)
    text = target.read_text()
    assert "func.func @softmax" in text and "tensor<8x64xf32>" in text
    assert "wrote mlir dump of softmax.small" in proc.stdout


# -- the front door: help, version, usage errors, completion, global flags ------------

HELP_WAYS = [[], ["--help"], ["-h"], ["help"]]


def _main(capsys, *argv: str) -> tuple[int, str, str]:
    from kiln.cli import main

    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def clean_env(monkeypatch):
    """main() hands -f/-v/-q on through os.environ: undo that after the test."""
    for name in ("KILN_PIPELINE_FILE", "KILN_VERBOSITY", "KILN_MESSAGE_FORMAT"):
        monkeypatch.delenv(name, raising=False)
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.parametrize("argv", HELP_WAYS, ids=lambda a: " ".join(a) or "(none)")
def test_every_way_of_asking_for_help_lists_kilns_commands(capsys, argv):
    from kiln.cli.help import SUMMARIES

    rc, out, _ = _main(capsys, *argv)
    assert rc == 0
    for name, summary in SUMMARIES.items():
        assert f"  {name}" in out and summary in out, name
    assert "list, info, forget" in out  # doit's commands pass through
    assert "examples:" in out and "kiln init" in out
    assert "exit status:" in out and "2    usage or input error" in out
    assert "tabcompletion" not in out  # not doit's own command list


def test_command_help_is_the_same_by_flag_and_by_help(capsys):
    rc, by_flag, _ = _main(capsys, "compile", "--help")
    assert rc == 0
    rc, by_help, _ = _main(capsys, "help", "compile")
    assert rc == 0 and by_help == by_flag
    assert "usage: kiln compile" in by_flag and "--dump-schedule FILE" in by_flag
    assert "examples:" in by_flag and "exit status: 0 ok, 1 failure, 2 usage" in by_flag


def test_help_for_a_doit_command_is_doits(capsys):
    rc, out, _ = _main(capsys, "help", "list")
    assert rc == 0 and "list tasks" in out


def test_every_option_of_every_command_has_help():
    from kiln.cli.help import SUMMARIES
    from kiln.cli.parser import build_parser, subcommands

    missing = []

    def walk(parser, name):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            if not action.help:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
        for child, sub, summary in subcommands(parser):
            if not summary or not sub.description:
                missing.append(f"{name} {child} (no summary)")
            walk(sub, f"{name} {child}")

    parser = build_parser()
    walk(parser, "kiln")
    assert missing == []
    assert {n for n, _, _ in subcommands(parser)} == set(SUMMARIES)


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_names_kiln_doit_python_and_iree(capsys, flag):
    from importlib import metadata

    rc, out, _ = _main(capsys, flag)
    lines = out.splitlines()
    assert rc == 0
    assert lines[0] == f"kiln {metadata.version('kiln-kernels')}" == "kiln 0.1.0"
    assert lines[1] == f"doit {metadata.version('doit')}"
    assert lines[2] == f"Python {platform.python_version()}"
    assert lines[3].startswith("IREE ")  # a version, or "IREE not installed"


def test_version_and_command_help_import_neither_numpy_nor_ml_dtypes():
    code = (
        "import contextlib, io, sys\n"
        "from kiln.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    rc = main(sys.argv[1:])\n"
        "print(rc, 'numpy' in sys.modules or 'ml_dtypes' in sys.modules)\n"
    )
    for args in (["--version"], ["help", "watch"], ["init", "--help"], ["completion", "zsh"]):
        out = subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, check=True
        )
        assert out.stdout.split() == ["0", "False"], (args, out.stderr)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["compile", "--bogus"], "kiln compile: error: unrecognized arguments: --bogus"),
        (["bench", "gemm"], "kiln bench: error: the following arguments are required: --target"),
        (["cache"], "kiln cache: error: the following arguments are required: stats|gc|ver"),
        (["compil"], "did you mean `kiln compile`?"),
        (["help", "nosuch"], "unknown command 'nosuch'"),
        (["-f"], "-f needs a value"),
    ],
)
def test_usage_errors_exit_2_with_one_message(tmp_path, argv, says):
    proc = run_kiln(tmp_path, *argv)
    assert proc.returncode == 2
    assert says in proc.stderr and "Traceback" not in proc.stderr


def test_unknown_word_is_kilns_unknown_command_in_a_project_and_outside(project, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    for where in (project, outside):
        for word, hint in (
            (
                "nosuchthing",
                "hint: `kiln help` lists the commands; a FILTER follows one, "
                "as in `kiln compile nosuchthing`",
            ),
            ("vector_add.small", "as in `kiln compile vector_add.small`"),
            ("lst", "hint: did you mean `kiln list`?"),
        ):
            proc = run_kiln(where, word)
            assert proc.returncode == 2, (where, word, proc.stderr)
            assert proc.stderr.startswith(f"error: unknown command '{word}'\n"), proc.stderr
            assert hint in proc.stderr
            assert "Invalid parameter" not in proc.stderr and "pipeline file" not in proc.stderr


def test_task_names_and_targets_still_reach_doit(project):
    edf = project / "build/kiln/kernel/vector_add/small/kernel.edf"
    run_kiln(project, "compile:vector_add.small", check=True)
    assert edf.is_file()
    edf.unlink()
    proc = run_kiln(project, str(edf), check=True)  # a target: the task that makes it runs
    assert ". compile:vector_add.small\n" in proc.stdout and edf.is_file()
    run_kiln(project, "report", check=True)
    assert (project / "build/kiln/kernel/report.html").is_file()


def test_file_flag_before_or_after_the_command_finds_the_project(project, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    for argv in (
        ["-f", str(project / "pipeline.yaml"), "status"],
        ["--file", str(project), "status"],
        ["status", "-f", str(project / "pipeline.yaml")],
    ):
        proc = run_kiln(elsewhere, *argv)
        assert proc.returncode == 0, (argv, proc.stderr)
        assert "tasks would run" in proc.stdout
    proc = run_kiln(elsewhere, "-f", str(elsewhere / "nope.yaml"), "status")
    assert proc.returncode == 2 and "no pipeline file at" in proc.stderr


def test_global_flags_set_the_environment_kiln_reads(clean_env, tmp_path):
    from kiln.cli.command import apply_global_flags, split_global_flags

    (tmp_path / "pipeline.yaml").write_text("project: x\n")
    flags, rest = split_global_flags(["-q", "--file", str(tmp_path), "-n", "2", "compile"])
    assert rest == ["-n", "2", "compile"]  # doit's own options still reach doit
    apply_global_flags(flags)
    assert os.environ["KILN_VERBOSITY"] == "0"
    assert os.environ["KILN_PIPELINE_FILE"] == str(tmp_path / "pipeline.yaml")
    apply_global_flags(split_global_flags(["--verbose", "status"])[0])
    assert os.environ["KILN_VERBOSITY"] == "2"


@pytest.mark.parametrize(
    "argv, found",
    [
        (["-v", "-q", "compile"], "found: -v -q"),
        (["compile", "--quiet", "--verbose"], "found: --quiet --verbose"),
        (["-q", "status", "-v"], "found: -q -v"),
    ],
)
def test_verbose_and_quiet_together_is_one_usage_error(capsys, clean_env, argv, found):
    rc, out, err = _main(capsys, *argv)
    assert rc == 2 and out == ""
    assert "contradict each other" in err and found in err
    assert "expected: at most one of -v/--verbose and -q/--quiet" in err


@pytest.mark.parametrize(
    "argv, hint",
    [
        (["-x", "compile"], "write `kiln compile -x`"),
        (["--target", "sim", "test", "gemm"], "write `kiln test --target sim gemm`"),
        (["-n", "2", "--no-wait", "compile"], "write `kiln compile -n 2 --no-wait`"),
        (["-n2", "--bogus"], "`kiln help` lists the commands"),
    ],
)
def test_a_kiln_option_before_the_command_says_where_it_goes(
    capsys, clean_env, tmp_path, monkeypatch, argv, hint
):
    monkeypatch.chdir(tmp_path)  # said before any project is looked for
    rc, out, err = _main(capsys, *argv)
    assert rc == 2 and out == ""
    assert "CmdOption" not in err and hint in err


@pytest.mark.parametrize("command", ["test", "run", "tune"])
def test_a_negative_seed_is_a_usage_error(capsys, clean_env, tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)  # refused before any project is looked for
    rc, out, err = _main(capsys, command, "x", "--seed", "-1")
    assert rc == 2 and "Traceback" not in err  # numpy raised ValueError mid-run
    assert "argument --seed: expected a whole number, 0 or more, found '-1'" in err


@pytest.mark.parametrize("value", ["abc", "7", "-1", "1.5"])
def test_a_bad_kiln_verbosity_names_the_variable_and_the_levels(
    capsys, clean_env, tmp_path, monkeypatch, value
):
    monkeypatch.chdir(tmp_path)  # checked before the project is even looked for
    monkeypatch.setenv("KILN_VERBOSITY", value)
    rc, out, err = _main(capsys, "compile")
    assert rc == 2 and out == ""
    assert err.splitlines()[:3] == [
        "error: KILN_VERBOSITY is not a verbosity level",
        "  expected: 0 (as -q: failures and the summary), 1 (the default) or 2 (as -v)",
        f"  found: {value}",
    ]


def test_a_flag_overrides_a_bad_kiln_verbosity_and_doit_checks_it_too(project):
    proc = run_kiln(project, "-q", "compile", "vector_add", env={"KILN_VERBOSITY": "abc"})
    assert proc.returncode == 0, proc.stderr
    dodo = "from kiln.tasks.dag.loader import dodo_namespace\nglobals().update(dodo_namespace())\n"
    (project / "dodo.py").write_text(dodo)
    proc = subprocess.run(
        [sys.executable, "-m", "doit", "list"],
        cwd=project,
        env=dict(os.environ, KILN_VERBOSITY="9"),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "error: KILN_VERBOSITY is not a verbosity level" in proc.stderr


def test_quiet_drops_the_per_task_lines(project):
    proc = run_kiln(project, "-q", "compile", "vector_add", check=True)
    assert not [line for line in proc.stdout.splitlines() if line.startswith(". ")]
    assert "tasks:" in proc.stdout


def _completion(shell: str) -> str:
    from kiln.cli.completion import script

    return script(shell)


def test_bash_completion_is_valid_and_knows_every_command(tmp_path):
    from kiln.cli.help import SUMMARIES

    text = _completion("bash")
    path = tmp_path / "kiln.bash"
    path.write_text(text)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    for name in SUMMARIES:
        assert f'"{name}")' in text or f" {name} " in text, name
    probe = (
        f"source {path}\n"
        't() { COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]}-1)); COMPREPLY=(); _kiln;'
        ' echo "${COMPREPLY[*]}"; }\n'
        "t kiln co\nt kiln -q compile --message-format ''\nt kiln cache ''\n"
        "t kiln cache gc --m\nt kiln test --target sim --ju\nt kiln completion ''\n"
        "t kiln li\nt kiln fo\n"  # doit's commands that `kiln --help` names
    )
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "compile config completion",
        "human json",
        "stats gc verify push",
        "--max-size",
        "--junit",
        "bash zsh fish",
        "list",
        "forget",
    ]


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_completion_parse(tmp_path, shell):
    text = _completion(shell)
    assert "watch" in text and "debounce" in text and "dump-schedule" in text
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    path = tmp_path / f"kiln.{shell}"
    path.write_text(text)
    proc = subprocess.run([shell, "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_completion_command_prints_the_script(capsys):
    rc, out, _ = _main(capsys, "completion", "bash")
    assert rc == 0 and out == _completion("bash") and "complete -o default -F _kiln kiln" in out


def test_config_command_prints_json(project):
    pytest.importorskip("kiln.cli.config_command")
    proc = run_kiln(project, "config", "--json", check=True)
    assert isinstance(json.loads(proc.stdout), dict)


def test_dump_and_profile_go_through_a_symlink_and_into_a_fifo(project, tmp_path):
    """`--dump-visa link.json` replaces the file the link names, never the link, and
    `--profile` into a FIFO (as /dev/stdout is) writes into it."""
    import threading

    real = tmp_path / "real.visa"
    link = tmp_path / "link.visa"
    link.symlink_to(real)
    fifo = tmp_path / "profile.pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    proc = run_kiln(
        project, "compile", "gemm", "--dump-visa", str(link), "--profile", str(fifo), check=True
    )
    reader.join(30)
    assert "wrote visa dump" in proc.stdout
    assert link.is_symlink() and real.read_text().startswith("visa ")
    assert json.loads(got[0])["traceEvents"]


def test_a_dump_path_inside_an_instance_out_dir_is_refused_before_building(project):
    """Written over kernel.edf, the next command took the artifact for damaged and deleted it."""
    run_kiln(project, "compile", "vector_add", check=True)
    edf = project / "build/kiln/kernel/vector_add/small/kernel.edf"
    before = edf.read_bytes()
    proc = run_kiln(project, "compile", "vector_add", "--dump-visa", str(edf))
    assert proc.returncode == 2
    assert (
        "error: --dump-visa: build/kiln/kernel/vector_add/small/kernel.edf is inside the out "
        "dir of vector_add.small, where Kiln keeps its artifacts" in proc.stderr
    )
    assert edf.read_bytes() == before and "Traceback" not in proc.stderr
    elsewhere = project / "build/visa.txt"  # in the out dir's parent: fine
    run_kiln(project, "compile", "vector_add", "--dump-visa", str(elsewhere), check=True)
    assert elsewhere.stat().st_size > 0


def test_message_format_json_keeps_stdout_json_with_a_dump_flag(project):
    target = project / "v.txt"
    proc = run_kiln(
        project, "compile", "vector_add", "--dump-visa", str(target), "--message-format", "json"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    objects = [json.loads(line) for line in proc.stdout.splitlines()]  # each line is JSON
    assert objects[-1]["kind"] == "summary"
    assert f"kiln: wrote visa dump of vector_add.small to {target}" in proc.stderr


def test_ctrl_c_before_the_build_still_ends_json_output_with_an_interrupted_summary(
    monkeypatch, capsys
):
    """docs/ci.md: a summary object closes the JSON lines, `interrupted: true` after Ctrl-C."""
    from kiln.cli import command

    def interrupted_while_loading(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "_main", interrupted_while_loading)
    monkeypatch.delenv("KILN_MESSAGE_FORMAT", raising=False)
    assert command.main(["compile", "--message-format", "json"]) == 130
    out = capsys.readouterr()
    (summary,) = [json.loads(line) for line in out.out.splitlines()]
    assert summary["kind"] == "summary" and summary["interrupted"] is True
    assert summary["ran"] == 0 and "kiln: interrupted" in out.err


def test_an_input_error_keeps_exit_2_when_stderr_is_a_closed_pipe(project):
    """`kiln status nosuch 2>&1 | true`: the message has no reader; the status still says 2."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        env = dict(os.environ, KILN_CACHE_DIR=str(project / ".cache"))
        proc = subprocess.run(
            [sys.executable, "-m", "kiln", "status", "nosuchkernel"],
            cwd=project,
            env=env,
            stdout=write_end,
            stderr=write_end,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 2


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_a_doit_command_help_flag_shows_its_help_with_kilns_settings(project, flag):
    proc = run_kiln(project, "list", flag)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Error parsing Command" not in proc.stdout + proc.stderr
    assert "list tasks from dodo file" in proc.stdout
    assert "the database is .kiln/doit.sqlite3 (sqlite3)" in proc.stdout
