"""docs/pipeline.md documents exactly the keys that pipeline.schema.json defines."""

from __future__ import annotations

import re
from pathlib import Path

from kiln.pipeline import load_schema

DOC = Path(__file__).resolve().parents[2] / "docs" / "pipeline.md"
ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|")  # a reference table row: | `key.path` | ...


def _resolve(node: dict, defs: dict) -> dict:
    while "$ref" in node:
        node = {
            **defs[node["$ref"].removeprefix("#/$defs/")],
            **{k: v for k, v in node.items() if k != "$ref"},
        }
    return node


def schema_paths(node: dict, defs: dict, prefix: str = "") -> set[str]:
    """Every named key of the schema as a doc path: `kernels.<name>.dtype`, `stages[].name`."""
    node = _resolve(node, defs)
    paths: set[str] = set()
    for key, sub in node.get("properties", {}).items():
        path = f"{prefix}.{key}" if prefix else key
        paths.add(path)
        paths |= schema_paths(sub, defs, path)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        sub_paths = schema_paths(extra, defs, f"{prefix}.<name>")
        if sub_paths:  # a mapping of named entries with fields: document the entry too
            paths |= sub_paths | {f"{prefix}.<name>"}
    items = node.get("items")
    if isinstance(items, dict):
        paths |= schema_paths(items, defs, f"{prefix}[]")
    return paths


def doc_paths() -> set[str]:
    return {
        m.group(1)
        for line in DOC.read_text(encoding="utf-8").splitlines()
        if (m := ROW.match(line))
    }


def test_every_schema_key_is_documented() -> None:
    schema = load_schema()
    missing = schema_paths(schema, schema["$defs"]) - doc_paths()
    assert not missing, (
        f"keys in pipeline.schema.json but not in docs/pipeline.md: {sorted(missing)}"
    )


def test_every_documented_key_is_in_the_schema() -> None:
    schema = load_schema()
    stale = doc_paths() - schema_paths(schema, schema["$defs"])
    assert not stale, f"keys in docs/pipeline.md but not in pipeline.schema.json: {sorted(stale)}"


def test_schema_walk_sees_nested_keys() -> None:
    schema = load_schema()
    paths = schema_paths(schema, schema["$defs"])
    assert {
        "cache.check",
        "kernels.<name>.shapes",
        "stages[].module",
        "machines.<name>.vector.latency.default",
        "targets.<name>.tolerance.rtol",
    } <= paths
