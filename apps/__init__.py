"""Example programs that call kernels: `kiln run mlp`, `kiln run attention`."""
