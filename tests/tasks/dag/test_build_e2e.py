"""End to end: `kiln compile` in a temporary project, and what it rebuilds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ran_tasks, run_kiln
from tests.support.chains import stages_ran

STAGES = ["trace", "visa", "lir", "schedule", "edf"]
INSTANCES = ["vector_add.small", "softmax.small", "gemm.small", "gemm.wide"]


def out(project: Path, inst: str) -> Path:
    kernel, shapes = inst.split(".")
    return project / "build" / "kiln" / "kernel" / kernel / shapes


def bump(path: Path) -> None:
    """Make sure a rewrite gets a new mtime even on coarse-timestamp file systems."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))


def test_first_build_makes_every_artifact_then_noop(project):
    first = run_kiln(project, "compile", check=True)
    assert sorted(ran_tasks(first)) == sorted(f"compile:{i}" for i in INSTANCES)
    assert stages_ran(project) == {f"compile:{i}": STAGES for i in INSTANCES}
    for inst in INSTANCES:
        for name in ("graph.json", "kernel.visa", "kernel.lir", "kernel.sched", "kernel.edf"):
            assert (out(project, inst) / name).stat().st_size > 0
    second = run_kiln(project, "compile", check=True)
    assert ran_tasks(second) == []
    assert "0 ran, 4 up to date" in second.stdout


def test_kernel_edit_reruns_only_that_kernel(project):
    run_kiln(project, "compile", check=True)
    src = project / "kernels" / "normalization.py"
    src.write_text(src.read_text().replace("def softmax(", "def softmax(  ", 1))
    text = src.read_text()
    assert "exp()" in text or "exp(" in text
    # a real change: a different numerics of softmax (scale before exp)
    src.write_text(
        text.replace(
            "return e / e.sum(axis=-1, keepdims=True)",
            "return (e / e.sum(axis=-1, keepdims=True)) * 1.0 + 0.0",
        )
    )
    bump(src)
    status = run_kiln(project, "status", check=True)
    assert "compile:softmax.small: would run" in status.stdout
    assert "file changed:" in status.stdout and "normalization.py" in status.stdout
    assert "starts at stage trace" in status.stdout
    assert "compile:gemm.small: would run" not in status.stdout
    assert "kiln: 1 of 4 tasks would run" in status.stdout
    rebuilt = run_kiln(project, "compile", check=True)
    assert ran_tasks(rebuilt) == ["compile:softmax.small"]


def test_comment_edit_stops_after_trace(project):
    run_kiln(project, "compile", check=True)
    names = ("graph.json", "kernel.visa", "kernel.lir", "kernel.sched", "kernel.edf")
    files = [out(project, i) / n for i in ("gemm.small", "gemm.wide") for n in names]
    before = {f: (f.read_bytes(), f.stat().st_mtime_ns) for f in files}
    src = project / "kernels" / "linalg.py"
    src.write_text("# a comment that changes nothing\n" + src.read_text())
    bump(src)
    rebuilt = run_kiln(project, "compile", check=True)
    assert sorted(ran_tasks(rebuilt)) == ["compile:gemm.small", "compile:gemm.wide"]
    # the same graph: each chain stopped after the trace, and rewrote no artifact
    assert stages_ran(project) == {"compile:gemm.small": ["trace"], "compile:gemm.wide": ["trace"]}
    assert {f: (f.read_bytes(), f.stat().st_mtime_ns) for f in files} == before


def test_shape_change_reruns_only_that_kernel(project):
    run_kiln(project, "compile", check=True)
    pipe = project / "pipeline.yaml"
    pipe.write_text(pipe.read_text().replace("small: {N: 256}", "small: {N: 512}"))
    status = run_kiln(project, "status", check=True)
    assert "compile:vector_add.small: would run" in status.stdout
    assert "kernel function, shapes or dtypes changed" in status.stdout
    assert "starts at stage trace" in status.stdout
    assert "kiln: 1 of 4 tasks would run" in status.stdout
    rebuilt = run_kiln(project, "compile", check=True)
    assert {t.split(":")[1].split(".")[0] for t in ran_tasks(rebuilt)} == {"vector_add"}


