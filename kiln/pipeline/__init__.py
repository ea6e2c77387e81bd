"""pipeline.yaml: loading, validation against its JSON Schema, and the normalized model.

Importing this package is cheap: PyYAML and jsonschema are imported only
when a pipeline is actually parsed (not on a cache hit).
"""

from kiln.pipeline.load import BUILTIN_RUNNERS, load_pipeline, load_pipeline_cached
from kiln.pipeline.model import (
    DEFAULT_OUT_DIR,
    OUT_DIR_ENV,
    AppSpec,
    DumpSpec,
    KernelSpec,
    Pipeline,
    StageSpec,
    TargetSpec,
)
from kiln.pipeline.schema import SCHEMA_PATH, load_schema
from kiln.pipeline.yamlpos import SourceMap, did_you_mean

__all__ = [
    "BUILTIN_RUNNERS",
    "DEFAULT_OUT_DIR",
    "OUT_DIR_ENV",
    "SCHEMA_PATH",
    "AppSpec",
    "DumpSpec",
    "KernelSpec",
    "Pipeline",
    "SourceMap",
    "StageSpec",
    "TargetSpec",
    "did_you_mean",
    "load_pipeline",
    "load_pipeline_cached",
    "load_schema",
]
