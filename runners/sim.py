"""The sim target: the EDF binary, instruction by instruction, on simulated memory.

The EDF is decoded (its checksum verified), its schedule re-checked, and
every instruction executed in schedule order (start cycle, then id) on a
DRAM and an SRAM byte array with the opcode semantics of
``kiln.ir.lir_exec``. Two instructions that overlap in time and touch
overlapping address ranges, at least one writing, are a race: the run
fails naming both. So is any access outside the memories.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from kiln.runners.base import KernelArtifacts, Runner, RunResult

from kiln.errors import TargetError
from kiln.ir.edf import EdfFile
from kiln.ir.lir import Instr, ScheduledProgram, Slot
from kiln.ir.lir_exec import LirExecError, load_inputs, read_outputs


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
    """A decoded, checked EDF bound to its own simulated memories, ready to run many times."""

    edf: EdfFile
    dram: np.ndarray
    sram: np.ndarray
    steps: list  # one bound closure per instruction, in schedule order

    @staticmethod
    def load(edf: EdfFile) -> SimBinary:
        from kiln.runners.sim_exec import bind

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
        binary = SimBinary(edf, dram, sram, steps)
        binary.warm_up([program.instrs[k].opcode for k in order])
        return binary

    def warm_up(self, opcodes: list[str]) -> None:
        """Run the first instruction of each opcode once, now, outside any timed run.

        An opcode's first call may do one-time work (a lazy import: ml_dtypes
        takes about half a second; numpy's first dispatch of a ufunc), which
        counted in the first run's sim_seconds, the host time spent executing.
        The memories are cleared again by every run.
        """
        first: dict[str, Callable[[], None]] = {}
        for opcode, step in zip(opcodes, self.steps, strict=True):
            first.setdefault(opcode, step)
        with np.errstate(all="ignore"):
            for step in first.values():
                try:
                    step()
                except LirExecError:
                    pass  # on zeroed memory only: a real run reports its own failures


class SimRunner(Runner):
    kind = "sim"
    host_only = True
    reproducible = True

    def prepare(self, artifacts: KernelArtifacts) -> SimBinary:
        from kiln.inspect_edf import load_edf

        if artifacts.edf is None:
            raise TargetError(
                f"{artifacts.name}: the sim target runs EDF binaries, and this pipeline has no "
                "edf stage",
                hint="end `stages:` with {name: edf, module: kiln.stages.edf}",
            )
        from kiln.ir.edf import gc_paused

        edf = load_edf(artifacts.edf)  # ArtifactError on a bad checksum or a truncated file
        with gc_paused():  # thousands of long-lived views and closures: nothing to collect
            self.check(edf.scheduled, str(artifacts.edf))
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
        program = prepared.edf.scheduled.program
        prepared.dram.fill(0)
        prepared.sram.fill(0)
        try:
            load_inputs(program, prepared.dram, inputs)
        except ValueError as exc:
            raise TargetError(str(exc)) from None
        start = time.perf_counter()
        try:
            with np.errstate(all="ignore"):
                for step in prepared.steps:
                    step()
        except LirExecError as exc:
            raise TargetError(f"{program.kernel}: simulation failed: {exc}") from None
        elapsed = time.perf_counter() - start
        outputs = read_outputs(program, prepared.dram)
        return RunResult(outputs, self.metrics(prepared.edf, elapsed))

    def clock_mhz(self, edf: EdfFile) -> float:
        """The clock of the machine the binary was compiled for (recorded in its metadata)."""
        model = (edf.meta.get("machine") or {}).get("model") or self.machine or {}
        return float(model.get("clock_mhz", 1000))

    def metrics(self, edf: EdfFile, elapsed: float) -> dict:
        sp = edf.scheduled
        clock = self.clock_mhz(edf)
        makespan = sp.makespan
        busy: dict[str, int] = {}
        for ins, slot in zip(sp.program.instrs, sp.slots, strict=True):
            busy[slot.unit] = busy.get(slot.unit, 0) + ins.latency
        n = len(sp.program.instrs)
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
