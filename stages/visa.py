"""Stage 1: graph -> vISA (tiled program over virtual tile buffers).

Planning walks the graph once and puts every computing node into a group:
a fused group (an optional matmul/conv producer, a chain of same-shaped
elementwise nodes, an optional reduction at the end), a transpose, a copy
(materializing a view or a result) or a conv padding. Emission then tiles
each group's iteration space into boxes and unrolls it: loads of external
inputs, the chain on resident tiles, stores of the values needed elsewhere.
Broadcasts and contiguous reshapes are DRAM views (stride 0 on broadcast
axes), scalar constants are immediates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kiln.errors import ArtifactError, Location, VerifyError
from kiln.fsutil import write_bytes_atomic
from kiln.ir import visa
from kiln.ir.edf import gc_paused
from kiln.ir.graph import Graph
from kiln.options import option
from kiln.stages.visa_emit import EMIT, Emitter
from kiln.stages.visa_plan import (
    MAX_REDUCE_SPLIT,
    TILE_ORDERS,
    Planner,
    dram_homes,
    tile_sizes,
)

NAME = "visa"
INPUT = "graph.json"  # what the stage reads: the previous stage's ARTIFACT, checked at load
ARTIFACT = "kernel.visa"
# what the compiler driver may call beyond run/verify/serialize/read (kiln/driver.py)
CAPABILITIES = frozenset({"side_artifacts", "decode", "exact_round_trip"})
# vISA instruction -> graph node id, beside the artifact (see run_with_side_artifacts)
NODE_MAP = "kernel.visa.nodes.json"


@dataclass(frozen=True)
class Options:
    # The values each option accepts are declared here, so that pipeline.yaml's loader
    # refuses the others at their line; tile_sizes() checks them again for direct callers.
    tile_m: int = option(0, minimum=0)  # matmul rows per tile; 0: a multiple of the tensor tile
    tile_n: int = option(0, minimum=0)
    tile_k: int = option(0, minimum=0)
    vector_tile: int = option(0, minimum=0)  # elements per vector tile; 0: from lanes and SRAM
    fusion: bool = True  # run elementwise chains on resident tiles
    # visit a contraction's output tiles by rows (mn) or columns (nm)
    tile_order: str = option("mn", choices=TILE_ORDERS)
    # partial accumulators of a reduction longer than a tile
    reduce_split: int = option(1, minimum=1, maximum=MAX_REDUCE_SPLIT)


# -- stage protocol -----------------------------------------------------------------


def run(graph: Graph, options: Options, machine: dict) -> visa.Program:
    """Lower a traced graph to a tiled vISA program for ``machine``."""
    return run_with_side_artifacts(graph, options, machine)[0]


def run_with_side_artifacts(
    graph: Graph, options: Options, machine: dict
) -> tuple[visa.Program, dict[str, bytes]]:
    """``run``, plus ``NODE_MAP``: the graph node each instruction was emitted for.

    LIR instruction i and schedule slot i are vISA instruction i, so this one
    list maps every later stage back to the graph (and, through the trace
    stage's source map, to the kernel's lines).
    """
    with gc_paused():  # many small long-lived records: collector passes find nothing
        program, origins = _run(graph, options, machine)
    doc = {"kernel": program.kernel, "nodes": origins}
    return program, {NODE_MAP: json.dumps(doc, separators=(",", ":")).encode()}


def _run(graph: Graph, options: Options, machine: dict) -> tuple[visa.Program, list[int]]:
    tiles = tile_sizes(options, machine)
    plan = Planner(graph, options.fusion, tiles)
    tensors, home, pads = dram_homes(plan)
    emitter = Emitter(plan, tiles, home, pads)
    for group in plan.groups:
        subject = group.node or group.producer or (group.members[0] if group.members else None)
        emitter.current = subject.id if subject is not None else -1
        EMIT[group.kind](emitter, group)
    program = visa.Program(
        kernel=graph.name,
        bindings=tuple(graph.bindings),
        tensors=tuple(tensors),
        buffers=tuple(emitter.buffers.values()),
        instrs=tuple(emitter.instrs),
    )
    return program, emitter.origins


# decode(serialize(ir)) gives the next stage an IR it cannot tell from ``ir``: a chain on
# a Dask worker hands ``ir`` on as it is (tasks/execution/chain_worker.py)
EXACT_ROUND_TRIP = True


def serialize(program: visa.Program) -> bytes:
    return visa.print_program(program).encode()


def decode(data: bytes) -> visa.Program:
    """The program held by a vISA artifact's bytes: ``read`` without the file."""
    return visa.parse(data.decode())


def read(path: str | Path) -> visa.Program:
    """Parse a vISA text artifact (or a hand-edited dump)."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"cannot read vISA artifact: {exc}", Location(str(path))) from None
    try:
        return visa.parse(text)
    except visa.VisaParseError as exc:
        raise ArtifactError(
            f"malformed vISA at line {exc.line}",
            location=Location(str(path), exc.line, source=exc.source),
            expected=exc.expected,
            found=exc.found,
        ) from None


def verify(program: visa.Program, machine: dict) -> None:
    try:
        visa.verify(program)
    except visa.VisaError as exc:
        raise VerifyError(f"stage visa: kernel {program.kernel}: {exc}") from None


def _dump_text(program: visa.Program, path: str | Path, machine: dict) -> None:
    write_bytes_atomic(path, serialize(program))


DUMPS = {"visa": _dump_text}
