"""EDF, the Kiln kernel binary: a versioned, checksummed container (layout: docs/edf.md).

Little-endian throughout. A 32-byte header, a table of 48-byte section
entries, the sections (8-byte aligned, zero padded), and a 32-byte trailer
holding the sha256 of everything before it::

    header   magic "KEDF" | version u16 | flags u16 | section count u32
             | header size u32 | total size u64 | reserved u64
    table    per section: type u32 | name 12s | offset u64 | size u64 | sha256[:16]
    sections INSTRUCTIONS (msgpack), SCHEDULE (struct), SIGNATURE (msgpack),
             METADATA (canonical JSON)
    trailer  sha256(bytes before the trailer)

``encode`` and ``decode`` are exact inverses; ``decode`` checks every
length, bound and checksum and raises ``EdfFormatError`` saying which
check failed, what it expected and found, and at which byte.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgpack
import numpy as np

from kiln.ir.lir import (
    ArgSlot,
    Program,
    ScheduledProgram,
    Slot,
    instr_from_obj,
)

MAGIC = b"KEDF"
VERSION = 1
HEADER = struct.Struct("<4sHHIIQQ")  # magic, version, flags, count, header size, total, reserved
ENTRY = struct.Struct("<I12sQQ16s")  # type, name, offset, size, sha256 prefix
TRAILER_SIZE = 32
ALIGN = 8
INSTRUCTIONS, SCHEDULE, SIGNATURE, METADATA = 1, 2, 3, 4
SECTION_NAMES = {
    INSTRUCTIONS: "INSTRUCTIONS",
    SCHEDULE: "SCHEDULE",
    SIGNATURE: "SIGNATURE",
    METADATA: "METADATA",
}
SLOT = struct.Struct("<IIqq")  # instr id, unit index, start, end
SCHED_HEAD = struct.Struct("<III")  # slot count, unit count, policy length
_SLOT_DTYPE = np.dtype([("instr", "<u4"), ("unit", "<u4"), ("start", "<i8"), ("end", "<i8")])


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause cyclic GC while building ~10 objects per instruction that all stay alive.

    At 100k instructions the collector's passes cost half of decode's time and
    find nothing to free; the previous state is restored on exit.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class EdfFormatError(ValueError):
    """A byte string is not a valid EDF file: names the check, expected/found and the offset."""

    def __init__(
        self,
        check: str,
        message: str,
        *,
        expected: Any = None,
        found: Any = None,
        offset: int | None = None,
        path: str = "<bytes>",
    ) -> None:
        self.check = check
        self.expected = expected
        self.found = found
        self.offset = offset
        self.path = path
        self.detail = message
        text = f"{path}: {check} check failed"
        if offset is not None:
            text += f" at byte {offset}"
        text += f": {message}"
        if expected is not None or found is not None:
            text += f" (expected {expected}, found {found})"
        super().__init__(text)


def canonical_json(obj: Any) -> str:
    """The one text form of a JSON value: sorted keys, no spaces, ASCII only."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


@dataclasses.dataclass(frozen=True)
class EdfFile:
    """A decoded EDF: the scheduled program and its metadata (canonical JSON text)."""

    scheduled: ScheduledProgram
    metadata: str = "{}"

    def __post_init__(self) -> None:
        meta = self.metadata
        obj = json.loads(meta) if isinstance(meta, str | bytes) else meta
        if not isinstance(obj, dict):
            raise ValueError(f"EDF metadata must be a JSON object, not {type(obj).__name__}")
        object.__setattr__(self, "metadata", canonical_json(obj))

    @property
    def meta(self) -> dict:
        """The metadata as a fresh dict."""
        return json.loads(self.metadata)

    def with_metadata(self, extra: dict | None) -> EdfFile:
        """A copy with ``extra`` merged in (dict values merge one level deep, e.g. hashes)."""
        if not extra:
            return self
        meta = self.meta
        for key, value in extra.items():
            if isinstance(value, dict) and isinstance(meta.get(key), dict):
                meta[key] = {**meta[key], **value}
            else:
                meta[key] = value
        return EdfFile(self.scheduled, canonical_json(meta))


