"""The simulator from EDF file to results (issue 29), measured for benchmarks/targets.py.

Three ways to get a binary ready are timed in interleaved rounds (each
round measures each way once, so a busy spell on this shared machine hits
them alike), wall and process CPU time each; medians are printed with every
round's figure:

- first prepare: ``SimRunner.prepare`` of bytes it has not seen (its plan
  cache cleared): read, checksums, decode in columns, every check, bind;
- plan cached: ``prepare`` of the same bytes again (``kiln test`` then
  ``kiln bench`` in one process): sha256 of the file and bind;
- object path, the same-run calibration: what prepare did before columns
  (``load_edf`` to ``Instr`` objects, the checks object by object, binding
  one instruction at a time), which a refused binary still takes for its
  messages.

Execute is ``SimRunner.run`` (memories cleared, inputs in, every
instruction, outputs out). Targets: execute at least 1,000,000
instructions/s; decode + prepare + execute at least 200,000/s, judged for a
first prepare and for a cached plan.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

EXECUTE_TARGET = 1_000_000  # instructions per second
END_TO_END_TARGET = 200_000

Figure = tuple[str, str, str, bool | None]  # what, value, target, met (None: not judged)


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def _ms(samples: list[float]) -> str:
    return ", ".join(f"{s * 1e3:.1f}" for s in samples)


def sim_figures(artifacts, inputs, machine: dict, rounds: int, label: str, compile_s: float):
    """Print the figures of one compiled kernel; return them as (what, value, target, met)."""
    from kiln.inspect_edf import load_edf
    from kiln.ir.edf import gc_paused
    from kiln.runners.sim import SimBinary, SimRunner
    from kiln.runners.sim_plan import clear_cache

    runner = SimRunner(machine=machine)

    def object_path() -> SimBinary:
        edf = load_edf(artifacts.edf)
        with gc_paused():
            runner.check(edf.scheduled, str(artifacts.edf))
            return SimBinary.load_objects(edf)

    ways = {"first": [], "cached": [], "objects": []}  # per way: (prepare, execute) pairs
    for timed in [False] + [True] * rounds:  # an untimed round first: imports, first calls
        clear_cache()
        for way, prepare in (
            ("first", lambda: runner.prepare(artifacts)),
            ("cached", lambda: runner.prepare(artifacts)),
            ("objects", object_path),
        ):
            prepared, wall, cpu = _timed(prepare)
            _, run_wall, run_cpu = _timed(lambda p=prepared: runner.run(p, inputs))
            if timed:
                ways[way].append((wall, cpu, run_wall, run_cpu))
            if way != "objects":
                assert prepared.bound == "columns", "the benchmark binary left the bulk path"
    n = prepared.count

    def med(way: str, k: int) -> float:
        return statistics.median(s[k] for s in ways[way])

    runs = ways["first"] + ways["cached"]  # execute: every run of a bulk-bound binary
    execute = statistics.median(s[2] for s in runs)
    execute_cpu = statistics.median(s[3] for s in runs)
    ends = {w: statistics.median(s[0] + s[2] for s in ways[w]) for w in ways}
    ends_cpu = {w: statistics.median(s[1] + s[3] for s in ways[w]) for w in ways}
    print(
        f"sim {label} on {machine['name']}: {n} LIR instructions; execute "
        f"{execute * 1e3:.1f} ms = {n / execute:,.0f}/s (CPU {execute_cpu * 1e3:.1f} ms); "
        f"compile {compile_s:.2f} s",
        flush=True,
    )
    print(f"  decode + prepare, median of {rounds} interleaved rounds (every round, ms):")
    names = {
        "first": "first prepare of these bytes",
        "cached": "same bytes again (plan cached)",
        "objects": "object path (calibration)",
    }
    for way, name in names.items():
        print(
            f"    {name:<32} {med(way, 0) * 1e3:8.1f} ms (CPU {med(way, 1) * 1e3:.1f} ms)"
            f"   [{_ms([s[0] for s in ways[way]])}]",
            flush=True,
        )
    speedup = ends["objects"] / ends["first"]
    print("  decode + prepare + execute, instr/s (by CPU time in brackets):")
    for way, name in names.items():
        print(f"    {name:<32} {n / ends[way]:>12,.0f}  ({n / ends_cpu[way]:,.0f})")
    print(f"  first prepare {speedup:.1f}x faster than the object path, same run", flush=True)
    figures: list[Figure] = [
        (
            f"sim execute ({n} instrs)",
            f"{n / execute:,.0f} instr/s ({execute * 1e3:.1f} ms)",
            f">= {EXECUTE_TARGET:,}/s",
            n / execute >= EXECUTE_TARGET,
        )
    ]
    for way, what in (("first", "first prepare"), ("cached", "plan cached")):
        rate = n / ends[way]
        figures.append(
            (
                f"sim decode+prepare+execute, {what}",
                f"{rate:,.0f} instr/s ({ends[way] * 1e3:.1f} ms)",
                f">= {END_TO_END_TARGET:,}/s",
                rate >= END_TO_END_TARGET,
            )
        )
    figures.append(
        (
            "sim decode+prepare+execute, object path",
            f"{n / ends['objects']:,.0f} instr/s (calibration)",
            "",
            None,
        )
    )
    return figures
