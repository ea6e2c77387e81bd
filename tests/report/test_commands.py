"""`kiln view`, `kiln view --compare`, `kiln graph`, `kiln compile --profile`, end to end."""

from __future__ import annotations

import base64
import json
import re
import shutil
import zlib
from pathlib import Path

from tests.conftest import ran_tasks, run_kiln


def _details(page: str) -> dict[str, dict]:
    """instance name -> its embedded detail, decoded as the page does."""
    out = {}
    for blob in re.findall(r'class="kiln-detail" data-section="[^"]+">([^<]+)<', page):
        detail = json.loads(zlib.decompress(base64.b64decode(blob)))
        out[detail["name"]] = detail
    return out


def test_report_is_self_contained_and_shows_every_instance(report: Path):
    page = report.read_text()
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in page and "<link" not in page and " src=" not in page
    details = _details(page)
    assert set(details) == {
        "broken.small",
        "vector_add.small",
        "softmax.small",
        "gemm.small",
        "gemm.wide",
    }
    assert "4 built, 1 failed, 0 not built" in page
    broken = details["broken.small"]
    assert broken["failed_task"] == "compile:broken.small"
    assert "matmul" in broken["diagnostic"]["message"] and broken["diagnostic"]["line"] == 6


def test_instance_detail_maps_instructions_to_source_lines(report: Path):
    d = _details(report.read_text())["softmax.small"]
    s = d["schedule"]
    n = d["summary"]["instructions"]["total"]
    assert len(s["start"]) == len(s["node"]) == n
    assert s["makespan"] == d["summary"]["makespan_cycles"]
    src = d["source"]
    assert src["lines"][1].startswith("def softmax(")
    exp_line = src["first_line"] + next(i for i, t in enumerate(src["lines"]) if ".exp()" in t)
    exp_nodes = {int(k) for k, v in src["node_lines"].items() if v == exp_line}
    exp_instrs = [i for i, node in enumerate(s["node"]) if node in exp_nodes]
    assert exp_instrs and all(s["text"][i].startswith("exp ") for i in exp_instrs)
    visa = d["visa"]
    assert visa["lines"][visa["first_instr_line"] + exp_instrs[0]] == s["text"][exp_instrs[0]]
    assert any(f.endswith("softmax/small/graph.srcmap.json") for f in d["dumps"])


def test_index_shows_recorded_test_and_bench_results(report: Path):
    page = report.read_text()
    row = re.search(r'<tr><td class="name"><a href="#[^"]+">softmax.small</a>.*?</tr>', page).group(
        0
    )
    assert "sim: pass" in row and "cycles" in row


def test_comment_edit_rewrites_the_source_map_but_not_the_graph(built: Path):
    out = built / "build" / "kiln" / "kernel" / "softmax" / "small"
    graph_before = (out / "graph.json").read_bytes()
    srcmap_before = json.loads((out / "graph.srcmap.json").read_text())
    source = built / "kernels" / "normalization.py"
    text = source.read_text()
    source.write_text(
        text.replace("@device\ndef softmax", "@device\n# a new comment\n\ndef softmax", 1)
    )
    try:
        run_kiln(built, "compile", "softmax", check=True)
        assert (out / "graph.json").read_bytes() == graph_before
        srcmap = json.loads((out / "graph.srcmap.json").read_text())
        assert srcmap["first_line"] == srcmap_before["first_line"]
        shift = {k: v + 2 for k, v in srcmap_before["nodes"].items()}
        assert srcmap["nodes"] == shift
    finally:
        source.write_text(text)
        run_kiln(built, "compile", "softmax", check=True)


def test_compare_reports_changes_additions_and_removals(built: Path, tmp_path: Path):
    out_dir = built / "build" / "kiln" / "kernel"
    other = tmp_path / "before"
    shutil.copytree(out_dir, other)
    shutil.rmtree(other / "gemm" / "wide")
    shutil.copytree(other / "gemm" / "small", other / "gemm" / "gone")
    (other / "softmax" / "small" / "kernel.sched").write_bytes(
        (out_dir / "gemm" / "small" / "kernel.sched").read_bytes()
    )
    (other / "softmax" / "small" / "kernel.edf").write_bytes(b"old bytes")
    proc = run_kiln(
        built, "view", "--compare", str(other), "-o", str(tmp_path / "c.html"), check=True
    )
    assert "added: gemm.wide" in proc.stdout and "removed: gemm.gone" in proc.stdout
    line = next(x for x in proc.stdout.splitlines() if x.startswith("softmax.small"))
    assert line.split()[-1] == "changed" and "%" in line
    assert "gemm.small" in proc.stdout and "1 with changed bytes" in proc.stdout
    assert 'id="compare-table"' in (tmp_path / "c.html").read_text()
    # with filters, only the selection (and what the other build has under them) is compared
    only = run_kiln(built, "view", "gemm", "--compare", str(other), "-o", str(tmp_path / "d.html"))
    assert "softmax" not in only.stdout and "removed: gemm.gone" in only.stdout


