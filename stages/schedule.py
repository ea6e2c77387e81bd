"""Stage 3: resource-constrained list scheduling, LIR Program -> ScheduledProgram.

Each instruction gets a unit instance of its kind and a start cycle. The
scheduler is event-driven: at each cycle where something finishes it
releases the successors, then fills every free unit instance with the best
ready instruction of its kind. ``critical-path`` ranks ready instructions by
bottom level (longest latency-weighted path to a sink, ties by id), raised
for the last unissued predecessor of an instruction whose other predecessors
have issued (see ``_critical_path``); ``in-order`` issues each unit kind's
instructions strictly in program order.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from heapq import heappop, heappush

import numpy as np

from kiln.errors import StageError, VerifyError
from kiln.fsutil import read_artifact, write_bytes_atomic
from kiln.ir.edf import gc_paused
from kiln.ir.lir import Program, ScheduledProgram, unit_kind
from kiln.ir.lir_table import SlotTable
from kiln.ir.schedule_check import (
    bottom_levels,
    check_schedule,
    dependency_index,
    kind_sort_key,
    topological_order,
    unit_instances,
)

NAME = "schedule"
INPUT = "kernel.lir"  # what the stage reads: the previous stage's ARTIFACT, checked at load
ARTIFACT = "kernel.sched"
# what the compiler driver may call beyond run/verify/serialize/read (kiln/driver.py)
CAPABILITIES = frozenset({"decode", "exact_round_trip"})
POLICIES = ("critical-path", "in-order")


@dataclass(frozen=True)
class Options:
    policy: str = "critical-path"  # critical-path | in-order

    def __post_init__(self) -> None:
        # checked here so that a bad value is reported where pipeline.yaml sets it
        _check_policy(self.policy)


def _check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise StageError(
            f"unknown scheduling policy {policy!r}",
            expected="one of: " + ", ".join(POLICIES),
            found=policy,
        )


def run(program: Program, options: Options, machine: dict) -> ScheduledProgram:
    """Schedule ``program`` on its units; StageError for an unknown policy or a bad graph."""
    with gc_paused():  # GC passes were a third of the time at 100k instructions
        return _run(program, options)


def _run(program: Program, options: Options) -> ScheduledProgram:
    _check_policy(options.policy)
    table = program.table  # columns: no Python object per instruction is touched here
    kinds = sorted((k for k, _ in program.units), key=kind_sort_key)
    kind_no = {k: n for n, k in enumerate(kinds)}
    counts = [int(dict(program.units)[k]) for k in kinds]
    # (kind number, bound instance) per unit name; codes are numbered in order of first
    # use, so the first unit that fails is the first instruction's that does
    bind = [_bind(program, table, c, kind_no, kinds, counts) for c in range(len(table.unit_names))]
    kind_arr = np.array([b[0] for b in bind] or [0], dtype=np.int64)[table.unit]
    bound_arr = np.array([b[1] for b in bind] or [0], dtype=np.int64)[table.unit]
    kind_of, bound = kind_arr.tolist(), bound_arr.tolist()
    # a machine may lack a kind of unit the program never uses (docs/pipeline.md)
    for k in sorted(set(np.unique(kind_arr).tolist()) if len(table) else ()):
        if counts[k] < 1:
            raise StageError(
                f"machine {program.machine!r} has {counts[k]} {kinds[k]} units",
                expected=f">= 1 (the program runs instructions on a {kinds[k]} unit)",
            )
    lat = table.latency.tolist()
    if lat and min(lat) < 0:
        bad = next(ins for ins in program.instrs if ins.latency < 0)
        raise StageError(f"instruction {bad.id} (`{bad.text}`) has latency {bad.latency}")
    try:
        preds, backward = dependency_index(program)
        order = topological_order(preds, backward)
    except ValueError as exc:
        raise StageError(f"cannot schedule {program.kernel!r}: {exc}") from None
    if options.policy == "critical-path":
        bl = bottom_levels(program, preds, order)
        start, unit = _critical_path(kind_of, bound, lat, preds, counts, bl)
    else:
        queues: list[list[int]] = [[] for _ in kinds]
        for pos, k in enumerate(kind_of):
            queues[k].append(pos)
        start, unit = _in_order(kind_of, bound, lat, preds, counts, queues)
        if start is None:
            raise StageError(
                f"cannot schedule {program.kernel!r} in order: a dependency points forward "
                "in program order",
                hint="use policy 'critical-path'",
            )
    names = [f"{k}{i}" for k, c in zip(kinds, counts, strict=True) for i in range(c)]
    first = np.cumsum([0, *counts])[:-1]  # each kind's first name in ``names``
    start_arr = np.array(start, dtype=np.int64)
    slots = SlotTable(
        table.ids,
        first[kind_arr] + np.array(unit, dtype=np.int64),
        start_arr,
        start_arr + table.latency,
        names,
    )
    return ScheduledProgram(program=program, slots=slots, policy=options.policy)


def _bind(program: Program, table, code: int, kind_no: dict, kinds: list, counts: list):
    """(kind number, instance number or -1) of the unit an instruction is bound to."""
    name = table.unit_names[code]
    kind = unit_kind(name)
    k = kind_no.get(kind)
    if k is None:
        ins = program.instrs[int(np.argmax(table.unit == code))]
        raise StageError(
            f"instruction {ins.id} (`{ins.text}`) needs a {kind!r} unit",
            expected="one of: " + ", ".join(kinds),
            found=ins.unit,
        )
    suffix = name[len(kind) :]
    b = int(suffix) if suffix.isdigit() else -1
    return k, b if b < counts[k] else -1


def _successors(preds: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """Successor lists and predecessor counts per position."""
    succs: list[list[int]] = [[] for _ in preds]
    for k, p in enumerate(preds):
        for s in p:
            succs[s].append(k)
    return succs, [len(p) for p in preds]


def _critical_path(kind_of, bound, lat, preds, counts, prio):
    """Start cycles and instance numbers per position, highest ``prio`` first.

    ``prio`` holds bottom levels. One priority is raised as the schedule goes:
    when issuing ``p`` leaves a successor ``s`` waiting on one unissued
    predecessor ``q``, ``q`` ranks at least as high as the path through ``p``
    (``lat[p] + prio[s]``). Without it, two pipelines that share a unit kind
    advance in lock step, each issuing its long instruction first while the
    short one that frees its next step waits for a unit (a row reduction's
    store behind the next row's load), and the units idle while both
    pipelines' middle steps run.
    """
    n = len(kind_of)
    succs, indeg = _successors(preds)
    waiting = list(indeg)  # predecessors not yet issued
    free = [[True] * c for c in counts]
    nfree = list(counts)
    start = [0] * n
    unit = [0] * n
    # heaps hold ints, cheaper to compare than tuples: events end * n + position; ready
    # entries (top - priority) * n + position, so ties go to the lower position. key[p]
    # is p's live entry (-1 once issued): an entry that differs from it is skipped.
    top = max(prio, default=0)
    key = [(top - b) * n + p for p, b in enumerate(prio)]
    events: list[int] = []
    ready: list[list[int]] = [[] for _ in counts]
    push, pop = heappush, heappop
    for p in range(n):
        if indeg[p] == 0:
            push(ready[kind_of[p]], key[p])
    done = 0
    t = 0
    kinds = range(len(counts))
    while True:
        for k in kinds:
            h = ready[k]
            fr = free[k]
            while h and nfree[k]:
                entry = pop(h)
                p = entry % n
                if entry != key[p]:
                    continue
                key[p] = -1
                u = bound[p]
                if u < 0 or not fr[u]:
                    u = fr.index(True)
                fr[u] = False
                nfree[k] -= 1
                start[p] = t
                unit[p] = u
                push(events, (t + lat[p]) * n + p)
                for s in succs[p]:
                    waiting[s] -= 1
                    if waiting[s] == 1:  # raise s's last unissued predecessor
                        rank = (top - lat[p] - prio[s]) * n
                        for q in preds[s]:
                            if key[q] >= 0:
                                if key[q] > rank + q:
                                    key[q] = rank + q
                                    if indeg[q] == 0:
                                        push(ready[kind_of[q]], rank + q)
                                break
        if not events:
            break
        t = events[0] // n
        limit = (t + 1) * n
        while events and events[0] < limit:
            p = pop(events) % n
            done += 1
            k = kind_of[p]
            free[k][unit[p]] = True
            nfree[k] += 1
            for s in succs[p]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    push(ready[kind_of[s]], key[s])
    return start, unit


def _in_order(kind_of, bound, lat, preds, counts, queues):
    """Start cycles and instance numbers per position; (None, None) on a deadlock.

    ``queues`` holds each kind's positions in program order; only a queue's head may issue.
    """
    n = len(kind_of)
    succs, indeg = _successors(preds)
    free = [[True] * c for c in counts]
    nfree = list(counts)
    start = [0] * n
    unit = [0] * n
    events: list[int] = []  # end * n + position
    heads = [0] * len(counts)
    push, pop = heappush, heappop
    done = 0
    t = 0
    while True:
        for k, q in enumerate(queues):
            fr = free[k]
            i = heads[k]
            while nfree[k] and i < len(q) and indeg[q[i]] == 0:
                p = q[i]
                i += 1
                u = bound[p]
                if u < 0 or not fr[u]:
                    u = fr.index(True)
                fr[u] = False
                nfree[k] -= 1
                start[p] = t
                unit[p] = u
                push(events, (t + lat[p]) * n + p)
            heads[k] = i
        if not events:
            break
        t = events[0] // n
        limit = (t + 1) * n
        while events and events[0] < limit:
            p = pop(events) % n
            done += 1
            k = kind_of[p]
            free[k][unit[p]] = True
            nfree[k] += 1
            for s in succs[p]:
                indeg[s] -= 1
    if done != n:
        return None, None
    return start, unit


# decode(serialize(ir)) gives the next stage an IR it cannot tell from ``ir``: a chain on
# a Dask worker hands ``ir`` on as it is (tasks/execution/chain_worker.py)
EXACT_ROUND_TRIP = True


def serialize(sp: ScheduledProgram) -> bytes:
    return sp.to_msgpack()


def decode(data: bytes) -> ScheduledProgram:
    """The scheduled program held by ``kernel.sched``'s bytes: ``read`` without the file."""
    return ScheduledProgram.from_msgpack(data)


def read(path: str | os.PathLike) -> ScheduledProgram:
    """Load a ``kernel.sched`` artifact; ArtifactError naming the file if it is corrupt."""
    return read_artifact(path, "schedule artifact", decode)


def verify(sp: ScheduledProgram, machine: dict) -> None:
    """VerifyError naming the first broken rule, its instruction and how many more there are."""
    raise_violations(sp, NAME)


def raise_violations(sp: ScheduledProgram, stage: str) -> None:
    """Shared by the schedule and EDF stages: turn check_schedule's list into a VerifyError."""
    found = check_schedule(sp)
    if not found:
        return
    first = found[0]
    raise VerifyError(
        f"stage {stage!r}: {first.describe(sp.program)}",
        notes=[v.describe(sp.program) for v in found[1:6]]
        + ([f"... and {len(found) - 6} more violations"] if len(found) > 6 else []),
    )


def trace_events(sp: ScheduledProgram, machine: dict, complete: bool = True) -> dict:
    """The schedule as a Chrome Trace Event object (opens in Perfetto and chrome://tracing).

    ``complete=False`` leaves out the per-instruction "X" events (trace_json formats them).
    """
    clock = _clock_mhz(machine)
    program = sp.program
    tids = {u: n + 1 for n, u in enumerate(unit_instances(program.units))}
    for s in sp.slots:  # units the machine lacks still get a track (verify reports them)
        tids.setdefault(s.unit, len(tids) + 1)
    events: list[dict] = [
        {"ph": "M", "pid": 1, "tid": 0, "name": "process_name", "args": {"name": program.kernel}}
    ]
    for u, tid in tids.items():
        events.append({"ph": "M", "pid": 1, "tid": tid, "name": "thread_name", "args": {"name": u}})
        events.append(
            {
                "ph": "M",
                "pid": 1,
                "tid": tid,
                "name": "thread_sort_index",
                "args": {"sort_index": tid},
            }
        )
    for ins, s in zip(program.instrs, sp.slots, strict=False) if complete else ():
        events.append(
            {
                "ph": "X",
                "name": ins.opcode,
                "cat": ins.unit_kind,
                "ts": _us(s.start, clock),
                "dur": _us(s.end - s.start, clock),
                "pid": 1,
                "tid": tids[s.unit],
                "args": {
                    "id": ins.id,
                    "text": ins.text,
                    "bytes": ins.nbytes,
                    "cycles": [s.start, s.end],
                    "deps": [[d.src, d.kind] for d in ins.deps],
                },
            }
        )
    other = {
        "kernel": program.kernel,
        "machine": machine.get("name", program.machine),
        "policy": sp.policy,
        "clock_mhz": clock,
        "makespan_cycles": sp.makespan,
        "instructions": len(program.instrs),
    }
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": other}


def trace_json(sp: ScheduledProgram, machine: dict) -> bytes:
    """Canonical bytes of ``trace_events``: compact JSON, sorted keys, one event per line.

    The per-instruction events are formatted from a template (5x faster than
    json.dumps on 100k dicts); tests check that each line equals json.dumps of
    the matching ``trace_events`` entry.
    """
    obj = trace_events(sp, machine, complete=False)
    clock = obj["otherData"]["clock_mhz"]
    tids = {e["args"]["name"]: e["tid"] for e in obj["traceEvents"] if e["name"] == "thread_name"}
    lines = [_enc(e) for e in obj["traceEvents"]]
    s_ = _enc_str
    for ins, s in zip(sp.program.instrs, sp.slots, strict=False):
        deps = "[" + ",".join(f"[{d.src},{s_(d.kind)}]" for d in ins.deps) + "]"
        lines.append(
            f'{{"args":{{"bytes":{ins.nbytes},"cycles":[{s.start},{s.end}],"deps":{deps},'
            f'"id":{ins.id},"text":{s_(ins.text)}}},"cat":{s_(ins.unit_kind)},'
            f'"dur":{_us(s.end - s.start, clock)!r},"name":{s_(ins.opcode)},"ph":"X",'
            f'"pid":1,"tid":{tids[s.unit]},"ts":{_us(s.start, clock)!r}}}'
        )
    body = ",\n".join(lines)
    text = (
        f'{{"displayTimeUnit":{_enc(obj["displayTimeUnit"])},'
        f'"otherData":{_enc(obj["otherData"])},\n"traceEvents":[\n{body}\n]}}\n'
    )
    return text.encode("ascii")


def _enc(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


_enc_str = json.encoder.encode_basestring_ascii


def _clock_mhz(machine: dict) -> float:
    clock = machine.get("clock_mhz")
    if not isinstance(clock, int | float) or isinstance(clock, bool) or clock <= 0:
        raise StageError(
            f"machine {machine.get('name', '?')!r} has no usable clock_mhz",
            expected="a positive number (MHz)",
            found=repr(clock),
        )
    return clock


def _us(cycles: int, clock_mhz: float) -> float:
    return round(cycles / clock_mhz, 6)


def _dump_schedule(sp: ScheduledProgram, path: str | os.PathLike, machine: dict) -> None:
    with gc_paused():
        data = trace_json(sp, machine)
    write_bytes_atomic(path, data)


DUMPS = {"schedule": _dump_schedule}
