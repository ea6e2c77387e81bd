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
from dataclasses import dataclass
from fractions import Fraction

from kiln.errors import StageError
from kiln.fsutil import read_artifact, write_bytes_atomic
from kiln.ir import visa
from kiln.ir.edf import gc_paused
from kiln.ir.lir import ArgSlot, Program
from kiln.ir.lir_table import TableBuilder
from kiln.ir.visa import ITEMSIZE, Imm, Tile, View
from kiln.stages.lir_deps import DepTracker, Ranges, compute_deps  # noqa: F401 (re-exported)
from kiln.stages.lir_verify import verify  # noqa: F401 (the stage's verify)

NAME = "lir"
INPUT = "kernel.visa"  # what the stage reads: the previous stage's ARTIFACT, checked at load
ARTIFACT = "kernel.lir"
# what the compiler driver may call beyond run/verify/serialize/read (kiln/driver.py)
CAPABILITIES = frozenset({"decode", "exact_round_trip"})
ALIGN = 64
_UNIT_OF = {spec.name: spec.unit for spec in visa.OPS.values()}


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


@dataclass
class _Scan:
    """What lowering needs to know of the whole program before it starts, from one pass."""

    span: dict[str, list[int]]  # buffer -> [first, last] instruction index
    defs: dict[str, int]  # buffer -> number of full definitions
    loaded: set[str]  # buffers some load writes
    ops: dict[str, None]  # opcodes in order of first use
    stores: list[View]  # every DRAM view written


def _scan(program: visa.Program) -> _Scan:
    span: dict[str, list[int]] = {}
    defs: dict[str, int] = {}
    loaded: set[str] = set()
    ops: dict[str, None] = {}
    stores: list[View] = []
    for index, ins in enumerate(program.instrs):
        ops[ins.op] = None
        dst = ins.dst
        for operand in (dst, *ins.srcs):
            if type(operand) is Tile:
                s = span.get(operand.buf)
                if s is None:
                    span[operand.buf] = [index, index]
                else:
                    s[1] = index
        if type(dst) is Tile:
            if not ins.accumulates:
                defs[dst.buf] = defs.get(dst.buf, 0) + 1
            if ins.op == "load":
                loaded.add(dst.buf)
        elif type(dst) is View:
            stores.append(dst)
    return _Scan(span, defs, loaded, ops, stores)


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


def _allocate(program: visa.Program, options: Options, machine: dict, scan: _Scan):
    """(addresses, slot sizes, double-buffered set); tries less double-buffering before failing."""
    capacity = int(machine["sram_bytes"])
    span, defs, loaded = scan.span, scan.defs, scan.loaded
    buffers = program.buffer_map()
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
    name = machine.get("name", "?")
    raise StageError(
        f"kernel {program.kernel}: tile %{failure.buf.name} needs {need} bytes of SRAM, "
        f"only {failure.largest} available (machine {name})",
        hint="reduce the visa stage's tile options (tile_m, tile_n, tile_k, vector_tile)",
        notes=[
            "live in SRAM then: "
            + (", ".join(f"%{n} ({b} bytes)" for n, b in failure.live) or "nothing")
        ],
        # the whole SRAM holds no such tile: one cause for every kernel built for the machine
        cause=f"machine {name}: {capacity} bytes of SRAM hold no tile" if need > capacity else None,
    )


# -- lowering ------------------------------------------------------------------------