@dataclasses.dataclass(frozen=True, slots=True)
class Section:
    """One entry of the section table, as read from a file."""

    type: int
    name: str
    offset: int
    size: int
    digest: bytes  # sha256(section)[:16]


@dataclasses.dataclass(frozen=True, slots=True)
class Layout:
    """The checked header and section table of a file."""

    version: int
    flags: int
    header_size: int
    total_size: int
    sections: tuple[Section, ...]
    trailer: bytes  # the sha256 stored at the end

    def section(self, type_id: int) -> Section:
        return next(s for s in self.sections if s.type == type_id)


# --------------------------------------------------------------------------- encode


def encode(edf: EdfFile, metadata: dict | None = None) -> bytes:
    """The file bytes of ``edf`` (with ``metadata`` merged into its metadata, if given)."""
    with gc_paused():
        return _encode(edf.with_metadata(metadata))


def _encode(edf: EdfFile) -> bytes:
    sp = edf.scheduled
    bodies = [
        # the instructions as the lir stage packed them: no per-instruction work here
        (INSTRUCTIONS, sp.program.table.packed_array()),
        (SCHEDULE, _encode_schedule(sp)),
        (SIGNATURE, _pack(_signature_obj(sp.program))),
        (METADATA, edf.metadata.encode("ascii")),
    ]
    header_size = HEADER.size + ENTRY.size * len(bodies)
    table, data = [], bytearray()
    offset = _align(header_size)
    for type_id, body in bodies:
        table.append(
            ENTRY.pack(
                type_id,
                SECTION_NAMES[type_id].encode("ascii"),
                offset,
                len(body),
                hashlib.sha256(body).digest()[:16],
            )
        )
        data += body + bytes(_align(len(body)) - len(body))
        offset += _align(len(body))
    total = _align(header_size) + len(data) + TRAILER_SIZE
    head = HEADER.pack(MAGIC, VERSION, 0, len(bodies), header_size, total, 0)
    out = bytearray(head + b"".join(table))
    out += bytes(_align(header_size) - header_size)
    out += data
    out += hashlib.sha256(out).digest()
    assert len(out) == total
    return bytes(out)


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _signature_obj(p: Program) -> dict:
    return {  # keys in sorted order: the msgpack map is canonical
        "args": [[a.name, a.role, a.dtype, list(a.shape), a.dram_offset, a.nbytes] for a in p.args],
        "dram_bytes": p.dram_bytes,
        "kernel": p.kernel,
        "machine": p.machine,
        "sram_bytes": p.sram_bytes,
        "sram_peak": p.sram_peak,
        "units": [[k, n] for k, n in p.units],
    }


def _encode_schedule(sp: ScheduledProgram) -> bytes:
    table = sp.slot_table
    names = table.unit_names
    units = sorted({names[u] for u in np.unique(table.unit).tolist()})
    index = {u: n for n, u in enumerate(units)}
    policy = sp.policy.encode("utf-8")
    out = bytearray(SCHED_HEAD.pack(len(table), len(units), len(policy)) + policy)
    for u in units:
        raw = u.encode("utf-8")
        out += struct.pack("<H", len(raw)) + raw
    out += bytes(_align(len(out)) - len(out))
    # the SLOT records of every slot at once (same layout as SLOT.pack, little-endian)
    if len(table) and (table.instr.min() < 0 or table.instr.max() >= 1 << 32):
        for s in sp.slots:  # struct.error naming the value, as SLOT.pack always said
            SLOT.pack(s.instr, 0, s.start, s.end)
    rows = np.empty(len(table), dtype=_SLOT_DTYPE)
    rows["instr"] = table.instr
    rows["unit"] = np.array([index.get(n, 0) for n in names], dtype=np.uint32)[table.unit]
    rows["start"] = table.start
    rows["end"] = table.end
    out += rows.tobytes()
    return bytes(out)


# --------------------------------------------------------------------------- decode


