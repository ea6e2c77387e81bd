"""Small traced graphs and machine models shared by the tuning tests."""

from __future__ import annotations

from kiln.stages import trace
from kiln.tune.evaluate import Context

MACHINE = {
    "name": "npu-v1",
    "clock_mhz": 1000,
    "sram_bytes": 4194304,
    "units": {"dma": 2, "tensor": 1, "vector": 2},
    "dma": {"bytes_per_cycle": 64, "latency": 100},
    "tensor": {"tile": [32, 32, 32], "cycles_per_tile": 32},
    "vector": {"lanes": 64, "latency": {"default": 4, "exp": 8}},
}


def traced(function: str, module: str, **dims: int):
    request = trace.TraceRequest(
        module=module,
        function=function,
        bindings=tuple(sorted(dims.items())),
        dtypes=(),
        default_dtype="f32",
    )
    return trace.run(request, trace.Options(), MACHINE)


def context(graph) -> Context:
    stages = (
        ("visa", "kiln.stages.visa", {"fusion": True}),
        ("lir", "kiln.stages.lir", {}),
        ("schedule", "kiln.stages.schedule", {"policy": "critical-path"}),
    )
    return Context(graph, MACHINE, stages)
