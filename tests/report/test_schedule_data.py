"""Timeline columns and the schedule's critical path (kiln/report/schedule_data.py)."""

from __future__ import annotations

from kiln.ir.lir import Dep, Instr, Program, ScheduledProgram, Slot
from kiln.ir.schedule_check import random_program
from kiln.report.schedule_data import schedule_critical_path, schedule_payload
from kiln.stages.schedule import Options, run


def _program(instrs) -> Program:
    return Program("k", "m", (("dma", 1), ("vector", 1)), (), tuple(instrs), 1024, 0, 0)


def _instr(i, unit, latency, deps=()):
    return Instr(
        i, unit, "op", (), (), 0, latency, tuple(Dep(d, "raw") for d in deps), (), f"op{i}"
    )


def test_critical_path_follows_what_made_each_instruction_wait():
    # 0 (dma, 0-10) -> 2 (vector, 10-15); 1 (dma, 10-30) waits for the unit only; 3 needs 1 and 2
    prog = _program(
        [
            _instr(0, "dma0", 10),
            _instr(1, "dma0", 20),
            _instr(2, "vector0", 5, [0]),
            _instr(3, "vector0", 4, [1, 2]),
        ]
    )
    slots = (
        Slot(0, "dma0", 0, 10),
        Slot(1, "dma0", 10, 30),
        Slot(2, "vector0", 10, 15),
        Slot(3, "vector0", 30, 34),
    )
    sp = ScheduledProgram(prog, slots, "critical-path")
    assert schedule_critical_path(sp) == [0, 1, 3]


def test_payload_columns_match_the_schedule():
    program = random_program(3, n=200)
    sp = run(program, Options(), {})
    p = schedule_payload(sp, nodes=list(range(200)))
    assert p["lanes"] == ["dma0", "dma1", "tensor0", "vector0", "vector1"]
    assert len(p["start"]) == len(p["end"]) == len(p["lane"]) == len(p["text"]) == 200
    slot = {s.instr: s for s in sp.slots}
    for i in (0, 57, 199):
        assert (p["start"][i], p["end"][i]) == (slot[i].start, slot[i].end)
        assert p["lanes"][p["lane"][i]] == slot[i].unit
        deps = p["deps"][p["dep_offsets"][i] : p["dep_offsets"][i + 1]]
        assert deps == [d.src for d in program.instrs[i].deps]
    assert p["makespan"] == sp.makespan == max(p["end"])
    path = p["critical"]
    assert p["end"][path[-1]] == sp.makespan
    assert all(p["end"][a] <= p["start"][b] for a, b in zip(path, path[1:], strict=False))
    assert p["node"] == list(range(200))


def test_payload_drops_a_node_map_of_the_wrong_length():
    sp = run(random_program(1, n=10), Options(), {})
    assert schedule_payload(sp, nodes=[0, 1])["node"] == []
