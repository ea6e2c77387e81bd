"""``kiln inspect FILE.edf``: a human-readable listing of an EDF kernel binary.

``render`` shows the header (with the checksum verdict), the section table,
the argument signature, the metadata and every instruction with its slot.
A file that fails any check of ``kiln.ir.edf.decode`` is an ArtifactError
naming the file and the check.
"""

from __future__ import annotations

import json
import os
import stat

from kiln.errors import ArtifactError, Location
from kiln.ir.edf import (
    HEADER,
    TRAILER_SIZE,
    EdfFile,
    EdfFormatError,
    Layout,
    claimed_size,
    decode,
    read_layout,
    size_mismatch,
)


def load_edf(path: str | os.PathLike) -> EdfFile:
    """Read and decode ``path``; ArtifactError naming the file and the failed check."""
    return _load(path)[1]


def _load(path: str | os.PathLike) -> tuple[Layout, EdfFile]:
    raw = read_edf_bytes(path)
    try:
        return read_layout(raw, str(path)), decode(raw, str(path))
    except EdfFormatError as exc:
        raise artifact_error(exc, path) from None


# Far above any kernel's binary (100k instructions take a few MB): a larger file is not one
MAX_BYTES = 1 << 30


def read_edf_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of the EDF file at ``path``, never more than its header says it has.

    A device, FIFO or directory is refused before reading (``/dev/zero`` has
    no end; a FIFO with no writer would block), and so is a file larger than
    MAX_BYTES; a file that is no EDF is read only as far as its header.
    """
    try:
        # O_NONBLOCK: a FIFO put in the file's place after a stat still cannot block the open
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise _unreadable(path, exc) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ArtifactError(
            f"cannot read EDF file: {path} is not a regular file",
            location=Location(str(path)),
            expected="an EDF file (a regular file)",
            found=_kind(info.st_mode),
            hint="give the edf stage's kernel.edf in the out dir",
        )
    size = info.st_size
    with os.fdopen(fd, "rb") as f:
        try:
            head = f.read(HEADER.size)
            claimed = claimed_size(head)
            if claimed is None:  # no EDF header: its first bytes say which check fails
                return head + f.read(TRAILER_SIZE)
            if claimed != size:
                raise artifact_error(size_mismatch(claimed, size, str(path)), path)
            if size > MAX_BYTES:
                raise ArtifactError(
                    f"cannot read EDF file: {size} bytes is larger than any kernel binary",
                    location=Location(str(path)),
                    expected=f"at most {MAX_BYTES} bytes",
                    found=f"{size} bytes",
                    hint="give the edf stage's kernel.edf in the out dir",
                )
            return head + f.read(size - len(head))
        except OSError as exc:
            raise _unreadable(path, exc) from None


def _unreadable(path: str | os.PathLike, exc: OSError) -> ArtifactError:
    return ArtifactError(
        f"cannot read EDF file: {exc.strerror or exc}", location=Location(str(path))
    )


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


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
