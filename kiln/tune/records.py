"""Tuning records: ``tuning.jsonl``, one line per kernel instance, committed like a lock file.

A record is keyed by everything that decides whether its knobs still mean
what they meant when they were found: the traced graph's digest, the
shape set, the dtype, the machine model, the base stage options and the
digest of the tuned stages' code. A record whose key does not match the
current build is stale: it is ignored (and ``kiln status`` says so), never
applied. Lines are canonical JSON sorted by instance, so the file diffs
well and the same tuning gives the same bytes.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kiln.errors import KilnError, Location
from kiln.fsutil import write_bytes_atomic

KEY_FIELDS = ("graph", "shape_set", "dtype", "machine", "options", "compiler")


@dataclass(frozen=True)
class TuningKey:
    instance: str  # kernel.shape_set
    graph: str  # sha256 of graph.json
    shape_set: str
    dtype: str
    machine: str  # digest of the machine model
    options: str  # digest of the base options of the tuned stages
    compiler: str  # digest of the tuned stages' code

    def matches(self, record: TuningRecord) -> bool:
        return record.instance == self.instance and all(
            getattr(record, f) == getattr(self, f) for f in KEY_FIELDS
        )

    def stale_parts(self, record: TuningRecord) -> list[str]:
        """Which parts of the key changed since the record was made."""
        return [f for f in KEY_FIELDS if getattr(record, f) != getattr(self, f)]


@dataclass(frozen=True)
class TuningRecord:
    instance: str
    graph: str
    shape_set: str
    dtype: str
    machine: str
    options: str
    compiler: str
    knobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # stage -> {option: value}
    default_cycles: int = 0
    tuned_cycles: int = 0
    trials: int = 0
    rejected: int = 0
    strategy: str = ""
    seed: int = 0
    budget: int = 0
    # False: Ctrl-C stopped the search; its verified best is applied, but it is never
    # current for `kiln tune`, which searches again, and never replaces a finished record
    complete: bool = True

    @property
    def speedup(self) -> float:
        return self.default_cycles / self.tuned_cycles if self.tuned_cycles else 1.0

    def to_line(self) -> str:
        data = asdict(self)
        data["speedup"] = round(self.speedup, 4)
        if self.complete:  # finished records keep the bytes they always had
            del data["complete"]
        return json.dumps(data, sort_keys=True, separators=(",", ":"))


def read_records(path: str | os.PathLike) -> dict[str, TuningRecord]:
    """instance -> record; a missing file is empty, a damaged line is an error at its line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise KilnError(
            f"cannot read the tuning records: {exc}",
            location=Location(str(path)),
            hint="restore the file from version control, or delete it and run `kiln tune` again",
        ) from None
    records: dict[str, TuningRecord] = {}
    names = {f for f in TuningRecord.__dataclass_fields__}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            data.pop("speedup", None)
            if not isinstance(data, dict) or set(data) - names:
                raise ValueError(f"unexpected keys {sorted(set(data) - names)}")
            record = TuningRecord(**data)
            if not isinstance(record.knobs, dict):
                raise ValueError("'knobs' must be a mapping of stage -> options")
        except (ValueError, TypeError) as exc:
            raise KilnError(
                "a tuning record cannot be read",
                location=Location(str(path), number, 1, source=line[:200]),
                expected="one JSON object per line, as `kiln tune` writes them",
                found=str(exc),
                hint="restore the file from version control, or delete the line and "
                "run `kiln tune` again",
            ) from None
        records[record.instance] = record
    return records


def write_records(path: str | os.PathLike, records: dict[str, TuningRecord]) -> bool:
    """Write all records atomically, sorted by instance; True when the bytes changed."""
    text = "".join(records[name].to_line() + "\n" for name in sorted(records))
    return write_bytes_atomic(Path(path), text.encode())


_CACHE: dict[str, tuple[tuple[int, int, int], dict[str, TuningRecord]]] = {}


def cached_records(path: str) -> dict[str, TuningRecord]:
    """``read_records`` memoized per process on the file's (mtime, size, inode)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return {}
    stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
    hit = _CACHE.get(path)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    records = read_records(path)
    _CACHE[path] = (stamp, records)
    return records
