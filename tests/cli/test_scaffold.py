"""`kiln init`: a new project that builds, tests and lints at once, and never overwrites."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kiln.cli.scaffold import init_project, project_files

BIN = Path(sys.executable).parent


def command(tool: str) -> list[str]:
    """The venv's console script when it has one (as a user types it), else `python -m`."""
    script = BIN / tool
    return [str(script)] if script.is_file() else [sys.executable, "-m", tool]


def run(cwd: Path, *argv: str, tool: str = "kiln") -> subprocess.CompletedProcess:
    env = dict(os.environ, KILN_CACHE_DIR=str(cwd / ".cache"))
    for name in ("KILN_OUT_DIR", "KILN_PIPELINE_FILE", "KILN_VERBOSITY"):
        env.pop(name, None)
    return subprocess.run(
        [*command(tool), *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"{proc.args} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_new_project_compiles_builds_with_doit_and_passes_its_tests(tmp_path):
    out = ok(run(tmp_path, "init", "p")).stdout
    assert "created project 'p'" in out and "kiln compile" in out
    project = tmp_path / "p"
    assert "0 failed" in ok(run(project, "compile")).stdout
    ok(run(project, "compile", tool="doit"))  # plain doit, through the project's dodo.py
    tested = ok(run(project, "test")).stdout
    assert "PASS    scale_add.small @ sim" in tested and "0 fail, 0 error" in tested
    pytest_run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert pytest_run.returncode == 0 and "1 passed" in pytest_run.stdout, pytest_run.stdout


def test_plain_doit_info_and_dumpdb_answer_without_a_traceback(tmp_path):
    ok(run(tmp_path, "init", "p"))
    project = tmp_path / "p"
    ok(run(project, "compile"))
    info = run(project, "info", "compile:nosuch", tool="doit")
    assert info.returncode == 3 and "Traceback" not in info.stderr, info.stderr
    assert "ERROR: 'compile:nosuch' is not a task. `doit list --all` lists" in info.stderr
    dumped = ok(run(project, "dumpdb", tool="doit"))  # the project's pyproject.toml plugin
    assert "compile:scale_add.small -> {" in dumped.stdout, dumped.stdout + dumped.stderr


def test_new_project_in_the_working_directory_is_lint_clean(tmp_path):
    ok(run(tmp_path, "init"))
    assert set(project_files("x")) <= {
        p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()
    }
    lint = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "."],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert lint.returncode == 0, lint.stdout


def test_init_refuses_to_overwrite_and_writes_nothing(tmp_path):
    (tmp_path / "pipeline.yaml").write_text("mine\n")
    (tmp_path / "README.md").write_text("mine too\n")
    proc = run(tmp_path, "init", ".")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "README.md, pipeline.yaml" in proc.stderr and "nothing was written" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "pipeline.yaml"]
    assert (tmp_path / "pipeline.yaml").read_text() == "mine\n"


def test_init_into_a_file_is_an_error(tmp_path):
    (tmp_path / "afile").write_text("")
    proc = run(tmp_path, "init", "afile")
    assert proc.returncode == 2 and "it is a file" in proc.stderr


def test_init_creates_missing_directories_and_takes_a_name(tmp_path):
    written = init_project(tmp_path / "a" / "b", name="demo")
    pipeline = yaml.safe_load((tmp_path / "a/b/pipeline.yaml").read_text())
    assert pipeline["project"] == "demo" and "kernels/example.py" in written
    assert set(pipeline["targets"]) == {"cpu", "sim"}  # no extra needed to test


def test_pipeline_names_its_schema_by_a_path_that_holds_in_every_clone(tmp_path):
    from kiln.pipeline.schema import SCHEMA_PATH

    init_project(tmp_path / "p")
    (tmp_path / "p").rename(tmp_path / "clone")  # another checkout, elsewhere
    first = (tmp_path / "clone/pipeline.yaml").read_text().splitlines()[0]
    match = re.fullmatch(r"# yaml-language-server: \$schema=(.+)", first)
    assert match and not Path(match.group(1)).is_absolute(), first
    schema = tmp_path / "clone" / match.group(1)  # the language server resolves it so
    assert schema.read_text() == SCHEMA_PATH.read_text()


def test_config_schema_refreshes_the_projects_copy_and_config_says_when_it_is_stale(
    tmp_path, capsys, monkeypatch
):
    from kiln.cli import main

    init_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / ".cache"))
    (tmp_path / "pipeline.schema.json").write_text("{}")  # an older Kiln's
    assert main(["config"]) == 0
    assert "# schema:    pipeline.schema.json is not this Kiln's" in capsys.readouterr().out
    assert main(["config", "--schema"]) == 0
    assert "kiln: wrote pipeline.schema.json" in capsys.readouterr().out
    assert main(["config", "--schema"]) == 0
    assert "is up to date" in capsys.readouterr().out
    assert main(["config"]) == 0
    assert "pipeline.schema.json, as this Kiln checks" in capsys.readouterr().out


