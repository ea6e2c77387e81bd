"""The search space: the stage options a kernel instance can be tuned over.

A knob is one option of one stage with the values worth trying for this
graph on this machine. The stages' defaults stay the current rules; a
candidate is one value per knob, and the all-defaults candidate is always
tried first, so tuning can never choose something slower than the default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kiln.ir.graph import Graph

CONTRACTIONS = frozenset({"matmul", "conv2d"})
REDUCTIONS = frozenset({"sum", "mean", "max", "min", "prod"})


@dataclass(frozen=True, slots=True)
class Knob:
    """One stage option and the values the search may give it (the first is the default)."""

    stage: str
    option: str
    values: tuple[Any, ...]
    doc: str

    @property
    def name(self) -> str:
        return f"{self.stage}.{self.option}"


Candidate = tuple[int, ...]  # one index into each knob's values


def knobs_for(graph: Graph, machine: dict) -> tuple[Knob, ...]:
    """The knobs of ``graph`` on ``machine``, in a fixed order (the order decides ties)."""
    knobs: list[Knob] = []
    tile = [int(d) for d in machine.get("tensor", {}).get("tile", (32, 32, 32))]
    contraction = any(node.op in CONTRACTIONS for node in graph.nodes)
    if contraction:
        for option, base in zip(("tile_m", "tile_n", "tile_k"), tile, strict=True):
            knobs.append(
                Knob(
                    "visa",
                    option,
                    (0, *(base * f for f in (1, 2, 4, 8))),
                    "matmul tile along this dim (0: the default rule)",
                )
            )
        knobs.append(
            Knob("visa", "tile_order", ("mn", "nm"), "visit output tiles by rows or by columns")
        )
    lanes = int(machine.get("vector", {}).get("lanes", 64))
    sram = int(machine.get("sram_bytes", 1 << 20))
    vector = tuple(lanes * f for f in (1, 4, 16, 64, 256, 1024) if lanes * f * 4 * 8 <= sram)
    knobs.append(Knob("visa", "vector_tile", (0, *vector), "elements per vector tile"))
    knobs.append(Knob("visa", "fusion", (True, False), "fuse elementwise chains on tiles"))
    if any(node.op in REDUCTIONS for node in graph.nodes):
        knobs.append(Knob("visa", "reduce_split", (1, 2, 4), "partial accumulators per reduction"))
    knobs.append(Knob("lir", "double_buffer", (True, False), "alternate two SRAM slots"))
    knobs.append(
        Knob("schedule", "policy", ("critical-path", "in-order"), "list scheduling priority")
    )
    return tuple(knobs)


def default_candidate(knobs: tuple[Knob, ...]) -> Candidate:
    return (0,) * len(knobs)


def space_size(knobs: tuple[Knob, ...]) -> int:
    size = 1
    for knob in knobs:
        size *= len(knob.values)
    return size


def settings(knobs: tuple[Knob, ...], candidate: Candidate) -> dict[str, dict[str, Any]]:
    """stage -> {option: value} for the knobs a candidate moves off their default."""
    chosen: dict[str, dict[str, Any]] = {}
    for knob, index in zip(knobs, candidate, strict=True):
        if index:
            chosen.setdefault(knob.stage, {})[knob.option] = knob.values[index]
    return chosen
