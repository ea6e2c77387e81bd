"""`doit compile` in the repo root: hands pipeline.yaml's tasks to plain doit."""

from kiln.tasks.dag.loader import dodo_namespace

globals().update(dodo_namespace())
