"""What the report reads from a build (kiln/report/data.py)."""

from __future__ import annotations

import os
from pathlib import Path

from kiln.report.data import collect
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
