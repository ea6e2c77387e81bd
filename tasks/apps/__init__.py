"""Apps: plain Python programs that call kernels, run against a chosen target."""
