"""Each instance's record of its last chain: every stage's key and its artifact's digest.

Written after the artifacts, so a build killed between the two finds an
artifact whose digest is not the recorded one, and runs that stage again:
early cutoff never trusts a file the record does not vouch for. Kept in the
instance's out dir, beside the manifest; independent of the artifact cache
(which may be off, or emptied by ``kiln cache gc``).
"""

from __future__ import annotations

import json
import os

from kiln.driver import StageRecord
from kiln.fsutil import write_bytes_atomic

RECORD = ".kiln-chain.json"
FORMAT = 1


def encode(records: list[StageRecord]) -> bytes:
    doc = {
        "format": FORMAT,
        "stages": [
            {"name": r.name, "key": r.key, "digest": r.digest, "files": list(r.files)}
            for r in records
        ],
    }
    return json.dumps(doc, sort_keys=True).encode()


def decode(data: bytes) -> dict[str, StageRecord]:
    """Stage name -> record; empty for anything that is not a record of ours."""
    try:
        doc = json.loads(data)
        if doc.get("format") != FORMAT:
            return {}
        found = {}
        for s in doc["stages"]:
            files = tuple(str(f) for f in s.get("files", ()))
            if any(f.startswith("/") or ".." in f.split("/") for f in files):
                return {}  # a record never names a file outside its instance
            found[str(s["name"])] = StageRecord(
                str(s["name"]), str(s["key"]), str(s["digest"]), files
            )
        return found
    except Exception:  # damaged however (nesting past the stack too)
        return {}  # damaged: every stage runs again, which rewrites it


def read(out_dir: str) -> dict[str, StageRecord]:
    try:
        with open(os.path.join(out_dir, RECORD), "rb") as f:
            return decode(f.read())
    except OSError:
        return {}


def write(out_dir: str, records: list[StageRecord]) -> None:
    write_bytes_atomic(os.path.join(out_dir, RECORD), encode(records))