def test_status_explains_missing_artifacts_and_option_changes(project):
    status = run_kiln(project, "status", check=True)
    assert "never built" in status.stdout or "missing artifact" in status.stdout
    run_kiln(project, "compile", check=True)
    assert "0 of 4 tasks would run" in run_kiln(project, "status", check=True).stdout
    pipe = project / "pipeline.yaml"
    pipe.write_text(
        pipe.read_text().replace(
            "module: kiln.stages.schedule}", "module: stages.schedule, options: {policy: in-order}}"
        )
    )
    status = run_kiln(project, "status", check=True).stdout
    assert "compile:gemm.small: would run" in status
    assert "stage options changed" in status
    assert "starts at stage schedule (may stop early)" in status
    (out(project, "gemm.small") / "kernel.visa").unlink()
    status = run_kiln(project, "status", "gemm", check=True).stdout
    assert "missing artifact" in status and "kernel.visa" in status


def test_status_names_a_changed_cache_check_and_forgets_nothing(project):
    """It said "never built" for what was just built, and deleted doit's records of it."""
    run_kiln(project, "compile", "vector_add", check=True)
    pipe = project / "pipeline.yaml"
    text = pipe.read_text()
    pipe.write_text(text.replace("project: e2e\n", "project: e2e\ncache: {check: md5}\n"))
    for _ in range(2):  # and again: the first status changed nothing
        status = run_kiln(project, "status", "vector_add", check=True).stdout
        assert "cache check method changed (timestamp -> md5)" in status
        assert "never built" not in status
    pipe.write_text(text)  # back before any build: still built
    assert "0 of 1 tasks would run" in run_kiln(project, "status", "vector_add").stdout


def test_dump_dfg_for_one_kernel(project):
    target = project / "s.json"
    proc = run_kiln(project, "compile", "softmax", "--dump-dfg", str(target), check=True)
    assert '"format": "kiln.graph/1"' in target.read_text()
    assert "wrote dfg dump" in proc.stdout


def test_dump_with_several_kernels_is_a_clear_error(project):
    proc = run_kiln(project, "compile", "--dump-dfg", "x.json")
    assert proc.returncode == 2
    assert "needs exactly one kernel" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (project / "x.json").exists()


def test_every_dump_flag_writes_its_file(project):
    files = {
        "dfg": "d.json",
        "visa": "k.visa",
        "ir": "k.lir",
        "graph": "g.json",
        "schedule": "s.json",
        "summary": "summary",
    }
    args = []
    for kind, name in files.items():
        args += [f"--dump-{kind}", str(project / name)]
    run_kiln(project, "compile", "gemm", "--shapes", "small", *args, check=True)
    for kind, name in files.items():
        assert (project / name).exists(), kind
    assert (project / "summary" / "summary.json").is_file()
    assert "traceEvents" in (project / "s.json").read_text()


def test_unknown_filter_is_a_clear_error(project):
    proc = run_kiln(project, "compile", "nosuchkernel")
    assert proc.returncode == 2
    assert "no kernel matches 'nosuchkernel'" in proc.stderr
    assert "kernels: gemm, softmax, vector_add" in proc.stderr


def test_two_concurrent_builds_both_succeed(project):
    env = dict(os.environ, KILN_CACHE_DIR=str(project / ".cache"))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "kiln", "compile"],
            cwd=project,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    assert any("waiting for" in err for _, err in results) or all(
        "0 failed" in o for o, _ in results
    )
    after = run_kiln(project, "compile", check=True)
    assert ran_tasks(after) == []


def test_edf_bytes_identical_across_clean_builds_and_hash_seeds(project, tmp_path_factory):
    run_kiln(project, "compile", env={"PYTHONHASHSEED": "1"}, check=True)
    first = {i: (out(project, i) / "kernel.edf").read_bytes() for i in INSTANCES}
    run_kiln(project, "clean", check=True)
    time.sleep(0.01)
    run_kiln(project, "compile", env={"PYTHONHASHSEED": "2"}, check=True)
    second = {i: (out(project, i) / "kernel.edf").read_bytes() for i in INSTANCES}
    assert first == second


