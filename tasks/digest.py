"""Config fingerprints for up-to-date checks, computed once per distinct value.

Each stage task's ``config_changed`` is a digest of its parts (stage
options, machine model, Kiln version, the stage module's source, the
kernel's trace request, the dumps asked for). The parts' own digests are
saved with the task so ``kiln status`` can say which one changed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from functools import lru_cache


def digest_json(value) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@lru_cache(maxsize=None)
def module_source_digest(module: str) -> str:
    """sha256 of a stage module's source: a compiler change invalidates what it must."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        return "missing"
    with open(spec.origin, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def combine(parts: dict[str, str]) -> str:
    return "|".join(f"{k}={parts[k]}" for k in sorted(parts))