def claimed_size(head: bytes) -> int | None:
    """The total size the EDF header at the start of ``head`` claims, or None.

    None when ``head`` is too short for a header, or its magic, version or
    flags are not this format's: then the file's size says nothing, and
    :func:`read_layout` of its first ``HEADER.size + TRAILER_SIZE`` bytes
    names the check that fails. Lets a reader stop at what the header says.
    """
    if len(head) < HEADER.size:
        return None
    magic, version, flags, _, _, total, _ = HEADER.unpack_from(head, 0)
    return total if (magic, version, flags) == (MAGIC, VERSION, 0) else None


def size_mismatch(total: int, n: int, path_hint: str = "<bytes>") -> EdfFormatError:
    """The header says ``total`` bytes, the file has ``n``."""
    what = "file is truncated" if n < total else "file has trailing bytes"
    return EdfFormatError(
        "size",
        f"{what}: the header's total size does not match the file",
        expected=f"{total} bytes",
        found=f"{n} bytes",
        offset=16,
        path=path_hint,
    )


def read_layout(raw: bytes, path_hint: str = "<bytes>") -> Layout:
    """Check the header, section table, section checksums and trailer of ``raw``."""

    def fail(check, message, expected=None, found=None, offset=None):
        raise EdfFormatError(
            check, message, expected=expected, found=found, offset=offset, path=path_hint
        )

    n = len(raw)
    if n < HEADER.size + TRAILER_SIZE:
        fail(
            "size",
            "file is shorter than a header and a trailer",
            f">= {HEADER.size + TRAILER_SIZE} bytes",
            f"{n} bytes",
            0,
        )
    magic, version, flags, count, header_size, total, reserved = HEADER.unpack_from(raw, 0)
    if magic != MAGIC:
        fail("magic", "not an EDF file", repr(MAGIC), repr(magic), 0)
    if version != VERSION:
        fail("version", "unsupported format version", VERSION, version, 4)
    if flags != 0:
        fail("flags", "unknown flag bits set", "0x0000", f"0x{flags:04x}", 6)
    if total != n:
        raise size_mismatch(total, n, path_hint)
    if reserved != 0:
        fail("reserved", "reserved header field is not zero", 0, reserved, 24)
    want = HEADER.size + ENTRY.size * count
    if header_size != want or _align(header_size) + TRAILER_SIZE > total:
        fail(
            "header-size",
            f"header size does not fit {count} section entries",
            want,
            header_size,
            12,
        )
    end_of_data = total - TRAILER_SIZE
    sections, prev_end = [], _align(header_size)
    for k in range(count):
        at = HEADER.size + k * ENTRY.size
        type_id, name_raw, offset, size, digest = ENTRY.unpack_from(raw, at)
        name = _section_name(name_raw)
        if name is None:
            fail(
                "section-name",
                f"section entry {k} has a malformed name",
                "ASCII, NUL padded",
                repr(name_raw),
                at + 4,
            )
        if type_id in SECTION_NAMES and name != SECTION_NAMES[type_id]:
            fail(
                "section-name",
                f"section entry {k} (type {type_id}) has the wrong name",
                SECTION_NAMES[type_id],
                name,
                at + 4,
            )
        if offset % ALIGN or offset < prev_end or offset + size > end_of_data:
            fail(
                "section-bounds",
                f"section {name} lies outside the data area or overlaps",
                f"8-aligned offset in [{prev_end}, {end_of_data - size}]",
                f"offset {offset}, size {size}",
                at + 16,
            )
        prev_end = offset + size
        actual = hashlib.sha256(raw[offset : offset + size]).digest()[:16]
        if actual != digest:
            fail(
                "section-checksum", f"section {name} is corrupt", digest.hex(), actual.hex(), offset
            )
        sections.append(Section(type_id, name, offset, size, digest))
    trailer = raw[end_of_data:]
    actual = hashlib.sha256(raw[:end_of_data]).digest()
    if actual != trailer:
        fail(
            "trailer-checksum",
            "file checksum does not match",
            trailer.hex(),
            actual.hex(),
            end_of_data,
        )
    types = [s.type for s in sections]
    for type_id, name in SECTION_NAMES.items():
        if types.count(type_id) != 1:
            fail(
                "sections", f"section {name} must appear once", 1, types.count(type_id), HEADER.size
            )
    return Layout(version, flags, header_size, total, tuple(sections), trailer)


