"""Action keys and fetch-or-run: the content-addressed side of a stage action.

The key of a stage action is the sha256 over everything that decides its
output bytes: the digests of its inputs, its resolved options, the machine
model, the digest of the stage code (with what it imports from Kiln), Kiln's
version and the versions of the libraries that can change bytes across
machines. Computed from files and metadata only: no numpy, no stages.
"""

from __future__ import annotations

import hashlib
import json
import sys
from functools import cache
from importlib import metadata

import kiln

# Libraries whose version can change a stage's bytes from one machine to another.
BYTE_DECIDING_LIBRARIES = ("numpy", "ml_dtypes", "msgpack")


@cache
def toolchain() -> dict[str, str]:
    """Kiln, Python and library versions, read from metadata without importing them."""
    versions = {"kiln": kiln.__version__, "python": sys.version.split()[0]}
    for name in BYTE_DECIDING_LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def action_key(
    *,
    inputs: dict[str, str],
    options,
    machine,
    code: str,
    extra: dict | None = None,
    tools: dict[str, str] | None = None,
) -> str:
    """sha256 (hex) of one action: input name -> digest, options, machine, code digest."""
    record = {
        "inputs": inputs,
        "options": options,
        "machine": machine,
        "code": code,
        "tools": tools if tools is not None else toolchain(),
        "extra": extra or {},
    }
    text = json.dumps(record, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()
