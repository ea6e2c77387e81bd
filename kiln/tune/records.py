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
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = _record(json.loads(line))
        except ValueError as exc:
            key = exc.key if isinstance(exc, _KeyProblem) else None
            raise KilnError(
                "a tuning record cannot be read",
                location=Location(str(path), number, 1, key_path=key, source=line[:200]),
                expected="one JSON object per line, as `kiln tune` writes them",
                found=str(exc),
                hint="restore the file from version control, or delete the line and "
                "run `kiln tune` again",
            ) from None
        records[record.instance] = record
    return records


# The knobs a record may set, and their values: what kiln.tune.space.knobs_for can
# choose (kept light here: the build reads records, and must not import the stages).
# a tile or vector size far beyond any machine's SRAM is no value kiln tune could choose
MAX_SIZE = 1 << 24
_COUNT = (
    f"a whole number from 0 to {MAX_SIZE}",
    lambda v: type(v) is int and 0 <= v <= MAX_SIZE,
)
_BOOL = ("true or false", lambda v: type(v) is bool)
KNOB_VALUES: dict[str, dict[str, tuple[str, Any]]] = {
    "visa": {
        "tile_m": _COUNT,
        "tile_n": _COUNT,
        "tile_k": _COUNT,
        "tile_order": ("'mn' or 'nm'", lambda v: v in ("mn", "nm")),
        "vector_tile": _COUNT,
        "fusion": _BOOL,
        "reduce_split": ("a whole number from 1 to 8", lambda v: type(v) is int and 1 <= v <= 8),
    },
    "lir": {"double_buffer": _BOOL},
    "schedule": {"policy": ("'critical-path' or 'in-order'", lambda v: v in _POLICIES)},
}
_POLICIES = ("critical-path", "in-order")
# kiln.tune.search.STRATEGIES (kept light as KNOB_VALUES is; a test holds them equal)
STRATEGIES = ("grid", "random", "evolutionary")
_TEXT_FIELDS = ("instance", *KEY_FIELDS)
# every count a record has, and its least value: a makespan is never 0 cycles (the
# outputs are always stored), the default candidate is always the first trial, and
# --budget is at least 1
_COUNT_FIELDS = {
    "default_cycles": 1,
    "tuned_cycles": 1,
    "trials": 1,
    "rejected": 0,
    "seed": 0,
    "budget": 1,
}
# the keys of every record `kiln tune` writes (``complete`` only when it is false)
REQUIRED = ("instance", *KEY_FIELDS, "knobs", *_COUNT_FIELDS, "strategy", "speedup")


class _KeyProblem(ValueError):
    """What is wrong with one key of a record (``key``: its path, as ``knobs.visa.tile_m``)."""

    def __init__(self, key: str | None, problem: str):
        super().__init__(problem)
        self.key = key


def _record(data: Any) -> TuningRecord:
    """One line's record; a ValueError says in the user's words what is wrong with it."""
    if not isinstance(data, dict):
        raise ValueError(f"a JSON {type(data).__name__}, not an object")
    data = dict(data)
    fields = TuningRecord.__dataclass_fields__
    unknown = sorted(set(data) - set(fields) - {"speedup"})
    if unknown:
        raise _KeyProblem(unknown[0], f"unexpected keys {unknown}")
    missing = [f for f in REQUIRED if f not in data]
    if missing:
        raise _KeyProblem(missing[0], f"no {', '.join(map(repr, missing))}")
    for name in _TEXT_FIELDS:
        if not isinstance(data[name], str):
            raise _KeyProblem(name, f"{name!r} is {data[name]!r}, not a string")
    if data["strategy"] not in STRATEGIES:
        raise _KeyProblem(
            "strategy", f"'strategy' is {data['strategy']!r}, not one of {', '.join(STRATEGIES)}"
        )
    for name, least in _COUNT_FIELDS.items():
        value = data[name]
        if type(value) is not int or value < least:
            raise _KeyProblem(name, f"{name!r} is {value!r}, not a whole number, {least} or more")
    if "complete" in data and type(data["complete"]) is not bool:
        raise _KeyProblem("complete", f"'complete' is {data['complete']!r}, not true or false")
    _check_knobs(data["knobs"])
    _check_counts(data)
    speedup = data.pop("speedup")
    record = TuningRecord(**data)
    # as written: rounded to 4 places; NaN compares as no number at all
    if type(speedup) not in (int, float) or not abs(speedup - round(record.speedup, 4)) <= 1e-4:
        raise _KeyProblem(
            "speedup",
            f"'speedup' is {speedup!r}, not default_cycles / tuned_cycles "
            f"({record.default_cycles} / {record.tuned_cycles} = {record.speedup:.4f})",
        )
    return record


def _check_counts(data: dict) -> None:
    """The counts agree with each other as they do in every record `kiln tune` writes."""
    for name, other, why in (
        ("tuned_cycles", "default_cycles", "a record is never slower than the defaults"),
        ("trials", "budget", "a search stops at its budget"),
    ):
        if data[name] > data[other]:
            raise _KeyProblem(
                name, f"{name!r} is {data[name]}, more than {other!r} ({data[other]}): {why}"
            )
    if data["rejected"] >= data["trials"]:
        raise _KeyProblem(
            "rejected",
            f"'rejected' is {data['rejected']}, not fewer than 'trials' ({data['trials']}): "
            "the default candidate, always the first trial, is never rejected",
        )


def _check_knobs(knobs: Any) -> None:
    if not isinstance(knobs, dict):
        raise _KeyProblem("knobs", "'knobs' must be a mapping of stage -> options")
    for stage, options in knobs.items():
        allowed = KNOB_VALUES.get(stage)
        if allowed is None:
            raise _KeyProblem(
                f"knobs.{stage}",
                f"knobs of stage {stage!r}: kiln tune tunes only " + ", ".join(KNOB_VALUES),
            )
        if not isinstance(options, dict):
            raise _KeyProblem(
                f"knobs.{stage}", f"knobs of stage {stage!r} must be a mapping of option -> value"
            )
        for option, value in options.items():
            path = f"knobs.{stage}.{option}"
            if option not in allowed:
                raise _KeyProblem(
                    path,
                    f"knob {stage}.{option} is not one kiln tune sets; "
                    f"{stage} knobs: {', '.join(allowed)}",
                )
            wanted, ok = allowed[option]
            if not ok(value):
                found = f"knob {stage}.{option} is {json.dumps(value)}, not {wanted}"
                raise _KeyProblem(path, found)


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