def _units(program: visa.Program, machine: dict, ops: dict[str, None]) -> dict[str, int]:
    """The machine's unit counts; StageError for the first opcode (in program order) that
    is unknown or needs a unit the machine lacks."""
    units = {str(k): int(v) for k, v in machine.get("units", {}).items()}
    for op in ops:
        spec = visa.OPS.get(op)
        if spec is None:
            raise StageError(f"kernel {program.kernel}: unknown vISA opcode {op!r}")
        if units.get(spec.unit, 0) <= 0:
            raise StageError(
                f"kernel {program.kernel}: machine {machine.get('name', '?')} has no "
                f"{spec.unit} units, and the program needs one for {op}",
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


class _Latencies:
    """``_latency`` memoized on what it depends on: a large program repeats a few shapes."""

    def __init__(self, machine: dict) -> None:
        self.machine = machine
        self.memo: dict[tuple, int] = {}

    def __call__(self, ins: visa.Instr, kind: str, nbytes: int, elements: int) -> int:
        if kind == "dma":
            key: tuple = (kind, nbytes)
        elif kind == "tensor":
            key = (kind, ins.srcs[0].shape, ins.dst.shape[1])
        else:
            key = (kind, ins.op, elements)
        latency = self.memo.get(key)
        if latency is None:
            latency = self.memo[key] = _latency(ins, kind, nbytes, elements, self.machine)
        return latency


def run(program: visa.Program, options: Options, machine: dict) -> Program:
    """Bind units, allocate SRAM, lay out DRAM, compute latencies and dependencies."""
    with gc_paused():  # many small long-lived records: collector passes find nothing
        return _run(program, options, machine)


def _dram_layout(program: visa.Program) -> tuple[dict[str, ArgSlot], int]:
    slots: dict[str, ArgSlot] = {}
    cursor = 0
    for t in program.tensors:
        nbytes = t.size * ITEMSIZE[t.dtype]
        slots[t.name] = ArgSlot(t.name, t.role, t.shape, t.dtype, _align(cursor), nbytes)
        cursor = _align(cursor) + nbytes
    return slots, cursor


def _view_span(view: View, base: int, size: int, extents: dict) -> tuple[int, int]:
    """(first byte, bytes) of the DRAM range a view spans; extents memoizes shape/strides."""
    ext = extents.get((view.shape, view.strides))
    if ext is None:
        lo, hi = view.span()
        ext = extents[(view.shape, view.strides)] = hi - lo
    return base + view.offset * size, ext * size


def _run(program: visa.Program, options: Options, machine: dict) -> Program:
    scan = _scan(program)
    units = _units(program, machine, scan.ops)
    buffers = program.buffer_map()
    slots_dram, cursor = _dram_layout(program)
    addrs, slot_size, twice = _allocate(program, options, machine, scan)
    # per buffer: (address of copy 0, address of copy 1, itemsize, dtype)
    bufs = {
        name: (
            a,
            a + slot_size[name] * (name in twice),
            ITEMSIZE[buffers[name].dtype],
            buffers[name].dtype,
        )
        for name, a in addrs.items()
    }
    # per tensor: (DRAM base, itemsize, dtype)
    views = {
        t.name: (slots_dram[t.name].dram_offset, ITEMSIZE[t.dtype], t.dtype)
        for t in program.tensors
    }
    extents: dict = {}
    # every DRAM range the program writes, up front: reads of anything else (the inputs)
    # need no dependency tracking
    written: dict[str, list[tuple[int, int]]] = {"dram": []}
    for view in scan.stores:
        base, size, _ = views[view.tensor]
        addr, nbytes = _view_span(view, base, size, extents)
        if nbytes > 0:
            written["dram"].append((addr, addr + nbytes))
    deps = DepTracker(Ranges(written), ("dram",))
    version: dict[str, int] = {}
    busy = {kind: [0] * count for kind, count in units.items()}
    names = {kind: [f"{kind}{u}" for u in range(count)] for kind, count in units.items()}
    latency_of = _Latencies(machine)
    table = TableBuilder()
    lines = visa.instr_lines(program)

    def operand(o) -> tuple[tuple, tuple | None, int]:
        """(encoding in args, (space, addr, nbytes) accessed or None, elements)."""
        if type(o) is Tile:
            addr0, addr1, item, dtype = bufs[o.buf]
            addr = addr1 if version.get(o.buf, 0) % 2 else addr0
            n = math.prod(o.shape)
            return ("sram", addr, dtype, o.shape), ("sram", addr, n * item), n
        if type(o) is View:
            base, size, dtype = views[o.tensor]
            lo = _view_span(o, base, size, extents)
            enc = ("dram", base + o.offset * size, dtype, o.shape, o.strides)
            return enc, ("dram", *lo), math.prod(o.shape)
        assert isinstance(o, Imm)
        return ("imm", o.value, o.dtype), None, 0

    add, track = table.add, deps.add
    for index, ins in enumerate(program.instrs):
        op = ins.op
        kind = _UNIT_OF[op]
        encs = []
        reads = []
        elements = 1
        for s in ins.srcs:
            enc, a, k = operand(s)
            encs.append(enc)
            if a is not None:
                reads.append(a)
            if k > elements:
                elements = k
        dst = ins.dst
        if ins.attrs and ins.accumulates:  # most instructions have no attributes
            reads.append(operand(dst)[1])
        elif type(dst) is Tile:
            version[dst.buf] = version.get(dst.buf, -1) + 1
        enc, access, k = operand(dst)
        if k > elements:
            elements = k
        if len(reads) > 1:
            reads = list(dict.fromkeys(reads))
        moved = access[2] if kind == "dma" else 0
        touched = moved or sum(a[2] for a in reads) + access[2]
        latency = latency_of(ins, kind, touched, elements)
        loads = busy[kind]
        unit = loads.index(min(loads))  # least loaded, lowest number on ties
        loads[unit] += latency
        args = [("dst", enc), ("srcs", tuple(encs))]
        if ins.attrs:  # sorted by key, as the instruction's args always are
            args = sorted({**dict(args), **dict(ins.attrs)}.items())
        writes = (access,)
        add(
            index,
            names[kind][unit],
            op,
            reads,
            writes,
            touched,
            latency,
            track(reads, writes),
            args,
            lines[index],
        )
    peak = max([addrs[b] + slot_size[b] * (2 if b in twice else 1) for b in addrs] + [0])
    return Program(
        kernel=program.kernel,
        machine=str(machine.get("name", "")),
        units=tuple(sorted(units.items())),
        args=tuple(slots_dram.values()),
        instrs=table.finish(),
        sram_bytes=int(machine["sram_bytes"]),
        sram_peak=peak,
        dram_bytes=_align(cursor),
    )


# -- stage protocol --------------------------------------------------------------------


# decode(serialize(ir)) gives the next stage an IR it cannot tell from ``ir``: a chain on
# a Dask worker hands ``ir`` on as it is (tasks/execution/chain_worker.py)
EXACT_ROUND_TRIP = True


def serialize(program: Program) -> bytes:
    return program.to_msgpack()


def decode(data: bytes) -> Program:
    """The program held by ``kernel.lir``'s bytes: ``read`` without the file."""
    return Program.from_msgpack(data)


def read(path: str | os.PathLike) -> Program:
    """Load ``kernel.lir``; ArtifactError naming the file if it is missing or corrupt."""
    return read_artifact(path, "LIR artifact", decode)


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
