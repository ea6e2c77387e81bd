"""Stage 2: vISA -> LIR: units, SRAM addresses, DRAM layout, latencies, dependencies.

One vISA instruction becomes one LIR instruction. DMA/tensor/vector work is
bound to the least-loaded unit instance of its kind. Tile buffers get SRAM
addresses from a liveness-based first-fit allocator (64-byte aligned);
buffers that are defined again and again (loop tiles) get two alternating
slots when that fits, so the next tile's load overlaps the current compute.
Dependencies come from the byte ranges each instruction reads and writes,
through an interval map: RAW on the last writer, WAW on the last writer,
WAR on the readers since then.
"""

from __future__ import annotations

import json
import math
import os
from bisect import bisect_right
from dataclasses import dataclass
from fractions import Fraction

from kiln.errors import StageError, VerifyError
from kiln.fsutil import read_artifact, write_bytes_atomic
from kiln.ir import visa
from kiln.ir.edf import gc_paused
from kiln.ir.lir import DEP_KINDS, Access, ArgSlot, Dep, Instr, Program, unit_kind
from kiln.ir.visa import ITEMSIZE, Imm, Tile, View

NAME = "lir"
INPUT = "kernel.visa"  # what the stage reads: the previous stage's ARTIFACT, checked at load
ARTIFACT = "kernel.lir"
# what the compiler driver may call beyond run/verify/serialize/read (kiln/driver.py)
CAPABILITIES = frozenset({"decode", "exact_round_trip"})
ALIGN = 64


@dataclass(frozen=True)
class Options:
    double_buffer: bool = True  # two alternating SRAM slots for re-defined tile buffers


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


# -- SRAM allocation ---------------------------------------------------------------


@dataclass(frozen=True)
class _Live:
    name: str
    first: int
    last: int
    slot: int  # bytes per copy (aligned)
    copies: int  # 1, or 2 when double-buffered


class _NoFit(Exception):
    def __init__(self, buf: _Live, largest: int, live: list[tuple[str, int]]):
        self.buf = buf
        self.largest = largest
        self.live = live  # (buffer, bytes) allocated at that point


