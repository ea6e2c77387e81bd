"""Every schedule the stage produces is legal, checked here without the stage's own checker.

``assert_legal`` restates the scheduling problem from the program alone: each
instruction runs on an instance of its unit kind for exactly its latency,
starts at or after every dependency's end, and no unit instance (nor unit
kind, counted over its instances) runs more than it has at once. It is fed
every example instance of pipeline.yaml on both example machines and DAGs
drawn by hypothesis, under both policies.
"""

from __future__ import annotations

from collections import Counter
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.ir.lir import Access, ArgSlot, Dep, Instr, Program, ScheduledProgram
from kiln.options import build_options
from kiln.pipeline import load_pipeline
from kiln.stages import lir, schedule, trace, visa

REPO = Path(__file__).resolve().parents[2]
KINDS = ("dma", "tensor", "vector")


def assert_legal(sp: ScheduledProgram) -> None:
    """AssertionError naming the first broken constraint of ``sp``."""
    program = sp.program
    counts = dict(program.units)
    assert len(sp.slots) == len(program.instrs)
    slot_of = {}
    for ins, s in zip(program.instrs, sp.slots, strict=True):
        assert s.instr == ins.id
        kind = s.unit.rstrip("0123456789")
        assert kind == ins.unit_kind, f"{ins.id}: a {ins.unit_kind} instruction on {s.unit}"
        assert 0 <= int(s.unit[len(kind) :]) < counts[kind], f"{ins.id}: no unit {s.unit}"
        assert s.start >= 0 and s.end - s.start == ins.latency, f"{ins.id}: slot {s}"
        slot_of[ins.id] = s
    for ins in program.instrs:
        for d in ins.deps:
            assert slot_of[ins.id].start >= slot_of[d.src].end, (
                f"{ins.id} starts at {slot_of[ins.id].start}, before {d.kind} dependency "
                f"{d.src} ends at {slot_of[d.src].end}"
            )
    by_unit: dict[str, list] = {}
    for s in sp.slots:
        by_unit.setdefault(s.unit, []).append((s.start, s.end, s.instr))
    for unit, spans in by_unit.items():
        spans.sort()
        reach = -1
        for start, end, instr in spans:
            assert start >= reach, f"{instr} starts on {unit} at {start}, busy until {reach}"
            reach = max(reach, end)
    # per kind: never more instructions running at once than the kind has units
    changes: dict[str, Counter] = {}
    for ins, s in zip(program.instrs, sp.slots, strict=True):
        if s.end > s.start:
            c = changes.setdefault(ins.unit_kind, Counter())
            c[s.start] += 1
            c[s.end] -= 1
    for kind, c in changes.items():
        running = 0
        for t in sorted(c):
            running += c[t]
            assert running <= counts[kind], f"{running} {kind} instructions at cycle {t}"


# ----------------------------------------------------------------------- example instances


@cache
def _pipeline():
    return load_pipeline(REPO / "pipeline.yaml")


def _instances() -> list[tuple[str, str, str]]:
    pipeline = _pipeline()
    return [
        (machine, spec.name, size)
        for machine in ("npu-v1", "npu-tiny")
        for spec in pipeline.kernels
        for size in spec.shape_set_names
    ]


def _kernel_module(name: str) -> str:
    import importlib
    import pkgutil

    import kernels

    for info in pkgutil.iter_modules(kernels.__path__, "kernels."):
        if hasattr(importlib.import_module(info.name), name):
            return info.name
    raise LookupError(name)


def compile_example(machine_name: str, kernel: str, size: str) -> tuple[Program, dict]:
    """The example instance's LIR program as the pipeline builds it, and its machine."""
    pipeline = _pipeline()
    spec = next(s for s in pipeline.kernels if s.name == kernel)
    machine = {"name": machine_name, **pipeline.machines[machine_name]}
    request = trace.TraceRequest(
        module=_kernel_module(spec.function or spec.name),
        function=spec.function or spec.name,
        bindings=tuple(spec.shape_set(size).items()),
        dtypes=tuple(sorted(spec.dtypes)),
        default_dtype=spec.dtype,
    )
    ir = trace.run(request, trace.Options(), machine)
    for module in (visa, lir):
        options = build_options(
            module.Options, pipeline.stage_options(spec, module.NAME), module.NAME
        )
        ir = module.run(ir, options, machine)
    return ir, machine


@pytest.mark.parametrize("machine_name, kernel, size", _instances(), ids="-".join)
def test_example_instances_get_legal_schedules(machine_name, kernel, size):
    program, machine = compile_example(machine_name, kernel, size)
    for policy in schedule.POLICIES:
        assert_legal(schedule.run(program, schedule.Options(policy=policy), machine))


def test_row_reductions_reach_the_optimum_on_npu_v1():
    # two load -> sum -> store pipelines share the DMA units; CP-SAT proves 14,760
    # cycles optimal (benchmarks/schedule_quality.py); lock-step issue took 16,800
    for kernel in ("row_sum", "row_max"):
        program, machine = compile_example("npu-v1", kernel, "large")
        assert schedule.run(program, schedule.Options(), machine).makespan == 14760


# ----------------------------------------------------------------------- drawn DAGs


@st.composite
def dags(draw) -> Program:
    """A program over dma/tensor/vector units: latencies (some 0), deps on earlier instructions."""
    counts = draw(st.tuples(*(st.integers(1, 3) for _ in KINDS)))
    n = draw(st.integers(0, 60))
    instrs = []
    for i in range(n):
        kind = draw(st.sampled_from(KINDS))
        unit = f"{kind}{draw(st.integers(0, counts[KINDS.index(kind)]))}"  # may name none
        latency = draw(st.one_of(st.just(0), st.integers(1, 300)))
        srcs = draw(st.sets(st.integers(max(0, i - 12), i - 1), max_size=4)) if i else set()
        deps = tuple(Dep(s, draw(st.sampled_from(("raw", "war", "waw")))) for s in sorted(srcs))
        access = (Access("sram", 64 * i, 64),)
        instrs.append(Instr(i, unit, "op", access, access, 64, latency, deps, (), f"op {i}"))
    return Program(
        kernel="drawn",
        machine="drawn",
        units=tuple(zip(KINDS, counts, strict=True)),
        args=(ArgSlot("x", "input", (4, 4), "f32", 0, 64),),
        instrs=tuple(instrs),
        sram_bytes=1 << 20,
        sram_peak=64 * max(n, 1),
        dram_bytes=64,
    )


@settings(max_examples=80, deadline=None)
@given(program=dags(), policy=st.sampled_from(schedule.POLICIES))
def test_drawn_dags_get_legal_schedules(program, policy):
    assert_legal(schedule.run(program, schedule.Options(policy=policy), {}))


@settings(max_examples=80, deadline=None)
@given(program=dags())
def test_scheduling_twice_gives_the_same_schedule(program):
    first = schedule.run(program, schedule.Options(), {})
    again = schedule.run(program, schedule.Options(), {})
    assert first.slots == again.slots
