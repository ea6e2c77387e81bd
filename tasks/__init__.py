"""pipeline.yaml -> doit tasks: discovery, the compile DAG, up-to-date checks.

The only package that knows doit. Modules here stay light to import: a
no-op build must not pay for numpy, jsonschema or the kernels themselves.
"""
