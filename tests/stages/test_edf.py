"""The EDF stage: pure metadata, artifact round trip, verify, and the summary dump."""

from __future__ import annotations

import hashlib
import json
import os
import socket
from pathlib import Path

import pytest
import yaml

from kiln.errors import ArtifactError, VerifyError
from kiln.ir.edf import EdfFile
from kiln.ir.lir import Access, ArgSlot, Dep, Instr, Program, ScheduledProgram, Slot
from kiln.ir.schedule_check import random_program
from kiln.stages import edf, schedule
from kiln.summary import format_summary, summarize

REPO = Path(__file__).resolve().parents[2]


def machine(name: str = "npu-v1") -> dict:
    machines = yaml.safe_load((REPO / "pipeline.yaml").read_text())["machines"]
    return {**machines[name], "name": name}


def ins(i, unit, latency, deps=(), nbytes=64):
    kind = unit.rstrip("0123456789")
    op = {"dma": "load", "tensor": "matmul", "vector": "add"}[kind]
    return Instr(
        i,
        unit,
        op,
        (Access("dram", 0, nbytes),),
        (Access("sram", 64 * i, nbytes),),
        nbytes,
        latency,
        tuple(Dep(s, "raw") for s in deps),
        (),
        f"{op} #{i}",
    )


def tiny() -> Program:
    """Two loads -> matmul -> add -> store, plus an independent 40-cycle matmul."""
    instrs = [
        ins(0, "dma0", 10, nbytes=640),
        ins(1, "dma1", 10, nbytes=640),
        ins(2, "tensor0", 20, deps=[0, 1], nbytes=4096),
        ins(3, "vector0", 5, deps=[2], nbytes=256),
        ins(4, "dma0", 10, deps=[3], nbytes=320),
        ins(5, "tensor0", 40, nbytes=8192),
    ]
    return Program(
        "tiny",
        "npu-v1",
        (("dma", 2), ("tensor", 1), ("vector", 1)),
        (
            ArgSlot("a", "input", (8, 20), "f32", 0, 640),
            ArgSlot("y", "output", (8, 10), "f32", 640, 320),
        ),
        tuple(instrs),
        65536,
        16384,
        960,
    )


def compiled(p: Program | None = None, policy: str = "critical-path"):
    m = machine()
    sp = schedule.run(p or random_program(4, n=80), schedule.Options(policy), m)
    return sp, edf.run(sp, edf.Options(), m)


# ----------------------------------------------------------------------- run / metadata


def test_metadata_names_kernel_machine_policy_compiler_and_program_hash():
    sp, e = compiled()
    meta = e.meta
    assert meta["kernel"] == "random" and meta["policy"] == "critical-path"
    assert meta["machine"]["name"] == "npu-v1"
    model = {k: v for k, v in machine().items() if k != "name"}
    assert meta["machine"]["model"] == model
    assert meta["compiler"] == {"name": "kiln", "version": "0.1.0"}
    assert meta["hashes"]["program_sha256"] == hashlib.sha256(sp.program.to_msgpack()).hexdigest()
    assert meta["instructions"] == 80 and meta["makespan_cycles"] == sp.makespan
    assert e.scheduled == sp


def test_run_is_pure_no_time_path_or_host():
    _, a = compiled()
    _, b = compiled()
    assert a == b and edf.serialize(a) == edf.serialize(b)
    text = a.metadata
    for leak in (os.getcwd(), str(REPO), socket.gethostname(), "time", "date"):
        assert leak not in text


def test_run_does_not_mutate_the_machine_dict():
    m = machine()
    before = json.dumps(m, sort_keys=True)
    edf.run(schedule.run(tiny(), schedule.Options(), m), edf.Options(), m)
    assert json.dumps(m, sort_keys=True) == before


def test_tasks_layer_can_add_hashes():
    _, e = compiled()
    more = e.with_metadata({"hashes": {"source_sha256": "ab" * 32}})
    assert set(more.meta["hashes"]) == {"program_sha256", "source_sha256"}
    edf.verify(more, machine())


def test_build_metadata_merges_extra():
    sp, _ = compiled()
    meta = edf.build_metadata(sp, machine(), {"hashes": {"graph_sha256": "g"}})
    assert set(meta["hashes"]) == {"program_sha256", "graph_sha256"}


# ----------------------------------------------------------------------- artifact


def test_artifact_round_trip(tmp_path):
    _, e = compiled()
    path = tmp_path / edf.ARTIFACT
    path.write_bytes(edf.serialize(e))
    assert edf.read(path) == e
    assert edf.ARTIFACT == "kernel.edf" and edf.NAME == "edf"


