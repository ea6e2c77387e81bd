"""The lir stage's verifier: every rule checked over the instruction columns at once.

``first_suspect`` runs each rule of ``_check_instr`` as numpy expressions
over the program's ``InstrTable`` and returns the first instruction that
may break one. It never misses a broken rule; ``verify`` then runs the
per-instruction check from there to name the rule in words, so a valid
program (the usual case) costs no Python work per instruction.
"""

from __future__ import annotations

import numpy as np

from kiln.errors import VerifyError
from kiln.ir.lir import DEP_KINDS, Instr, Program, unit_kind
from kiln.ir.visa import OPS

_UNIT_OF = {spec.name: spec.unit for spec in OPS.values()}


def _check_instr(program: Program, pos: int, ins: Instr, units: dict[str, int]) -> str | None:
    """The first rule ``ins`` breaks, or None."""
    if ins.id != pos:
        return f"id {ins.id} is not its position {pos}"
    kind = unit_kind(ins.unit)
    index = ins.unit[len(kind) :]
    if kind not in units or not index.isdigit() or int(index) >= units[kind]:
        return f"unit {ins.unit} does not exist on the machine"
    if ins.opcode in _UNIT_OF and _UNIT_OF[ins.opcode] != kind:
        return f"{ins.opcode} runs on a {_UNIT_OF[ins.opcode]} unit, not {ins.unit}"
    if ins.latency <= 0:
        return f"latency {ins.latency} must be > 0"
    limits = {"sram": program.sram_bytes, "dram": program.dram_bytes}
    for a in ins.reads + ins.writes:
        if a.space not in limits or a.addr < 0 or a.nbytes < 0 or a.end > limits[a.space]:
            return f"access {a.space}[{a.addr}:{a.end}] is outside the {a.space}"
    seen = set()
    for d in ins.deps:
        if d.kind not in DEP_KINDS or (d.src, d.kind) in seen:
            return f"dependency {d} is malformed or repeated"
        seen.add((d.src, d.kind))
        if not 0 <= d.src < pos:
            return f"dependency on {d.src} does not point backwards"
        src = program.instrs[d.src]
        mine, theirs = {
            "raw": (ins.reads, src.writes),
            "war": (ins.writes, src.reads),
            "waw": (ins.writes, src.writes),
        }[d.kind]
        if not any(a.overlaps(b) for a in mine for b in theirs):
            return f"{d.kind} dependency on {d.src} has no overlapping access"
    return None


def _unit_ok(unit: str, units: dict[str, int]) -> bool:
    kind = unit_kind(unit)
    index = unit[len(kind) :]
    return kind in units and index.isdigit() and int(index) < units[kind]


def _owner(off: np.ndarray) -> np.ndarray:
    """The row each CSR entry belongs to."""
    return np.repeat(np.arange(len(off) - 1), np.diff(off))


def first_suspect(program: Program, units: dict[str, int]) -> int | None:
    """The first instruction that may break a rule of ``_check_instr`` (None: all valid)."""
    t = program.table
    n = len(t)
    if n == 0:
        return None
    bad = t.ids != np.arange(n)
    bad |= t.latency <= 0
    # unit exists and runs the opcode's kind: judged once per (opcode, unit) pair
    ok = np.array(
        [
            [
                _unit_ok(u, units) and _UNIT_OF.get(op, unit_kind(u)) == unit_kind(u)
                for u in t.unit_names
            ]
            for op in t.opcode_names
        ],
        dtype=bool,
    ).reshape(len(t.opcode_names), len(t.unit_names))
    bad |= ~ok[t.opcode, t.unit]
    # accesses inside their space (an unknown space has limit -1: always outside)
    limits = {"sram": program.sram_bytes, "dram": program.dram_bytes}
    limit = np.array([limits.get(s, -1) for s in t.space_names] or [-1], dtype=np.int64)
    space = np.concatenate([t.r_space, t.w_space])
    addr = np.concatenate([t.r_addr, t.w_addr])
    end = addr + np.concatenate([t.r_nbytes, t.w_nbytes])
    lim = limit[space]
    outside = (lim < 0) | (addr < 0) | (end < addr) | (end > lim)
    owner = np.concatenate([_owner(t.r_off), _owner(t.w_off)])
    bad[owner[outside]] = True
    _check_deps(t, space, addr, end, bad)
    return int(np.argmax(bad)) if bad.any() else None


def _check_deps(t, space, addr, end, bad: np.ndarray) -> None:
    """Flag instructions with a malformed, repeated, forward or non-overlapping dependency."""
    dst = _owner(t.d_off)
    src, kind = t.d_src, t.d_kind
    if not len(dst):
        return
    names = np.array([k in DEP_KINDS for k in t.kind_names], dtype=bool)
    flag = ~names[kind] | (src < 0) | (src >= dst)
    order = np.lexsort((kind, src, dst))
    same = (np.diff(dst[order]) == 0) & (np.diff(src[order]) == 0) & (np.diff(kind[order]) == 0)
    flag[order[1:][same]] = True
    # which accesses each side brings: raw (my reads, its writes), war (my writes, its
    # reads), waw (my writes, its writes); reads then writes in the joined access arrays
    code = {k: t.kind_names.index(k) if k in t.kind_names else -1 for k in DEP_KINDS}
    n_reads = len(t.r_space)
    s = np.where(flag, 0, src)  # flagged deps look at instruction 0 (already bad anyway)
    mine_reads = kind == code["raw"]
    theirs_reads = kind == code["war"]
    mine_lo = np.where(mine_reads, t.r_off[dst], n_reads + t.w_off[dst])
    mine_n = np.where(mine_reads, np.diff(t.r_off)[dst], np.diff(t.w_off)[dst])
    theirs_lo = np.where(theirs_reads, t.r_off[s], n_reads + t.w_off[s])
    theirs_n = np.where(theirs_reads, np.diff(t.r_off)[s], np.diff(t.w_off)[s])
    pairs = mine_n * theirs_n
    dep = np.repeat(np.arange(len(dst)), pairs)
    q = np.arange(len(dep)) - np.repeat(np.cumsum(pairs) - pairs, pairs)
    width = np.maximum(theirs_n, 1)[dep]
    a = mine_lo[dep] + q // width
    b = theirs_lo[dep] + q % width
    hit = (space[a] == space[b]) & (addr[a] < end[b]) & (addr[b] < end[a])
    overlapping = np.zeros(len(dst), dtype=bool)
    overlapping[dep[hit]] = True
    flag |= ~overlapping
    bad[dst[flag]] = True


def verify(program: Program, machine: dict) -> None:
    """VerifyError naming the stage, the instruction and the first rule it breaks."""
    units = {str(k): int(v) for k, v in machine.get("units", {}).items()}
    if program.sram_peak > program.sram_bytes:
        raise VerifyError(f"stage lir: sram_peak {program.sram_peak} exceeds SRAM")
    if program.sram_bytes > int(machine["sram_bytes"]):
        raise VerifyError(f"stage lir: program assumes {program.sram_bytes} bytes of SRAM")
    start = first_suspect(program, units)
    if start is None:
        return
    instrs = program.instrs
    for pos in range(start, len(instrs)):
        ins = instrs[pos]
        rule = _check_instr(program, pos, ins, units)
        if rule is not None:
            raise VerifyError(
                f"stage lir: kernel {program.kernel}: instruction {pos} "
                f"({ins.text or ins.opcode}): {rule}"
            )
