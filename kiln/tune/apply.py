"""Applying tuning records inside a compile action.

The graph digest that keys a record exists only after the trace stage
has run, so the lookup happens in the action, not when tasks are made.
``tuning.jsonl`` is a file dependency of every tuned stage's task, so a
new or changed record reruns exactly those stages (and early cutoff stops
whatever did not change). Light on purpose: no numpy, no stages.
"""

from __future__ import annotations

import hashlib
from typing import Any

from kiln.tune.records import TuningKey, cached_records

# The stages whose options the tuner varies (see kiln.tune.space).
TUNED_STAGES = ("visa", "lir", "schedule")


def graph_digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def tuned_options(tuning: dict, stage: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with the matching record's knobs for ``stage`` on top (unchanged if none)."""
    records = cached_records(tuning["file"])
    record = records.get(tuning["key"]["instance"])
    if record is None:
        return options
    try:
        key = TuningKey(graph=graph_digest(tuning["graph"]), **tuning["key"])
    except OSError:
        return options
    if not key.matches(record):
        return options  # stale: `kiln status` says so; never applied
    return {**options, **record.knobs.get(stage, {})}
