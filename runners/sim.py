"""The sim target: the EDF binary, instruction by instruction, on simulated memory.

The EDF is decoded (its checksum verified), its schedule re-checked, and
every instruction executed in schedule order (start cycle, then id) on a
DRAM and an SRAM byte array with the opcode semantics of
``kiln.ir.lir_exec``. Two instructions that overlap in time and touch
overlapping address ranges, at least one writing, are a race: the run
fails naming both. So is any access outside the memories.

Preparing a binary the first time (``sim_plan.checked_plan``): the sections
are read in bulk, with numpy over the instruction section
(``sim_msgpack``, ``sim_decode``), every check is made over those columns
(``sim_checks``), and the instructions are grouped into templates that are
bound together (``sim_templates``, ``sim_exec``, ``sim_bind``). The result
is kept per sha256 of the file's bytes, so preparing the same bytes again
only binds. A binary that fails any bulk check, or is not in the form the
bulk readers take, is decoded to objects and checked one object at a time
by the functions below, which word every problem; no check is skipped.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kiln.errors import ArtifactError, Location, TargetError
from kiln.ir.edf import EdfFile, EdfFormatError, decode, gc_paused
from kiln.ir.lir import Instr, Program, ScheduledProgram, Slot
from kiln.ir.lir_exec import LirExecError, load_inputs, read_outputs
from kiln.runners.base import KernelArtifacts, Runner, RunResult
from kiln.runners.sim_bind import bind_plan
from kiln.runners.sim_exec import Step, bind, run_steps
from kiln.runners.sim_plan import Plan, checked_plan, plan_of_program


@dataclass(frozen=True)
class Race:
    first: Instr
    second: Instr
    first_slot: Slot
    second_slot: Slot
    space: str
    start: int
    end: int

    def describe(self) -> str:
        def who(i: Instr, s: Slot) -> str:
            return f"instruction {i.id} `{i.text or i.opcode}` on {s.unit} [{s.start}, {s.end})"

        return (
            f"race on {self.space}[{self.start}:{self.end}]: {who(self.first, self.first_slot)}"
            f" and {who(self.second, self.second_slot)} overlap in time and at least one "
            "of them writes that range"
        )


def find_races(sp: ScheduledProgram, limit: int = 20) -> list[Race]:
    """Pairs of instructions overlapping in time whose accesses conflict (a write involved).

    A sweep over start times keeps only the instructions still running, so
    the cost is the program size times the number of units.
    """
    instrs = sp.program.instrs
    order = sorted(range(len(instrs)), key=lambda k: (sp.slots[k].start, k))
    active: list[int] = []
    races: list[Race] = []
    for k in order:
        slot = sp.slots[k]
        active = [j for j in active if sp.slots[j].end > slot.start]
        cur = instrs[k]
        for j in active:
            other = instrs[j]
            hit = _conflict(other, cur)
            if hit is not None:
                races.append(Race(other, cur, sp.slots[j], slot, *hit))
                if len(races) >= limit:
                    return races
        active.append(k)
    return races


def _conflict(a: Instr, b: Instr):
    for wa in a.writes:
        for rb in b.reads + b.writes:
            if wa.overlaps(rb):
                return wa.space, max(wa.addr, rb.addr), min(wa.end, rb.end)
    for wb in b.writes:
        for ra in a.reads:
            if wb.overlaps(ra):
                return wb.space, max(wb.addr, ra.addr), min(wb.end, ra.end)
    return None


def bounds_errors(sp: ScheduledProgram) -> list[str]:
    """Accesses outside SRAM capacity or the DRAM footprint."""
    program = sp.program
    limits = {"sram": program.sram_bytes, "dram": program.dram_bytes}
    errors = []
    for ins in program.instrs:
        for access in ins.reads + ins.writes:
            limit = limits.get(access.space)
            if limit is None or access.addr < 0 or access.end > limit:
                errors.append(
                    f"instruction {ins.id} `{ins.text or ins.opcode}` touches "
                    f"{access.space}[{access.addr}:{access.end}], outside "
                    f"[0:{limit}]"
                )
    return errors


@dataclass
class SimBinary:
    """A checked binary bound to its own simulated memories, ready to run many times."""

    program: Program  # the signature: arguments and memories (its instrs may be empty)
    metadata: str
    dram: np.ndarray
    sram: np.ndarray
    steps: list[Step]  # one per instruction, in schedule order
    count: int
    makespan: int
    busy: dict[str, int]  # cycles per unit
    bound: str  # "columns" (bulk) or "objects" (one instruction at a time)
    source: EdfFile | bytes | None = field(default=None, repr=False)

    @property
    def edf(self) -> EdfFile:
        """The decoded binary (decoded now when it was prepared from bytes)."""
        if isinstance(self.source, bytes):
            self.source = decode(self.source)
        assert self.source is not None
        return self.source

    @staticmethod
    def load(edf: EdfFile) -> SimBinary:
        """Bind a decoded binary (no checks: ``SimRunner.prepare`` makes them)."""
        plan = plan_of_program(edf.scheduled, edf.metadata)
        if plan is None:
            return SimBinary.load_objects(edf)
        return SimBinary.bind(plan, edf)

    @staticmethod
    def bind(plan: Plan, source: EdfFile | bytes) -> SimBinary:
        """Bind a plan to fresh memories: a step per instruction, in schedule order."""
        program = plan.program
        dram = np.zeros(program.dram_bytes, dtype=np.uint8)
        sram = np.zeros(program.sram_bytes, dtype=np.uint8)
        steps, firsts = bind_plan(plan.templates, plan.fast, plan.generic, plan.gather, dram, sram)
        binary = SimBinary(
            program, plan.metadata, dram, sram, steps, plan.count, plan.makespan,
            plan.busy, "columns", source,
        )  # fmt: skip
        binary.warm_up(firsts)
        return binary

    @staticmethod
    def load_objects(edf: EdfFile) -> SimBinary:
        """Bind instruction by instruction: what a binary the columns cannot take gets."""
        sp = edf.scheduled
        program = sp.program
        dram = np.zeros(program.dram_bytes, dtype=np.uint8)
        sram = np.zeros(program.sram_bytes, dtype=np.uint8)
        order = sorted(range(len(program.instrs)), key=lambda k: (sp.slots[k].start, k))
        try:
            steps = [bind(program.instrs[k], dram, sram) for k in order]
        except LirExecError as exc:
            raise TargetError(
                f"{program.kernel}: the simulator cannot run this binary: {exc}"
            ) from None
        busy: dict[str, int] = {}
        for ins, slot in zip(program.instrs, sp.slots, strict=True):
            busy[slot.unit] = busy.get(slot.unit, 0) + ins.latency
        binary = SimBinary(
            program, edf.metadata, dram, sram, steps, len(steps), sp.makespan, busy,
            "objects", edf,
        )  # fmt: skip
        first: dict[str, Step] = {}
        for k, step in zip(order, steps, strict=True):
            first.setdefault(program.instrs[k].opcode, step)
        binary.warm_up(list(first.values()))
        return binary

    def warm_up(self, steps: list[Step]) -> None:
        """Run the first instruction of each kind once, now, outside any timed run.

        An opcode's first call may do one-time work (a lazy import: ml_dtypes
        takes about half a second; numpy's first dispatch of a ufunc), which
        counted in the first run's sim_seconds, the host time spent executing.
        The memories are cleared again by every run.
        """
        with np.errstate(all="ignore"):
            for step in steps:
                try:
                    step()
                except LirExecError:
                    pass  # on zeroed memory only: a real run reports its own failures


class SimRunner(Runner):
    kind = "sim"
    host_only = True
    reproducible = True

    def prepare(self, artifacts: KernelArtifacts) -> SimBinary:
        from kiln.inspect_edf import artifact_error

        if artifacts.edf is None:
            raise TargetError(
                f"{artifacts.name}: the sim target runs EDF binaries, and this pipeline has no "
                "edf stage",
                hint="add the row {name: edf, module: kiln.stages.edf} to `stages:`",
            )
        where = str(artifacts.edf)
        try:
            raw = Path(artifacts.edf).read_bytes()
        except OSError as exc:
            raise ArtifactError(
                f"cannot read EDF file: {exc.strerror or exc}", location=Location(where)
            ) from None
        # thousands of long-lived views and steps: nothing for the cyclic GC to collect
        with gc_paused():
            try:
                plan = checked_plan(raw, where)  # the same bytes prepared before: no work
                if plan is not None:
                    return SimBinary.bind(plan, raw)
                # refused, unusual or unbindable: decode to objects, which say what is wrong
                edf = decode(raw, where)
            except EdfFormatError as exc:  # a bad checksum, a truncated file
                raise artifact_error(exc, where) from None
            self.check(edf.scheduled, where)
            return SimBinary.load(edf)

    def check(self, sp: ScheduledProgram, where: str) -> None:
        from kiln.ir.schedule_check import check_schedule

        problems = [v.describe(sp.program) for v in check_schedule(sp)]
        problems += [r.describe() for r in find_races(sp)]
        problems += bounds_errors(sp)
        if problems:
            raise TargetError(
                f"{where}: the simulator refuses this binary: {problems[0]}",
                notes=problems[1:10]
                + ([f"... and {len(problems) - 10} more"] if len(problems) > 10 else []),
            )

    def run(self, prepared: SimBinary | EdfFile, inputs: list[np.ndarray]) -> RunResult:
        if isinstance(prepared, EdfFile):  # a decoded binary not bound yet
            prepared = SimBinary.load(prepared)
        program = prepared.program
        prepared.dram.fill(0)
        prepared.sram.fill(0)
        try:
            load_inputs(program, prepared.dram, inputs)
        except ValueError as exc:
            raise TargetError(str(exc)) from None
        start = time.perf_counter()
        try:
            with np.errstate(all="ignore"):
                run_steps(prepared.steps)
        except LirExecError as exc:
            raise TargetError(f"{program.kernel}: simulation failed: {exc}") from None
        elapsed = time.perf_counter() - start
        outputs = read_outputs(program, prepared.dram)
        return RunResult(outputs, self.metrics(prepared, elapsed))

    def clock_mhz(self, prepared: SimBinary) -> float:
        """The clock of the machine the binary was compiled for (recorded in its metadata)."""
        meta = json.loads(prepared.metadata)
        model = (meta.get("machine") or {}).get("model") or self.machine or {}
        return float(model.get("clock_mhz", 1000))

    def metrics(self, prepared: SimBinary, elapsed: float) -> dict:
        clock = self.clock_mhz(prepared)
        makespan, busy, n = prepared.makespan, prepared.busy, prepared.count
        metrics = {
            "cycles": makespan,
            "microseconds": makespan / clock,
            "instructions": n,
            "sim_seconds": elapsed,
            "sim_instructions_per_second": n / elapsed if elapsed > 0 else float("inf"),
        }
        for unit in sorted(busy):
            metrics[f"utilization.{unit}"] = round(busy[unit] / makespan, 4) if makespan else 0.0
        return metrics