def test_compare_counts_a_leftover_of_an_undeclared_shape_set_as_removed(
    built: Path, tmp_path: Path
):
    out_dir = built / "build" / "kiln" / "kernel"
    leftover = out_dir / "gemm" / "huge"  # a shape set since removed from pipeline.yaml
    shutil.copytree(out_dir / "gemm" / "small", leftover)
    try:
        other = tmp_path / "before"
        shutil.copytree(out_dir, other)
        proc = run_kiln(
            built, "view", "--compare", str(other), "-o", str(tmp_path / "c.html"), check=True
        )
    finally:
        shutil.rmtree(leftover)
    compared = [x.split()[0] for x in proc.stdout.splitlines()[1:] if "%" in x]
    assert compared == ["gemm.small", "gemm.wide", "softmax.small", "vector_add.small"]
    assert "removed: gemm.huge" in proc.stdout
    assert "kiln: 4 kernels compared, 0 with changed bytes, 0 added, 1 removed" in proc.stdout


def test_compare_with_a_missing_dir_is_a_clear_error(built: Path, tmp_path: Path):
    proc = run_kiln(built, "view", "--compare", str(tmp_path / "nope"))
    assert proc.returncode == 2 and "is not a directory" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_compare_with_a_checkout_root_names_its_out_dir(built: Path):
    # it held no <kernel>/<shapes>/kernel.sched: the report said every instance was "added"
    proc = run_kiln(built, "view", "--compare", str(built))
    assert proc.returncode == 2 and "holds no build" in proc.stderr, proc.stdout
    assert f"did you mean --compare {built / 'build' / 'kiln' / 'kernel'}?" in proc.stderr


def test_graph_formats_and_why(built: Path):
    proc = run_kiln(built, "graph", "gemm.small", "--format", "json", "--why", check=True)
    doc = json.loads(proc.stdout)
    names = {n["name"] for n in doc["nodes"]}
    assert "compile:gemm.small" in names and "test:gemm.small@sim" in names
    assert not any(n.startswith("compile:gemm.small.") for n in names)  # one task per instance
    assert ["compile:gemm.small", "test:gemm.small@sim"] in doc["edges"]
    compile_ = next(n for n in doc["nodes"] if n["name"] == "compile:gemm.small")
    assert compile_["would_run"] is False and compile_["reasons"] == []
    dot = run_kiln(built, "graph", "gemm.small", check=True).stdout
    assert dot.startswith("digraph kiln {")
    assert '"compile:gemm.small" -> "test:gemm.small@sim";' in dot
    mermaid = run_kiln(built, "graph", "broken", "--format", "mermaid", "--why", check=True).stdout
    assert mermaid.startswith("graph LR") and "class t0" in mermaid  # broken's trace reruns
    assert "failed at the last build: kernels/broken.py:6:" in mermaid  # why it reruns


def test_graph_with_no_match_is_a_usage_error(built: Path):
    proc = run_kiln(built, "graph", "no_such_kernel")
    assert proc.returncode == 2 and "no kernel matches" in proc.stderr


def test_compile_profile_is_a_chrome_trace(built: Path):
    trace = json.loads((built / "profile.json").read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["name"] for e in events} >= {"compile:softmax.small", "compile:gemm.wide"}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in events)


def test_view_of_a_damaged_artifact_says_it_removed_it_and_builds_nothing(project: Path):
    run_kiln(project, "compile", "vector_add", check=True)
    sched = project / "build/kiln/kernel/vector_add/small/kernel.sched"
    sched.write_bytes(sched.read_bytes()[:100])
    view = run_kiln(project, "view", "vector_add", check=True)
    assert (
        "kiln: warning: build/kiln/kernel/vector_add/small/kernel.sched changed since Kiln "
        "wrote it (damaged or edited); removed it: run `kiln compile` to rebuild it"
    ) in view.stderr
    assert "rebuilding" not in view.stderr and not sched.exists()  # nothing was built
    compile_ = run_kiln(project, "compile", "vector_add", check=True)
    assert ran_tasks(compile_) == ["compile:vector_add.small"] and sched.is_file()


def test_view_dash_o_dash_writes_the_page_to_stdout(project: Path):
    run_kiln(project, "compile", "vector_add", check=True)
    piped = run_kiln(project, "view", "vector_add", "-o", "-", check=True)
    assert not (project / "-").exists()
    assert "kiln: wrote the report to stdout (1 kernel instances)" in piped.stderr
    run_kiln(project, "view", "vector_add", check=True)
    assert piped.stdout == (project / "build/kiln/kernel/report.html").read_text()
    both = run_kiln(project, "view", "-o", "-", "--open")
    assert both.returncode == 2 and "-o - writes the report to stdout" in both.stderr
