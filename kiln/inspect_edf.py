"""``kiln inspect FILE.edf``: a human-readable listing of an EDF kernel binary.

``render`` shows the header (with the checksum verdict), the section table,
the argument signature, the metadata and every instruction with its slot.
A file that fails any check of ``kiln.ir.edf.decode`` is an ArtifactError
naming the file and the check.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kiln.errors import ArtifactError, Location
from kiln.ir.edf import EdfFile, EdfFormatError, Layout, decode, read_layout


def load_edf(path: str | os.PathLike) -> EdfFile:
    """Read and decode ``path``; ArtifactError naming the file and the failed check."""
    return _load(path)[1]


def _load(path: str | os.PathLike) -> tuple[Layout, EdfFile]:
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ArtifactError(
            f"cannot read EDF file: {exc.strerror or exc}", location=Location(str(path))
        ) from None
    try:
        return read_layout(raw, str(path)), decode(raw, str(path))
    except EdfFormatError as exc:
        raise artifact_error(exc, path) from None


def artifact_error(exc: EdfFormatError, path: str | os.PathLike) -> ArtifactError:
    """The user-facing form of a decode failure: file, check, byte, expected/found."""
    where = f" at byte {exc.offset}" if exc.offset is not None else ""
    return ArtifactError(
        f"corrupt EDF file: {exc.check} check failed{where}: {exc.detail}",
        location=Location(str(path)),
        expected=None if exc.expected is None else str(exc.expected),
        found=None if exc.found is None else str(exc.found),
        hint=HINTS.get(exc.check, "rebuild it, or check how it was copied"),
    )


# Not every failed check means damage: rebuilding cannot help with another file type or
# with a file from a newer Kiln
NEWER = "written by a Kiln that knows a newer EDF format: read it with that Kiln, or rebuild it"
HINTS = {
    "magic": "kiln inspect reads EDF binaries: the edf stage's kernel.edf in the out dir",
    "version": NEWER,
    "flags": NEWER,
}


def render(path: str | os.PathLike) -> str:
    """The full listing of the EDF file at ``path``."""
    layout, edf = _load(path)
    sp = edf.scheduled
    program = sp.program
    out = [f"EDF file {path}", ""]
    out += _kv(
        "header",
        [
            ("magic", "KEDF"),
            ("version", str(layout.version)),
            ("flags", f"0x{layout.flags:04x}"),
            ("sections", str(len(layout.sections))),
            ("header size", f"{layout.header_size} bytes"),
            ("total size", f"{layout.total_size} bytes"),
            ("checksum", f"sha256 {layout.trailer.hex()} OK"),
        ],
    )
    out += _table(
        "sections",
        ("type", "name", "offset", "size", "sha256[:16]"),
        [
            (str(s.type), s.name, str(s.offset), str(s.size), s.digest.hex())
            for s in layout.sections
        ],
        right=(0, 2, 3),
    )
    units = ", ".join(f"{k} x{n}" for k, n in program.units)
    out += _kv(
        "signature",
        [
            ("kernel", program.kernel),
            ("machine", program.machine),
            ("units", units),
            ("sram", f"peak {program.sram_peak} of {program.sram_bytes} bytes"),
            ("dram", f"{program.dram_bytes} bytes of arguments"),
        ],
    )
    out += _table(
        "arguments",
        ("name", "role", "dtype", "shape", "dram offset", "nbytes"),
        [
            (
                a.name,
                a.role,
                a.dtype,
                "x".join(map(str, a.shape)) or "()",
                str(a.dram_offset),
                str(a.nbytes),
            )
            for a in program.args
        ],
        right=(4, 5),
    )
    out += [
        "metadata",
        *("  " + line for line in json.dumps(edf.meta, indent=2, sort_keys=True).splitlines()),
        "",
    ]
    rows = [
        (str(i.id), f"{s.start}-{s.end}", s.unit, i.text or i.opcode)
        for i, s in zip(program.instrs, sp.slots, strict=False)
    ]
    title = (
        f"instructions ({len(program.instrs)}, policy {sp.policy}, makespan {sp.makespan} cycles)"
    )
    out += _table(title, ("id", "cycles", "unit", "text"), rows, right=(0, 1))
    return "\n".join(out).rstrip() + "\n"


def _kv(title: str, rows: list[tuple[str, str]]) -> list[str]:
    width = max(len(k) for k, _ in rows)
    return [title, *(f"  {k:<{width}}  {v}" for k, v in rows), ""]


def _table(title: str, head: tuple, rows: list[tuple], right: tuple = ()) -> list[str]:
    widths = [max(len(r[c]) for r in (head, *rows)) for c in range(len(head))]

    def line(row):
        cells = [
            row[c].rjust(widths[c]) if c in right else row[c].ljust(widths[c])
            for c in range(len(head))
        ]
        return ("  " + "  ".join(cells)).rstrip()

    return [title, line(head), *(line(r) for r in rows), ""]
