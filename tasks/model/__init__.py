"""The project model: pipeline.yaml, its kernels and instances, their sources and digests.

The bottom layer of kiln.tasks: it knows neither doit nor how a chain runs.
"""
