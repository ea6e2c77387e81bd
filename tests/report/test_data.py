"""What the report reads from a build (kiln/report/data.py)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from kiln.report.data import collect
from kiln.report.html import index_table
from kiln.tasks.model.project import Project


def test_rows_carry_the_summary_results_and_status(built: Path):
    project = Project(built / "pipeline.yaml")
    entries = {e["row"]["name"]: e for e in collect(project, project.instances)}
    gemm = entries["gemm.small"]
    summary = gemm["detail"]["summary"]
    assert gemm["row"]["status"] == "built"
    assert gemm["row"]["makespan"] == summary["makespan_cycles"] > 0
    assert gemm["row"]["instructions"] == summary["instructions"]["total"]
    assert gemm["row"]["sram_peak"] == summary["sram"]["peak_bytes"]
    softmax = entries["softmax.small"]["row"]
    assert softmax["tests"]["sim"]["status"] == "pass"
    assert softmax["tests"]["sim"]["max_abs"] < 1e-5
    assert softmax["bench"]["sim"]["cycles"] > 0
    broken = entries["broken.small"]
    assert broken["row"]["status"] == "failed" and "makespan" not in broken["row"]
    assert broken["detail"]["diagnostic"]["file"].endswith("broken.py")


def test_a_missing_artifact_reads_as_not_built(built: Path):
    project = Project(built / "pipeline.yaml")
    inst = next(i for i in project.instances if i.name == "vector_add.small")
    edf = inst.out_dir / "kernel.edf"
    saved, stat = edf.read_bytes(), edf.stat()
    edf.unlink()
    try:
        (entry,) = collect(project, [inst])
        assert entry["row"]["status"] == "not built"
    finally:
        edf.write_bytes(saved)
        os.utime(edf, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_results_of_an_older_binary_are_marked_stale(built: Path):
    project = Project(built / "pipeline.yaml")
    inst = next(i for i in project.instances if i.name == "softmax.small")
    edf = inst.out_dir / "kernel.edf"
    for kind in ("test", "bench"):  # each records the binary it ran on
        recorded = json.loads((inst.out_dir / f"{kind}-sim.json").read_text())
        assert recorded["binary"] == hashlib.sha256(edf.read_bytes()).hexdigest()
    (entry,) = collect(project, [inst])
    assert entry["row"]["tests"]["sim"]["stale"] is False
    assert entry["row"]["bench"]["sim"]["stale"] is False
    assert "(older build)" not in index_table([entry["row"]], ["a"])
    saved, stat = edf.read_bytes(), edf.stat()
    edf.write_bytes(saved + b"\0")  # rebuilt since: another binary
    try:
        (entry,) = collect(project, [inst])
    finally:
        edf.write_bytes(saved)
        os.utime(edf, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    tests, bench = entry["row"]["tests"]["sim"], entry["row"]["bench"]["sim"]
    assert (tests["status"], tests["stale"]) == ("pass", True)
    assert bench["stale"] is True and bench["cycles"] > 0
    cells = index_table([entry["row"]], ["a"])
    assert '<span class="pass stale">sim: pass' in cells
    assert f"sim: {bench['cycles']} cycles (older build)" in cells