def _liveness(program: visa.Program) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Buffer -> [first, last] instruction index, and buffer -> number of full definitions."""
    span: dict[str, list[int]] = {}
    defs: dict[str, int] = {}
    for index, ins in enumerate(program.instrs):
        for operand in (ins.dst, *ins.srcs):
            if isinstance(operand, Tile):
                s = span.setdefault(operand.buf, [index, index])
                s[1] = index
        if isinstance(ins.dst, Tile) and not ins.accumulates:
            defs[ins.dst.buf] = defs.get(ins.dst.buf, 0) + 1
    return span, defs


def _first_fit(lives: list[_Live], capacity: int) -> dict[str, int]:
    """Base address per buffer; raises _NoFit with the first buffer that does not fit."""
    active: list[tuple[int, int, int, str]] = []  # (addr, end, last, name), sorted by addr
    addrs: dict[str, int] = {}
    for live in sorted(lives, key=lambda b: (b.first, b.last, b.name)):
        active = [a for a in active if a[2] >= live.first]
        size = live.slot * live.copies
        cursor, placed, largest = 0, None, 0
        for addr, end, _, _ in active:
            if addr - cursor >= size:
                placed = cursor
                break
            largest = max(largest, addr - cursor)
            cursor = max(cursor, end)
        if placed is None:
            largest = max(largest, capacity - cursor)
            if cursor + size > capacity:
                raise _NoFit(live, max(largest, 0), [(a[3], a[1] - a[0]) for a in active])
            placed = cursor
        addrs[live.name] = placed
        active.append((placed, placed + size, live.last, live.name))
        active.sort()
    return addrs


def _allocate(program: visa.Program, options: Options, machine: dict):
    """(addresses, slot sizes, double-buffered set); tries less double-buffering before failing."""
    capacity = int(machine["sram_bytes"])
    span, defs = _liveness(program)
    buffers = program.buffer_map()
    loaded = {i.dst.buf for i in program.instrs if i.op == "load"}
    multi = [b for b in span if defs.get(b, 0) > 1]
    tiers = [multi, [b for b in multi if b in loaded], []] if options.double_buffer else [[]]
    failure = None
    for doubled in tiers:
        twice = set(doubled)
        lives = []
        for name, (first, last) in span.items():
            if name not in buffers:
                raise StageError(f"kernel {program.kernel}: buffer %{name} is not declared")
            slot = _align(buffers[name].nbytes)
            lives.append(_Live(name, first, last, slot, 2 if name in twice else 1))
        try:
            addrs = _first_fit(lives, capacity)
        except _NoFit as exc:
            failure = exc  # the last tier (least double-buffering) is the one to report
            continue
        return addrs, {b.name: b.slot for b in lives}, twice
    need = failure.buf.slot
    raise StageError(
        f"kernel {program.kernel}: tile %{failure.buf.name} needs {need} bytes of SRAM, "
        f"only {failure.largest} available (machine {machine.get('name', '?')})",
        hint="reduce the visa stage's tile options (tile_m, tile_n, tile_k, vector_tile)",
        notes=[
            "live in SRAM then: "
            + (", ".join(f"%{n} ({b} bytes)" for n, b in failure.live) or "nothing")
        ],
    )


# -- dependencies --------------------------------------------------------------------


class _IntervalMap:
    """Byte segments of one memory space -> (last writer, readers since that write)."""

    def __init__(self) -> None:
        self.starts: list[int] = [0]
        self.state: list[tuple[int | None, list[int]]] = [(None, [])]

    def _split(self, x: int) -> int:
        i = bisect_right(self.starts, x) - 1
        if self.starts[i] != x:
            writer, readers = self.state[i]
            i += 1
            self.starts.insert(i, x)
            self.state.insert(i, (writer, list(readers)))
        return i

    def read(self, a: Access, me: int, raw: set[int]) -> None:
        lo, hi = self._split(a.addr), self._split(a.end)
        for writer, readers in self.state[lo:hi]:
            if writer is not None:
                raw.add(writer)
            readers.append(me)

    def write(self, a: Access, me: int, waw: set[int], war: set[int]) -> None:
        lo, hi = self._split(a.addr), self._split(a.end)
        for writer, readers in self.state[lo:hi]:
            if writer is not None and writer != me:
                waw.add(writer)
            war.update(r for r in readers if r != me)
        del self.starts[lo + 1 : hi]
        del self.state[lo + 1 : hi]
        self.state[lo] = (me, [])


class _Ranges:
    """Merged byte ranges per memory space, for "does anything ever write here?"."""

    def __init__(self, ranges: dict[str, list[tuple[int, int]]]):
        self.starts: dict[str, list[int]] = {}
        self.ends: dict[str, list[int]] = {}
        for space, spans in ranges.items():
            merged: list[list[int]] = []
            for lo, hi in sorted(spans):
                if merged and lo <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], hi)
                else:
                    merged.append([lo, hi])
            self.starts[space] = [lo for lo, _ in merged]
            self.ends[space] = [hi for _, hi in merged]

    def overlaps(self, a: Access) -> bool:
        starts = self.starts.get(a.space)
        if not starts:
            return False
        i = bisect_right(starts, a.end - 1) - 1
        return i >= 0 and self.ends[a.space][i] > a.addr


def _written_ranges(accesses) -> _Ranges:
    spans: dict[str, list[tuple[int, int]]] = {}
    for _, writes in accesses:
        for w in writes:
            if w.nbytes > 0:
                spans.setdefault(w.space, []).append((w.addr, w.end))
    return _Ranges(spans)


def compute_deps(
    accesses: list[tuple[tuple[Access, ...], tuple[Access, ...]]],
) -> list[tuple[Dep, ...]]:
    """Per instruction (reads, writes): its deps, one per source (raw > waw > war), by source."""
    maps: dict[str, _IntervalMap] = {}
    written = _written_ranges(accesses)
    result = []
    for me, (reads, writes) in enumerate(accesses):
        raw: set[int] = set()
        waw: set[int] = set()
        war: set[int] = set()
        for a in reads:
            # A range nothing ever writes (a kernel input) can have no dependency at all;
            # skipping it keeps wide strided input spans out of the interval map.
            if a.nbytes > 0 and written.overlaps(a):
                maps.setdefault(a.space, _IntervalMap()).read(a, me, raw)
        for a in writes:
            if a.nbytes > 0:
                maps.setdefault(a.space, _IntervalMap()).write(a, me, waw, war)
        kinds = {src: "war" for src in war}
        kinds.update({src: "waw" for src in waw})
        kinds.update({src: "raw" for src in raw})
        kinds.pop(me, None)
        result.append(tuple(Dep(src, kinds[src]) for src in sorted(kinds)))
    return result


# -- lowering ------------------------------------------------------------------------


def _units(program: visa.Program, machine: dict) -> dict[str, int]:
    units = {str(k): int(v) for k, v in machine.get("units", {}).items()}
    for ins in program.instrs:
        spec = visa.OPS.get(ins.op)
        if spec is None:
            raise StageError(f"kernel {program.kernel}: unknown vISA opcode {ins.op!r}")
        if units.get(spec.unit, 0) <= 0:
            raise StageError(
                f"kernel {program.kernel}: machine {machine.get('name', '?')} has no "
                f"{spec.unit} units, and the program needs one for {ins.op}",
                hint=f"give the machine model a {spec.unit} unit under `units:`",
            )
    return units


def _latency(ins: visa.Instr, kind: str, nbytes: int, elements: int, machine: dict) -> int:
    if kind == "dma":
        dma = machine["dma"]
        rate = dma["bytes_per_cycle"]
        if isinstance(rate, int):  # the usual case, once per DMA instruction: integers only
            return int(dma["latency"]) - (-nbytes // rate)
        # a fractional rate (0.5, 1.5) exactly as written: int() made 0.5 a division by 0
        return int(dma["latency"]) + math.ceil(nbytes / Fraction(str(rate)))
    if kind == "tensor":
        tm, tn, tk = (int(d) for d in machine["tensor"]["tile"])
        (m, k), n = ins.srcs[0].shape, ins.dst.shape[1]
        tiles = math.ceil(m / tm) * math.ceil(n / tn) * math.ceil(k / tk)
        return max(1, int(machine["tensor"]["cycles_per_tile"]) * tiles)
    vec = machine["vector"]
    table = vec.get("latency", {})
    base = table.get(ins.op, table.get("default", 1))
    return max(1, int(base) + math.ceil(elements / int(vec["lanes"])))


def run(program: visa.Program, options: Options, machine: dict) -> Program:
    """Bind units, allocate SRAM, lay out DRAM, compute latencies and dependencies."""
    with gc_paused():  # many small long-lived records: collector passes find nothing
        return _run(program, options, machine)


def _run(program: visa.Program, options: Options, machine: dict) -> Program:
    units = _units(program, machine)
    tensors = program.tensor_map()
    buffers = program.buffer_map()
    slots_dram: dict[str, ArgSlot] = {}
    cursor = 0
    for t in program.tensors:
        nbytes = t.size * ITEMSIZE[t.dtype]
        slots_dram[t.name] = ArgSlot(t.name, t.role, t.shape, t.dtype, _align(cursor), nbytes)
        cursor = _align(cursor) + nbytes
    addrs, slot_size, twice = _allocate(program, options, machine)
    version: dict[str, int] = {}
    busy = {kind: [0] * count for kind, count in units.items()}

    def tile(t: Tile) -> tuple[tuple, Access]:
        buf = buffers[t.buf]
        addr = addrs[t.buf] + (version.get(t.buf, 0) % 2) * slot_size[t.buf] * (t.buf in twice)
        nbytes = t.size * ITEMSIZE[buf.dtype]
        return ("sram", addr, buf.dtype, t.shape), Access("sram", addr, nbytes)

    def operand(o) -> tuple[tuple, Access | None]:
        if isinstance(o, Tile):
            return tile(o)
        if isinstance(o, View):
            t = tensors[o.tensor]
            size = ITEMSIZE[t.dtype]
            base = slots_dram[o.tensor].dram_offset
            lo, hi = o.span()
            enc = ("dram", base + o.offset * size, t.dtype, o.shape, o.strides)
            return enc, Access("dram", base + lo * size, (hi - lo) * size)
        assert isinstance(o, Imm)
        return ("imm", o.value, o.dtype), None

    staged = []
    for ins in program.instrs:
        spec = visa.OPS[ins.op]
        srcs = [operand(s) for s in ins.srcs]
        reads = [a for _, a in srcs if a is not None]
        if ins.accumulates:
            reads.append(operand(ins.dst)[1])
        elif isinstance(ins.dst, Tile):
            version[ins.dst.buf] = version.get(ins.dst.buf, -1) + 1
        dst, written = operand(ins.dst)
        reads = tuple(dict.fromkeys(reads))
        moved = written.nbytes if spec.unit == "dma" else 0
        touched = moved or sum(a.nbytes for a in reads) + written.nbytes
        elements = max([s.size for s in (ins.dst, *ins.srcs) if not isinstance(s, Imm)] + [1])
        latency = _latency(ins, spec.unit, touched, elements, machine)
        loads = busy[spec.unit]
        unit = min(range(len(loads)), key=lambda u: (loads[u], u))
        loads[unit] += latency
        args = {"dst": dst, "srcs": tuple(e for e, _ in srcs), **dict(ins.attrs)}
        staged.append((f"{spec.unit}{unit}", ins, reads, (written,), touched, latency, args))
    deps = compute_deps([(s[2], s[3]) for s in staged])
    instrs = tuple(
        Instr(
            id=i,
            unit=unit,
            opcode=ins.op,
            reads=reads,
            writes=writes,
            nbytes=nbytes,
            latency=latency,
            deps=deps[i],
            args=tuple(sorted(args.items())),
            text=visa.format_instr(ins),
        )
        for i, (unit, ins, reads, writes, nbytes, latency, args) in enumerate(staged)
    )
    peak = max([addrs[b] + slot_size[b] * (2 if b in twice else 1) for b in addrs] + [0])
    return Program(
        kernel=program.kernel,
        machine=str(machine.get("name", "")),
        units=tuple(sorted(units.items())),
        args=tuple(slots_dram.values()),
        instrs=instrs,
        sram_bytes=int(machine["sram_bytes"]),
        sram_peak=peak,
        dram_bytes=_align(cursor),
    )


# -- stage protocol --------------------------------------------------------------------


# decode(serialize(ir)) gives the next stage an IR it cannot tell from ``ir``: a chain on
# a Dask worker hands ``ir`` on as it is (tasks/chain_worker.py; tests/tasks/test_chain_worker.py)
EXACT_ROUND_TRIP = True


def serialize(program: Program) -> bytes:
    return program.to_msgpack()


def decode(data: bytes) -> Program:
    """The program held by ``kernel.lir``'s bytes: ``read`` without the file."""
    return Program.from_msgpack(data)


