"""Execution targets: one module per runner kind (cpu, sim, iree, npu)."""