def test_dumps_section_writes_every_kind_and_reruns_only_the_owning_stages(project):
    run_kiln(project, "compile", check=True)
    pipe = project / "pipeline.yaml"
    pipe.write_text(
        pipe.read_text().replace(
            "targets:",
            "dumps:\n  - kernels: [softmax]\n"
            "    kinds: [dfg, visa, ir, graph, schedule, summary]\ntargets:",
        )
    )
    status = run_kiln(project, "status", check=True).stdout
    assert "requested dumps changed" in status
    rebuilt = ran_tasks(run_kiln(project, "compile", check=True))
    assert rebuilt == ["compile:softmax.small"]
    assert stages_ran(project) == {"compile:softmax.small": STAGES}  # every stage owns a dump
    dumps = out(project, "softmax.small") / "dumps"
    for name in ("dfg.json", "kernel.visa", "lir.msgpack", "lir_graph.json", "schedule.json"):
        assert (dumps / name).stat().st_size > 0, name
    assert (dumps / "summary" / "summary.txt").is_file()
    assert not (out(project, "gemm.small") / "dumps").exists()
    (dumps / "schedule.json").unlink()
    status = run_kiln(project, "status", "softmax", check=True).stdout
    assert "missing artifact" in status and "schedule.json" in status
    others = [p for p in out(project, "softmax.small").rglob("*") if p.is_file()]
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in others if p.name[0] != "."}
    # no artifact cache (a hit would write the dump back without running anything)
    rebuilt = run_kiln(project, "compile", env={"KILN_CACHE": "0"}, check=True)
    assert ran_tasks(rebuilt) == ["compile:softmax.small"]
    # only the dump's owner ran again: its artifact is unchanged, so the edf stage was kept
    assert stages_ran(project) == {"compile:softmax.small": ["schedule"]}
    assert (dumps / "schedule.json").stat().st_size > 0
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in before} == before


def test_a_dump_no_longer_asked_for_is_removed_with_its_manifest_entry(project):
    """Left in place it described an older kernel beside fresh dumps, and clean kept it."""
    pipe = project / "pipeline.yaml"
    text = pipe.read_text()
    pipe.write_text(
        text.replace(
            "targets:", "dumps:\n  - kernels: [softmax]\n    kinds: [dfg, summary]\ntargets:"
        )
    )
    run_kiln(project, "compile", check=True)
    dumps = out(project, "softmax.small") / "dumps"
    assert (dumps / "dfg.json").is_file()
    pipe.write_text(
        text.replace("targets:", "dumps:\n  - kernels: [softmax]\n    kinds: [summary]\ntargets:")
    )
    assert ran_tasks(run_kiln(project, "compile", check=True)) == ["compile:softmax.small"]
    assert sorted(p.name for p in dumps.iterdir()) == ["summary"]
    manifest = json.loads((out(project, "softmax.small") / ".kiln-manifest.json").read_text())
    assert not [rel for rel in manifest["files"] if rel.startswith("dumps/dfg")]
    pipe.write_text(text)  # no dumps at all: the directory goes too
    run_kiln(project, "compile", check=True)
    assert not dumps.exists()
    run_kiln(project, "clean", check=True)
    assert not (project / "build/kiln/kernel/softmax").exists()


def test_status_of_a_damaged_artifact_says_to_rebuild_it_and_builds_nothing(project):
    run_kiln(project, "compile", "vector_add", check=True)
    sched = project / "build/kiln/kernel/vector_add/small/kernel.sched"
    sched.write_bytes(sched.read_bytes()[:100])
    status = run_kiln(project, "status", "vector_add", check=True)
    assert "removed it: run `kiln compile` to rebuild it" in status.stderr
    assert "rebuilding" not in status.stderr
    assert "compile:vector_add.small: would run" in status.stdout
    assert "starts at stage schedule (may stop early)" in status.stdout