def test_init_says_how_to_get_pytest_when_it_is_missing(tmp_path, capsys, monkeypatch):
    from kiln.cli import main, scaffold

    monkeypatch.setattr(scaffold, "have_pytest", lambda: False)  # Kiln's base install
    assert main(["init", str(tmp_path / "p")]) == 0
    steps = capsys.readouterr().out.split("next:\n")[1].splitlines()
    commands = [line.split("  ")[1] for line in steps]
    assert commands.index("pip install pytest") < commands.index("python -m pytest"), steps
    monkeypatch.setattr(scaffold, "have_pytest", lambda: True)
    assert main(["init", str(tmp_path / "q")]) == 0
    assert "pip install pytest" not in capsys.readouterr().out.split("next:")[1]
    assert "`pip install pytest` first" in (tmp_path / "q/README.md").read_text()


def test_gitignore_keeps_outputs_and_state_out_of_git(tmp_path):
    init_project(tmp_path)
    ignored = (tmp_path / ".gitignore").read_text().split()
    assert {"build/", ".kiln/", ".venv/", "__pycache__/"} <= set(ignored)


@pytest.mark.parametrize("existing", ["kernels/example.py", ".gitignore"])
def test_any_one_existing_file_stops_init(tmp_path, existing):
    from kiln.errors import KilnError

    (tmp_path / existing).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / existing).write_text("x")
    with pytest.raises(KilnError, match="would overwrite 1 existing file"):
        init_project(tmp_path)
    assert not (tmp_path / "pipeline.yaml").exists()


def test_the_next_steps_quote_a_directory_name_a_shell_would_split(tmp_path):
    proc = ok(run(tmp_path, "init", "my proj-1"))
    assert "  cd 'my proj-1'\n" in proc.stdout
    step = next(line for line in proc.stdout.splitlines() if line.strip().startswith("cd "))
    shell = subprocess.run(["bash", "-c", step.strip() + " && pwd"], cwd=tmp_path, text=True,
                           capture_output=True)  # fmt: skip
    assert shell.returncode == 0 and shell.stdout.strip().endswith("my proj-1")


def test_a_unicode_project_name_is_written_as_typed_and_reads_back(tmp_path):
    init_project(tmp_path / "プロジェクト")
    text = (tmp_path / "プロジェクト/pipeline.yaml").read_text(encoding="utf-8")
    assert 'project: "プロジェクト"\n' in text  # not "\u30d7\u30ed..."
    assert yaml.safe_load(text)["project"] == "プロジェクト"


@pytest.mark.parametrize("name", ['a"b\\c', "tab\there", "line\u2028sep", "tag\U000e0001"])
def test_a_project_name_a_reader_cannot_see_stays_escaped_and_reads_back(tmp_path, name):
    init_project(tmp_path, name=name)
    text = (tmp_path / "pipeline.yaml").read_text(encoding="utf-8")
    line = next(line for line in text.splitlines() if line.startswith("project: "))
    assert line.isprintable() and yaml.safe_load(text)["project"] == name


def test_the_next_steps_cd_into_a_directory_whose_name_starts_with_a_dash(tmp_path):
    proc = ok(run(tmp_path, "init", "--", "-proj"))
    step = next(line for line in proc.stdout.splitlines() if line.strip().startswith("cd "))
    shell = subprocess.run(["bash", "-c", step.strip() + " && pwd"], cwd=tmp_path, text=True,
                           capture_output=True)  # fmt: skip
    assert shell.returncode == 0 and shell.stdout.strip().endswith("/-proj"), shell.stderr


def test_a_write_that_fails_midway_leaves_nothing_behind_so_a_retry_works(tmp_path, monkeypatch):
    import builtins

    real_open = builtins.open

    def failing_open(path, mode="r", *args, **kwargs):
        if str(path).endswith("example.py") and "x" in mode:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, mode, *args, **kwargs)

    (tmp_path / "mine.txt").write_text("mine\n")
    monkeypatch.setattr(builtins, "open", failing_open)
    with pytest.raises(PermissionError):
        init_project(tmp_path / "p")
    with pytest.raises(PermissionError):
        init_project(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]
    monkeypatch.setattr(builtins, "open", real_open)
    assert "kernels/example.py" in init_project(tmp_path)  # the retry is not refused


def test_init_help_and_the_quickstart_name_every_file_init_writes():
    from kiln.cli.parser import build_parser, subcommands

    init = next(p for name, p, _ in subcommands(build_parser()) if name == "init")
    quickstart = (Path(__file__).resolve().parents[2] / "docs/quickstart.md").read_text()
    said = next(line for line in quickstart.splitlines() if line.startswith("kiln init myproj"))
    for rel in project_files("x"):
        top = rel.split("/")[0]
        assert top + ("/" if "/" in rel else "") in said, (rel, said)
        word = {"kernels": "kernels package", "tests": "pytest test", "README.md": "README"}
        assert word.get(top, top) in init.description, (rel, init.description)


def test_a_new_package_directory_without_init_py_is_named_as_such(tmp_path):
    ok(run(tmp_path, "init", "p"))
    project = tmp_path / "p"
    (project / "ops").mkdir()
    (project / "ops/act.py").write_text("from kiln import device\n")
    pipeline = project / "pipeline.yaml"
    pipeline.write_text(pipeline.read_text().replace("  - kernels\n", "  - kernels\n  - ops\n"))
    proc = run(project, "status")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "kernel package 'ops' is a directory without __init__.py" in proc.stderr, proc.stderr
    assert "hint: add an empty ops/__init__.py" in proc.stderr
    (project / "ops/__init__.py").write_text("")
    ok(run(project, "status"))
