"""Stage 4: pack a ScheduledProgram into an EDF kernel binary (format: docs/edf.md).

``run`` is pure: the metadata holds only what follows from its inputs
(kernel, machine model, policy, compiler version, program hash), never a
time, a path or a host, so the same input gives the same bytes anywhere.
The tasks layer may add source/graph hashes with ``EdfFile.with_metadata``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import kiln
from kiln.errors import VerifyError
from kiln.fsutil import write_bytes_atomic
from kiln.inspect_edf import load_edf
from kiln.ir.edf import EdfFile, encode, gc_paused
from kiln.ir.lir import ScheduledProgram
from kiln.stages.schedule import raise_violations
from kiln.summary import format_summary, summarize

NAME = "edf"
INPUT = "kernel.sched"  # what the stage reads: the previous stage's ARTIFACT, checked at load
ARTIFACT = "kernel.edf"
# what the compiler driver may call beyond run/verify/serialize/read (kiln/driver.py)
CAPABILITIES = frozenset({"metadata", "exact_round_trip"})


@dataclass(frozen=True)
class Options:
    """The EDF stage takes no options."""


def compiler_version() -> str:
    return getattr(kiln, "__version__", None) or "0.1.0"


def build_metadata(sp: ScheduledProgram, machine: dict, extra: dict | None = None) -> dict:
    """The METADATA section's object: deterministic facts about the build, plus ``extra``."""
    model = {k: v for k, v in machine.items() if k != "name"}
    meta = {
        "kernel": sp.program.kernel,
        "machine": {"name": machine.get("name", sp.program.machine), "model": model},
        "policy": sp.policy,
        "compiler": {"name": "kiln", "version": compiler_version()},
        "hashes": {"program_sha256": sp.program.key},  # sha256 of its msgpack, computed once
        "instructions": len(sp.program.instrs),
        "makespan_cycles": sp.makespan,
    }
    for key, value in (extra or {}).items():
        if isinstance(value, dict) and isinstance(meta.get(key), dict):
            meta[key] = {**meta[key], **value}
        else:
            meta[key] = value
    return meta


def run(sp: ScheduledProgram, options: Options, machine: dict) -> EdfFile:
    with gc_paused():
        return EdfFile(sp, json.dumps(build_metadata(sp, machine)))


# decode(serialize(ir)) gives the next stage an IR it cannot tell from ``ir``: a chain on
# a Dask worker hands ``ir`` on as it is (tasks/execution/chain_worker.py)
EXACT_ROUND_TRIP = True


def serialize(edf: EdfFile) -> bytes:
    return encode(edf)


def read(path: str | os.PathLike) -> EdfFile:
    """Decode an EDF file; ArtifactError naming the file and the failed check."""
    return load_edf(path)


def verify(edf: EdfFile, machine: dict) -> None:
    """The schedule rules again, plus metadata that agrees with the program it describes."""
    sp = edf.scheduled
    raise_violations(sp, NAME)
    meta = edf.meta
    want = sp.program.key
    checks = [
        ("metadata-program-hash", meta.get("hashes", {}).get("program_sha256"), want),
        ("metadata-kernel", meta.get("kernel"), sp.program.kernel),
        ("metadata-policy", meta.get("policy"), sp.policy),
    ]
    for rule, found, expected in checks:
        if found != expected:
            raise VerifyError(
                f"stage {NAME!r}: metadata disagrees with the program [rule {rule}]",
                expected=str(expected),
                found=str(found),
            )


def _dump_summary(edf: EdfFile, path: str | os.PathLike, machine: dict) -> None:
    """Write DIR/summary.json (canonical) and DIR/summary.txt."""
    d = summarize(edf.scheduled, machine)
    out = Path(path)
    write_bytes_atomic(
        out / "summary.json", (json.dumps(d, sort_keys=True, indent=2) + "\n").encode()
    )
    write_bytes_atomic(out / "summary.txt", format_summary(d).encode())


DUMPS = {"summary": _dump_summary}
