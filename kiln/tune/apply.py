"""What tuning records apply to: the stages the tuner varies, and a graph's digest.

A record is keyed by the digest of the traced graph, which exists only
after the trace stage has run: the compiler driver applies a record inside
the chain (kiln/driver.py), never when tasks are made. Light on purpose:
no numpy, no stages.
"""

from __future__ import annotations

import hashlib

# The stages whose options the tuner varies (see kiln.tune.space).
TUNED_STAGES = ("visa", "lir", "schedule")


def graph_digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()