def _section_name(raw: bytes) -> str | None:
    name, _, pad = raw.partition(b"\0")
    if not name or pad.strip(b"\0") or not name.isascii() or not name.decode().isprintable():
        return None
    return name.decode("ascii")


def decode(raw: bytes, path_hint: str = "<bytes>") -> EdfFile:
    """Parse and check EDF bytes; EdfFormatError names the failed check, values and byte."""
    with gc_paused():
        return _decode(bytes(raw), path_hint)


def _decode(raw: bytes, path_hint: str) -> EdfFile:
    layout = read_layout(raw, path_hint)

    def parse(type_id: int, parser):
        sec = layout.section(type_id)
        try:
            return parser(raw[sec.offset : sec.offset + sec.size])
        except Exception as exc:  # malformed content behind a valid checksum
            raise EdfFormatError(
                "section-content",
                f"section {sec.name} cannot be decoded: {type(exc).__name__}: {exc}",
                offset=sec.offset,
                path=path_hint,
            ) from None

    program = parse(SIGNATURE, decode_signature)
    # arrays come back as tuples, which is what the IR holds: nothing to convert
    instrs = parse(
        INSTRUCTIONS, lambda data: tuple(instr_from_obj(i) for i in _unpack(data, tuples=True))
    )
    slots, policy = parse(SCHEDULE, _decode_schedule)
    if len(slots) != len(instrs):
        sec = layout.section(SCHEDULE)
        raise EdfFormatError(
            "section-content",
            "the schedule and the instruction list differ in length",
            expected=f"{len(instrs)} slots",
            found=f"{len(slots)} slots",
            offset=sec.offset,
            path=path_hint,
        )
    meta = parse(METADATA, _decode_metadata)
    program = dataclasses.replace(program, instrs=instrs)
    return EdfFile(ScheduledProgram(program, slots, policy), canonical_json(meta))


def decode_signature(data: bytes) -> Program:
    """The SIGNATURE section: the program without its instructions (the simulator reads it too)."""
    sig = _unpack(data)
    return Program(
        kernel=sig["kernel"],
        machine=sig["machine"],
        units=tuple((str(k), int(c)) for k, c in sig["units"]),
        args=tuple(
            ArgSlot(name, role, tuple(int(d) for d in shape), dtype, int(off), int(nb))
            for name, role, dtype, shape, off, nb in sig["args"]
        ),
        instrs=(),
        sram_bytes=int(sig["sram_bytes"]),
        sram_peak=int(sig["sram_peak"]),
        dram_bytes=int(sig["dram_bytes"]),
    )


def _decode_metadata(data: bytes) -> dict:
    meta = json.loads(data.decode("ascii"))
    if not isinstance(meta, dict):
        raise ValueError("metadata is not a JSON object")
    return meta


def _unpack(data: bytes, tuples: bool = False) -> Any:
    return msgpack.unpackb(data, raw=False, use_list=not tuples, strict_map_key=False)


def _decode_schedule(data: bytes) -> tuple[tuple[Slot, ...], str]:
    count, nunits, plen = SCHED_HEAD.unpack_from(data, 0)
    at = SCHED_HEAD.size
    policy = data[at : at + plen].decode("utf-8")
    at += plen
    units = []
    for _ in range(nunits):
        (length,) = struct.unpack_from("<H", data, at)
        units.append(data[at + 2 : at + 2 + length].decode("utf-8"))
        at += 2 + length
    at = _align(at)
    if len(data) != at + count * SLOT.size:
        raise ValueError(f"slot table needs {at + count * SLOT.size} bytes, has {len(data)}")
    slots = tuple(Slot(i, units[u], s, e) for i, u, s, e in SLOT.iter_unpack(data[at:]))
    return slots, policy