def test_corrupt_artifact_names_the_file_and_the_check(tmp_path):
    _, e = compiled()
    raw = bytearray(edf.serialize(e))
    raw[len(raw) // 2] ^= 0x10
    path = tmp_path / "kernel.edf"
    path.write_bytes(bytes(raw))
    with pytest.raises(ArtifactError) as err:
        edf.read(path)
    text = err.value.render()
    assert str(path) in text and "section-checksum check failed" in text


def test_missing_artifact_is_an_artifact_error(tmp_path):
    with pytest.raises(ArtifactError, match="cannot read"):
        edf.read(tmp_path / "none.edf")


# ----------------------------------------------------------------------- verify


def test_verify_accepts_compiled_output():
    for policy in schedule.POLICIES:
        _, e = compiled(policy=policy)
        edf.verify(e, machine())


def test_verify_rejects_a_bad_schedule_naming_the_stage():
    sp, _ = compiled(tiny())
    slots = list(sp.slots)
    slots[3] = Slot(3, "vector0", 0, 5)  # before its matmul ends
    bad = ScheduledProgram(sp.program, tuple(slots), sp.policy)
    e = EdfFile(bad, json.dumps(edf.build_metadata(bad, machine())))
    with pytest.raises(VerifyError) as err:
        edf.verify(e, machine())
    assert "'edf'" in err.value.message and "instruction 3" in err.value.message
    assert "dep-order" in err.value.message


def test_verify_rejects_metadata_of_another_program():
    sp, e = compiled()
    stale = e.with_metadata({"hashes": {"program_sha256": "0" * 64}})
    with pytest.raises(VerifyError, match="metadata-program-hash"):
        edf.verify(stale, machine())


# ----------------------------------------------------------------------- summary


def test_summary_numbers_of_a_hand_computed_program():
    sp, _ = compiled(tiny())
    # i5 is the only ready tensor op at cycle 0, so it holds tensor0 until 40 (a list
    # scheduler never idles a unit); then i2 40-60, i3 60-65, i4 65-75
    assert [(s.unit, s.start, s.end) for s in sp.slots] == [
        ("dma0", 0, 10),
        ("dma1", 0, 10),
        ("tensor0", 40, 60),
        ("vector0", 60, 65),
        ("dma0", 65, 75),
        ("tensor0", 0, 40),
    ]
    d = summarize(sp, machine())
    assert d["makespan_cycles"] == 75 and d["makespan_us"] == 0.075
    assert d["critical_path_cycles"] == 45
    assert d["work_bound_cycles"] == {"dma": 15, "tensor": 60, "vector": 5}
    assert d["busiest_kind"] == "tensor"
    assert d["lower_bound_cycles"] == 60 and d["ratio"] == 1.25
    assert d["instructions"] == {
        "total": 6,
        "by_kind": {"dma": 3, "tensor": 2, "vector": 1},
        "by_unit": {"dma0": 2, "dma1": 1, "tensor0": 2, "vector0": 1},
    }
    assert d["busy_cycles"] == {"dma0": 20, "dma1": 10, "tensor0": 60, "vector0": 5}
    assert d["utilization"] == {
        "dma0": 0.266667,
        "dma1": 0.133333,
        "tensor0": 0.8,
        "vector0": 0.066667,
    }
    assert d["sram"] == {"peak_bytes": 16384, "capacity_bytes": 65536, "peak_fraction": 0.25}
    assert d["dram_bytes_moved"] == 1600
    assert d["policy"] == "critical-path" and d["machine"] == "npu-v1"


def test_summary_lower_bound_rounds_work_up_per_unit():
    p = Program("w", "m", (("dma", 2),), (), tuple(ins(i, "dma0", 5) for i in range(3)), 1, 0, 0)
    sp = schedule.run(p, schedule.Options(), machine())
    d = summarize(sp, machine())
    assert d["work_bound_cycles"] == {"dma": 8} and d["lower_bound_cycles"] == 8
    assert d["makespan_cycles"] == 10 and d["ratio"] == 1.25


def test_summary_of_an_empty_program():
    p = Program("e", "m", (("dma", 1),), (), (), 0, 0, 0)
    d = summarize(schedule.run(p, schedule.Options(), machine()), machine())
    assert d["makespan_cycles"] == 0 and d["ratio"] == 1.0 and d["utilization"] == {"dma0": 0.0}
    assert "makespan" in format_summary(d)


def test_summary_dump_writes_canonical_json_and_a_text_table(tmp_path):
    _, e = compiled(tiny())
    out = tmp_path / "dumps" / "summary"
    edf.DUMPS["summary"](e, out, machine())
    assert sorted(p.name for p in out.iterdir()) == ["summary.json", "summary.txt"]
    raw = (out / "summary.json").read_text()
    d = json.loads(raw)
    assert raw == json.dumps(d, sort_keys=True, indent=2) + "\n"
    assert d == summarize(e.scheduled, machine())
    text = (out / "summary.txt").read_text()
    assert "makespan       75 cycles (0.075 us)" in text
    assert "lower bound    60 cycles" in text and "ratio          1.250" in text
    assert "tensor0       2           60        80.0%" in text
    lines = text.splitlines()
    header = next(ln for ln in lines if ln.startswith("unit"))
    assert header.split() == ["unit", "instrs", "busy", "cycles", "utilization"]


@pytest.mark.parametrize(
    "function, bindings", [("softmax", {"R": 64, "C": 128}), ("layernorm", {"R": 64, "C": 128})]
)
def test_real_program_packs_verifies_and_round_trips(tmp_path, function, bindings):
    from kiln.inspect_edf import render
    from kiln.stages import lir, trace, visa

    m = machine()
    request = trace.TraceRequest(
        module="kernels.normalization", function=function, bindings=tuple(bindings.items())
    )
    graph = trace.run(request, trace.Options(), m)
    program = lir.run(visa.run(graph, visa.Options(), m), lir.Options(), m)
    sp = schedule.run(program, schedule.Options(), m)
    e = edf.run(sp, edf.Options(), m)
    edf.verify(e, m)
    path = tmp_path / edf.ARTIFACT
    path.write_bytes(edf.serialize(e))
    assert edf.read(path) == e
    text = render(path)
    assert all(i.text in text for i in program.instrs)
    d = summarize(sp, m)
    assert d["lower_bound_cycles"] <= d["makespan_cycles"]
    assert d["dram_bytes_moved"] == sum(i.nbytes for i in program.instrs if i.unit_kind == "dma")
