"""Columnar LIR (kiln/ir/lir_table.py): the same bytes, the same objects, the same verdicts."""

from __future__ import annotations

import dataclasses
import pickle

import msgpack
import pytest

from kiln.ir.lir import Program, ScheduledProgram, Slot, instr_to_obj
from kiln.ir.lir_table import InstrTable, SlotTable
from kiln.ir.schedule_check import _valid_at_a_glance, check_schedule, random_program
from kiln.stages import schedule as schedule_stage


def _schedule(program: Program) -> ScheduledProgram:
    return schedule_stage.run(program, schedule_stage.Options(), {})


@pytest.mark.parametrize("seed", range(5))
def test_table_packs_the_bytes_msgpack_gives_the_objects(seed):
    program = random_program(seed, n=120)
    table = InstrTable.from_instrs(program.instrs)
    want = msgpack.packb([instr_to_obj(i) for i in program.instrs], use_bin_type=True)
    assert table.packed_array() == want
    assert program.to_msgpack() == msgpack.packb(program.to_obj(), use_bin_type=True)


def test_a_program_on_a_table_equals_and_serializes_like_one_on_a_tuple():
    program = random_program(3, n=80)
    columnar = dataclasses.replace(program, instrs=InstrTable.from_instrs(program.instrs))
    assert columnar == program and program == columnar
    assert tuple(columnar.instrs) == program.instrs and columnar.instrs[5] == program.instrs[5]
    assert columnar.to_msgpack() == program.to_msgpack() and columnar.key == program.key
    assert pickle.loads(pickle.dumps(columnar)) == program


def test_replace_drops_the_cached_table():
    program = random_program(4, n=20)
    assert len(program.table) == 20
    shorter = dataclasses.replace(program, instrs=program.instrs[:5])
    assert len(shorter.table) == 5 and shorter.key != program.key


def test_scheduled_program_bytes_are_the_same_on_slot_tables_and_tuples():
    sp = _schedule(random_program(5, n=60))
    assert isinstance(sp.slots, SlotTable)
    as_tuples = ScheduledProgram(sp.program, tuple(sp.slots), sp.policy)
    assert as_tuples == sp
    assert as_tuples.to_msgpack() == sp.to_msgpack()
    assert sp.to_msgpack() == msgpack.packb(sp.to_obj(), use_bin_type=True)
    assert sp.makespan == max(s.end for s in sp.slots)


def _moved(sp: ScheduledProgram, k: int, **changes) -> ScheduledProgram:
    slots = list(sp.slots)
    slots[k] = dataclasses.replace(slots[k], **changes)
    return ScheduledProgram(sp.program, tuple(slots), sp.policy)


@pytest.mark.parametrize("seed", range(6))
def test_the_quick_check_passes_exactly_the_schedules_with_no_violation(seed):
    sp = _schedule(random_program(seed, n=60))
    assert _valid_at_a_glance(sp) and check_schedule(sp) == []
    k = 7 + seed
    s = sp.slots[k]
    for broken in (
        _moved(sp, k, start=s.start - 1, end=s.end - 1),  # before a dependency, or overlapping
        _moved(sp, k, end=s.end + 1),  # wrong latency
        _moved(sp, k, unit="nope0"),  # a unit the machine lacks
        _moved(sp, k, start=-5, end=-5 + s.end - s.start),  # before cycle 0
        ScheduledProgram(sp.program, tuple(sp.slots)[:-1], sp.policy),  # a slot missing
    ):
        found = check_schedule(broken)
        assert _valid_at_a_glance(broken) == (found == [])


def test_the_quick_check_finds_two_slots_overlapping_on_one_unit():
    sp = _schedule(random_program(2, n=40))
    first, second = sp.slots[0], next(s for s in sp.slots[1:] if s.unit == sp.slots[0].unit)
    length = second.end - second.start
    broken = _moved(sp, second.instr, start=first.start, end=first.start + length)
    assert not _valid_at_a_glance(broken)
    assert any(v.rule in ("unit-overlap", "dep-order") for v in check_schedule(broken))


def test_slot_table_round_trips_slots():
    slots = (Slot(0, "dma0", 0, 5), Slot(1, "vector1", 5, 9))
    table = SlotTable.from_slots(slots)
    assert table == slots and table[1] == slots[1] and list(table) == list(slots)