def read(path: str | os.PathLike) -> Program:
    """Load ``kernel.lir``; ArtifactError naming the file if it is missing or corrupt."""
    return read_artifact(path, "LIR artifact", decode)


_UNIT_OF = {spec.name: spec.unit for spec in visa.OPS.values()}


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


def verify(program: Program, machine: dict) -> None:
    """VerifyError naming the stage, the instruction and the first rule it breaks."""
    units = {str(k): int(v) for k, v in machine.get("units", {}).items()}
    if program.sram_peak > program.sram_bytes:
        raise VerifyError(f"stage lir: sram_peak {program.sram_peak} exceeds SRAM")
    if program.sram_bytes > int(machine["sram_bytes"]):
        raise VerifyError(f"stage lir: program assumes {program.sram_bytes} bytes of SRAM")
    for pos, ins in enumerate(program.instrs):
        rule = _check_instr(program, pos, ins, units)
        if rule is not None:
            raise VerifyError(
                f"stage lir: kernel {program.kernel}: instruction {pos} "
                f"({ins.text or ins.opcode}): {rule}"
            )


def graph_json(program: Program) -> bytes:
    """Instructions as nodes, dependencies as typed edges: for a graph viewer."""
    data = {
        "format": "kiln.lir-graph/1",
        "kernel": program.kernel,
        "machine": program.machine,
        "nodes": [
            {
                "id": i.id,
                "unit": i.unit,
                "opcode": i.opcode,
                "bytes": i.nbytes,
                "latency": i.latency,
                "text": i.text,
            }
            for i in program.instrs
        ],
        "edges": [
            {"src": d.src, "dst": i.id, "kind": d.kind} for i in program.instrs for d in i.deps
        ],
    }
    return (json.dumps(data, sort_keys=True, indent=1) + "\n").encode()


def _dump_ir(program: Program, path: str | os.PathLike, machine: dict) -> None:
    write_bytes_atomic(path, serialize(program))


def _dump_graph(program: Program, path: str | os.PathLike, machine: dict) -> None:
    write_bytes_atomic(path, graph_json(program))


DUMPS = {"ir": _dump_ir, "graph": _dump_graph}
