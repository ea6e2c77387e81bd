"""The `report:html` doit task (tasks/dag/report_task.py): written once, rerun only on new
inputs."""

from __future__ import annotations

import os

from tests.conftest import ran_tasks, run_kiln

REPORT = "build/kiln/kernel/report.html"


def test_report_task_reruns_only_when_an_input_changed(project):
    run_kiln(project, "compile", "vector_add", check=True)
    first = run_kiln(project, "report", check=True)
    assert ran_tasks(first) == ["report:html"]
    page = (project / REPORT).read_text()
    assert "vector_add.small" in page and "1 built" in page

    again = run_kiln(project, "report", check=True)
    assert ran_tasks(again) == [] and "1 up to date" in again.stdout

    # a new test result is an input; a no-op build (only the profile changes) is not
    run_kiln(project, "compile", "vector_add", check=True)
    assert ran_tasks(run_kiln(project, "report", check=True)) == []
    result = project / "build/kiln/kernel/vector_add/small/test-sim.json"
    result.write_text('{"target": "sim", "status": "pass", "outputs": []}')
    os.utime(result, ns=(1, 1))
    profile = (project / ".kiln" / "profile.json").read_bytes()
    assert ran_tasks(run_kiln(project, "report", check=True)) == ["report:html"]
    assert "sim: pass" in (project / REPORT).read_text()
    # running the report task alone keeps the last build's profile
    assert (project / ".kiln" / "profile.json").read_bytes() == profile


def test_report_task_with_a_directory_where_the_report_goes_says_what_kiln_view_says(project):
    (project / REPORT).mkdir(parents=True)
    task = run_kiln(project, "report")
    view = run_kiln(project, "view")
    message = f"{REPORT}: error: cannot use {REPORT}: Is a directory"
    hint = "hint: a directory is in the way where Kiln needs a file: move it away"
    for proc in (task, view):
        text = proc.stdout + proc.stderr
        assert proc.returncode == 2, text
        assert "Traceback" not in text and "PythonAction Error" not in text
        assert message in text and hint in text
    assert "FAILED report:html" in task.stdout + task.stderr
    assert (project / REPORT).is_dir()  # the user's directory is left alone


def test_report_task_reruns_when_a_filtered_view_wrote_its_page(project):
    run_kiln(project, "compile", "vector_add", "softmax", check=True)
    assert ran_tasks(run_kiln(project, "report", check=True)) == ["report:html"]
    whole = (project / REPORT).read_bytes()
    assert b"2 built, 0 failed, 2 not built" in whole
    # `kiln view FILTER` writes its one-instance page where the report goes
    run_kiln(project, "view", "vector_add.small", check=True)
    assert b"1 kernel instances: 1 built" in (project / REPORT).read_bytes()
    assert ran_tasks(run_kiln(project, "report", check=True)) == ["report:html"]
    assert (project / REPORT).read_bytes() == whole
    # the same page written by an unfiltered `kiln view` is the report's own
    run_kiln(project, "view", check=True)
    assert ran_tasks(run_kiln(project, "report", check=True)) == []


def test_report_task_reruns_when_kiln_status_would_rebuild_a_row(project):
    run_kiln(project, "compile", "vector_add", check=True)
    assert ran_tasks(run_kiln(project, "report", check=True)) == ["report:html"]
    assert 'class="status-built">built' in (project / REPORT).read_text()
    source = project / "kernels" / "elementwise.py"
    source.write_text(source.read_text().replace("return a + b", "return a - b", 1))
    # no compile: nothing in the out dir changed, but the row is out of date now
    assert ran_tasks(run_kiln(project, "report", check=True)) == ["report:html"]
    page = (project / REPORT).read_text()
    assert 'class="status-out-of-date">out of date' in page
    assert 'class="status-built">built' not in page
    assert ran_tasks(run_kiln(project, "report", check=True)) == []
