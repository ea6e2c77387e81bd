"""Machine models for the stage tests.

Copied from pipeline.yaml, so these tests pin the stages, not the example config.
"""

MACHINES = {
    "npu-v1": {
        "name": "npu-v1",
        "clock_mhz": 1000,
        "sram_bytes": 4194304,
        "units": {"dma": 2, "tensor": 1, "vector": 2},
        "dma": {"bytes_per_cycle": 64, "latency": 100},
        "tensor": {"tile": [32, 32, 32], "cycles_per_tile": 32},
        "vector": {
            "lanes": 64,
            "latency": {
                "default": 4,
                **{"exp": 8, "log": 8, "div": 8, "sqrt": 8, "rsqrt": 8, "tanh": 8},
                **{"sigmoid": 8, "gelu": 12},
            },
        },
    },
    "npu-tiny": {
        "name": "npu-tiny",
        "clock_mhz": 500,
        "sram_bytes": 65536,
        "units": {"dma": 1, "tensor": 1, "vector": 1},
        "dma": {"bytes_per_cycle": 16, "latency": 200},
        "tensor": {"tile": [16, 16, 16], "cycles_per_tile": 16},
        "vector": {"lanes": 16, "latency": {"default": 4}},
    },
}
