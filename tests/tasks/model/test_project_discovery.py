"""Finding the project like git does: from any subdirectory, or the file named by -f."""

from __future__ import annotations

import os

import pytest

from tests.conftest import run_kiln


def test_kiln_finds_the_pipeline_from_a_subdirectory(project):
    sub = project / "kernels"
    proc = run_kiln(sub, "compile", "vector_add")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (project / "build" / "kiln" / "kernel" / "vector_add" / "small" / "kernel.edf").is_file()
    assert not (sub / "build").exists() and not (sub / ".kiln").exists()
    status = run_kiln(sub, "status", "vector_add")
    assert "kiln: 0 of 1 tasks would run" in status.stdout, status.stdout + status.stderr


def test_outside_any_project_is_one_clear_message(tmp_path):
    lonely = tmp_path / "empty" / "deeper"
    lonely.mkdir(parents=True)
    proc = run_kiln(lonely, "compile")
    assert proc.returncode == 2
    assert "no pipeline file (pipeline.yaml) in" in proc.stderr
    assert "or any directory above it" in proc.stderr and "kiln init" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_pipeline_env_names_a_project_elsewhere(project, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"KILN_PIPELINE_FILE": os.fspath(project / "pipeline.yaml")}
    proc = run_kiln(elsewhere, "status", "vector_add", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "compile:vector_add.small: would run\n    never built\n" in proc.stdout
    assert "kiln: 1 of 1 tasks would run" in proc.stdout


def test_switching_the_out_dir_and_back_rebuilds_nothing(project):
    from tests.conftest import ran_tasks

    env_other = {"KILN_OUT_DIR": "other-out"}
    built = ["compile:vector_add.small"]  # one task: the instance's whole chain
    assert ran_tasks(run_kiln(project, "compile", "vector_add", check=True)) == built
    assert ran_tasks(run_kiln(project, "compile", "vector_add", env=env_other)) == built
    assert ran_tasks(run_kiln(project, "compile", "vector_add", check=True)) == []
    assert ran_tasks(run_kiln(project, "compile", "vector_add", env=env_other)) == []
    assert (project / "other-out" / "vector_add" / "small" / "kernel.edf").is_file()


def test_a_directory_named_pipeline_yaml_is_named_as_such(tmp_path):
    (tmp_path / "proj" / "pipeline.yaml").mkdir(parents=True)
    proc = run_kiln(tmp_path / "proj", "compile")
    assert proc.returncode == 2
    assert "pipeline.yaml is a directory, not a pipeline file" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "make, found",
    [
        (lambda p: p.symlink_to(p.parent / "nowhere.yaml"), "a symbolic link to nothing"),
        (lambda p: os.mkfifo(p), "a FIFO"),
    ],
)
def test_a_pipeline_yaml_that_is_no_file_is_named_as_such(tmp_path, make, found):
    """Not 'no pipeline file ... in any directory above it': one is there."""
    (tmp_path / "proj").mkdir()
    make(tmp_path / "proj" / "pipeline.yaml")
    proc = run_kiln(tmp_path / "proj", "compile")
    assert proc.returncode == 2, proc.stderr
    assert f"pipeline.yaml is {found}" in proc.stderr and "no pipeline file" not in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("variable", ["KILN_PIPELINE", "KILN_PIPELINE_FILE"])
def test_a_pipeline_env_naming_nothing_names_the_variable(project, tmp_path, variable):
    proc = run_kiln(tmp_path, "status", env={variable: str(tmp_path / "nope.yaml")})
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"error: {variable} names no pipeline file: {tmp_path / 'nope.yaml'}",
        f"  expected: {variable}=PATH/pipeline.yaml, an existing file",
        "  found: nothing there",
        f"  hint: fix or unset {variable} (kiln then looks for pipeline.yaml upwards)",
    ]
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_kiln(tmp_path, "status", env={variable: str(empty)})
    assert proc.returncode == 2 and "  found: a directory" in proc.stderr
    as_dir = run_kiln(tmp_path, "status", env={variable: str(project)})  # as -f DIR
    assert as_dir.returncode == 0, as_dir.stdout + as_dir.stderr


def test_an_out_dir_that_cannot_be_made_is_one_error_at_its_key(project):
    text = (project / "pipeline.yaml").read_text()
    (project / "pipeline.yaml").write_text("out_dir: /proc/kiln-nope/out\n" + text)
    proc = run_kiln(project, "compile")
    assert proc.returncode == 2
    assert "pipeline.yaml:1:10: error: the out dir /proc/kiln-nope/out cannot be created" in (
        proc.stderr
    )
    assert proc.stderr.count("error:") == 1 and not os.path.exists("/proc/kiln-nope")
