"""Kiln: a declarative build pipeline for compute kernels."""

__version__ = "0.1.0"
