"""The `report:html` doit task (tasks/viewing.py): written once, rerun only on new inputs."""

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
