"""The EDF container: exact round trip, canonical bytes, and precise rejection of bad files."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kiln.ir.edf as edf_mod
from kiln.ir.edf import (
    ENTRY,
    HEADER,
    MAGIC,
    EdfFile,
    EdfFormatError,
    decode,
    encode,
    read_layout,
)
from kiln.ir.lir import DEP_KINDS, Access, ArgSlot, Dep, Instr, Program, ScheduledProgram, Slot
from kiln.ir.schedule_check import random_program
from kiln.stages import schedule

REPO = Path(__file__).resolve().parents[2]
MACHINE = {"name": "npu-v1", "clock_mhz": 1000}


def make_edf(seed: int = 1, n: int = 30, meta: dict | None = None) -> EdfFile:
    sp = schedule.run(random_program(seed, n=n), schedule.Options(), MACHINE)
    return EdfFile(sp, json.dumps(meta or {"kernel": "random", "n": n}))


def flip(raw: bytes, pos: int, bit: int = 0) -> bytes:
    out = bytearray(raw)
    out[pos] ^= 1 << bit
    return bytes(out)


def reject(raw: bytes, check: str) -> EdfFormatError:
    with pytest.raises(EdfFormatError) as err:
        decode(raw, "k.edf")
    assert err.value.check == check, str(err.value)
    assert str(err.value).startswith(f"k.edf: {check} check failed")
    return err.value


# ----------------------------------------------------------------------- round trip

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
SCALAR = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    TEXT,
    st.booleans(),
    st.none(),
)
ARG_VALUE = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=4).map(tuple), max_leaves=8)
JSON = st.recursive(
    st.one_of(
        st.integers(-(2**53), 2**53),
        TEXT,
        st.booleans(),
        st.none(),
        st.floats(allow_nan=False, allow_infinity=False),
    ),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=10,
)
UNITS = ("dma0", "dma1", "tensor0", "vector0", "vector1")
ACCESS = st.builds(
    Access, st.sampled_from(("sram", "dram")), st.integers(0, 2**40), st.integers(0, 2**31)
)


@st.composite
def scheduled_programs(draw) -> ScheduledProgram:
    n = draw(st.integers(0, 12))
    instrs = []
    for i in range(n):
        srcs = draw(st.lists(st.integers(0, i - 1), max_size=3, unique=True)) if i else []
        args = draw(
            st.dictionaries(st.text("abcdefgh_", min_size=1, max_size=6), ARG_VALUE, max_size=3)
        )
        instrs.append(
            Instr(
                id=i,
                unit=draw(st.sampled_from(UNITS)),
                opcode=draw(TEXT),
                reads=tuple(draw(st.lists(ACCESS, max_size=3))),
                writes=tuple(draw(st.lists(ACCESS, max_size=3))),
                nbytes=draw(st.integers(0, 2**40)),
                latency=draw(st.integers(0, 10**6)),
                deps=tuple(Dep(s, draw(st.sampled_from(DEP_KINDS))) for s in sorted(srcs)),
                args=tuple(sorted(args.items())),
                text=draw(TEXT),
            )
        )
    shape = tuple(draw(st.lists(st.integers(0, 4096), max_size=4)))
    program = Program(
        kernel=draw(TEXT),
        machine=draw(TEXT),
        units=(("dma", 2), ("tensor", 1), ("vector", 2)),
        args=(ArgSlot(draw(TEXT), "input", shape, "f32", draw(st.integers(0, 2**40)), 4),),
        instrs=tuple(instrs),
        sram_bytes=draw(st.integers(0, 2**40)),
        sram_peak=draw(st.integers(0, 2**40)),
        dram_bytes=draw(st.integers(0, 2**40)),
    )
    if draw(st.booleans()):
        return schedule.run(
            program, schedule.Options(draw(st.sampled_from(schedule.POLICIES))), MACHINE
        )
    slots = tuple(  # arbitrary (even invalid) slots: the container does not judge them
        Slot(i.id, draw(st.sampled_from(UNITS)), s, s + draw(st.integers(0, 10**6)))
        for i in instrs
        for s in [draw(st.integers(-(2**40), 2**40))]
    )
    return ScheduledProgram(program, slots, draw(TEXT))


@settings(max_examples=150, deadline=None)
@given(sp=scheduled_programs(), meta=st.dictionaries(TEXT, JSON, max_size=4))
def test_decode_inverts_encode_exactly(sp, meta):
    edf = EdfFile(sp, json.dumps(meta))
    raw = encode(edf)
    back = decode(raw)
    assert back == edf
    assert back.scheduled == sp
    assert encode(back) == raw


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 200))
def test_random_dag_programs_round_trip(seed, n):
    edf = make_edf(seed, n)
    assert decode(encode(edf)) == edf


def test_large_program_round_trips():
    edf = make_edf(7, 5000)
    assert decode(encode(edf)) == edf


# ----------------------------------------------------------------------- canonical bytes


def test_encode_is_deterministic():
    assert encode(make_edf()) == encode(make_edf())


def test_metadata_is_canonical_json_whatever_the_key_order():
    a = EdfFile(make_edf().scheduled, {"b": 1, "a": {"y": 2, "x": [1, 2]}})
    b = EdfFile(make_edf().scheduled, '{"a": {"x": [1, 2], "y": 2}, "b": 1}')
    assert a == b and a.metadata == '{"a":{"x":[1,2],"y":2},"b":1}'
    assert encode(a) == encode(b)


def test_metadata_must_be_an_object():
    with pytest.raises(ValueError, match="JSON object"):
        EdfFile(make_edf().scheduled, "[1, 2]")


def test_extra_metadata_merges_one_level_deep():
    edf = make_edf(meta={"hashes": {"program_sha256": "p"}, "kernel": "k"})
    extra = {"hashes": {"source_sha256": "s"}, "note": "x"}
    merged = edf.with_metadata(extra)
    assert merged.meta == {
        "hashes": {"program_sha256": "p", "source_sha256": "s"},
        "kernel": "k",
        "note": "x",
    }
    assert decode(encode(edf, metadata=extra)) == merged
    assert edf.with_metadata(None) is edf


HASHSEED_SCRIPT = """
import hashlib, json
from kiln.ir.edf import EdfFile, encode
from kiln.ir.schedule_check import random_program
from kiln.summary import summarize
from kiln.stages import edf, schedule
m = {"name": "npu-v1", "clock_mhz": 1000, "units": {"dma": 2, "tensor": 1, "vector": 2}}
for policy in schedule.POLICIES:
    sp = schedule.run(random_program(11, n=400), schedule.Options(policy), m)
    e = edf.run(sp, edf.Options(), m).with_metadata({"hashes": {"source": "abc"}, "set": "x"})
    print(hashlib.sha256(encode(e)).hexdigest())
    print(hashlib.sha256(schedule.serialize(sp)).hexdigest())
    print(hashlib.sha256(schedule.trace_json(sp, m)).hexdigest())
    print(hashlib.sha256(json.dumps(summarize(sp, m), sort_keys=True).encode()).hexdigest())
"""


def test_bytes_do_not_depend_on_the_hash_seed(tmp_path):
    outs = []
    for seed in ("0", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(REPO))
        proc = subprocess.run(
            [sys.executable, "-c", HASHSEED_SCRIPT],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        outs.append(proc.stdout)
    assert outs[0] == outs[1]
    assert len(outs[0].split()) == 8


# ----------------------------------------------------------------------- layout


def test_header_and_table_are_at_the_documented_offsets():
    edf = make_edf()
    raw = encode(edf)
    assert raw[:4] == MAGIC
    magic, version, flags, count, header_size, total, reserved = HEADER.unpack_from(raw, 0)
    assert (version, flags, count, reserved) == (1, 0, 4, 0)
    assert header_size == 32 + 48 * 4 and total == len(raw)
    assert raw[-32:] == hashlib.sha256(raw[:-32]).digest()
    names = []
    for k in range(count):
        type_id, name, offset, size, digest = ENTRY.unpack_from(raw, 32 + 48 * k)
        names.append((type_id, name.rstrip(b"\0").decode()))
        assert offset % 8 == 0
        assert digest == hashlib.sha256(raw[offset : offset + size]).digest()[:16]
    assert names == [(1, "INSTRUCTIONS"), (2, "SCHEDULE"), (3, "SIGNATURE"), (4, "METADATA")]
    layout = read_layout(raw)
    meta = layout.section(4)
    assert raw[meta.offset : meta.offset + meta.size].decode() == edf.metadata


def test_schedule_section_is_packed_structs():
    edf = make_edf(n=5)
    raw = encode(edf)
    sec = read_layout(raw).section(2)
    body = raw[sec.offset : sec.offset + sec.size]
    count, nunits, plen = struct.unpack_from("<III", body, 0)
    assert count == 5 and body[12 : 12 + plen] == b"critical-path"
    units = sorted({s.unit for s in edf.scheduled.slots})
    assert nunits == len(units)
    slots = list(struct.iter_unpack("<IIqq", body[len(body) - 24 * count :]))
    assert [(i, units[u], s, e) for i, u, s, e in slots] == [
        (s.instr, s.unit, s.start, s.end) for s in edf.scheduled.slots
    ]


# ----------------------------------------------------------------------- rejection


@pytest.mark.parametrize("keep", [0, 10, 31, 63, 64, 200, -1, -32, -33])
def test_truncated_file_is_rejected_with_sizes(keep):
    raw = encode(make_edf())
    cut = raw[:keep] if keep >= 0 else raw[: len(raw) + keep]
    err = reject(cut, "size")
    if len(cut) >= 64:
        assert "truncated" in str(err) and f"found {len(cut)} bytes" in str(err)
        assert err.offset == 16 and err.expected == f"{len(raw)} bytes"


def test_trailing_bytes_are_rejected():
    err = reject(encode(make_edf()) + b"\0", "size")
    assert "trailing bytes" in str(err)


def test_wrong_magic_is_rejected():
    raw = encode(make_edf())
    err = reject(b"ELF\x7f" + raw[4:], "magic")
    assert err.offset == 0 and err.expected == repr(b"KEDF") and err.found == repr(b"ELF\x7f")


def test_each_header_field_flip_names_its_check():
    raw = encode(make_edf())
    assert reject(flip(raw, 2), "magic").offset == 0
    err = reject(flip(raw, 4), "version")
    assert (err.expected, err.found, err.offset) == (1, 0, 4)
    assert reject(flip(raw, 7, 3), "flags").found == "0x0800"
    assert reject(flip(raw, 8), "header-size").offset == 12
    assert reject(flip(raw, 12, 3), "header-size").found == 224 ^ 8
    assert reject(flip(raw, 17), "size").offset == 16
    assert reject(flip(raw, 30), "reserved").offset == 24


def test_section_table_flips_are_caught():
    raw = encode(make_edf())
    entry = 32 + 48  # SCHEDULE's entry
    assert reject(flip(raw, entry + 0), "section-name").offset == entry + 4
    assert reject(flip(raw, entry + 5), "section-name").offset == entry + 4
    assert reject(flip(raw, entry + 16, 0), "section-bounds").offset == entry + 16
    assert reject(flip(raw, entry + 31, 0), "section-bounds").offset == entry + 16
    assert "SCHEDULE" in str(reject(flip(raw, entry + 40), "section-checksum"))


@pytest.mark.parametrize(
    "type_id, name", [(1, "INSTRUCTIONS"), (2, "SCHEDULE"), (3, "SIGNATURE"), (4, "METADATA")]
)
def test_flip_inside_a_section_names_the_section(type_id, name):
    raw = encode(make_edf())
    sec = read_layout(raw).section(type_id)
    for pos in (sec.offset, sec.offset + sec.size // 2, sec.offset + sec.size - 1):
        err = reject(flip(raw, pos, 6), "section-checksum")
        assert f"section {name} is corrupt" in str(err) and err.offset == sec.offset


def test_flip_in_the_trailer_or_padding_fails_the_file_checksum():
    raw = encode(make_edf())
    err = reject(flip(raw, len(raw) - 1), "trailer-checksum")
    assert err.offset == len(raw) - 32
    sec = read_layout(raw).section(3)  # SIGNATURE: its padding follows it
    pad = sec.offset + sec.size
    assert pad % 8, "test needs a padded section"
    reject(flip(raw, pad), "trailer-checksum")


def test_every_single_bit_flip_is_rejected():
    raw = encode(make_edf(n=3))
    for pos in range(len(raw)):
        for bit in (0, 7):
            with pytest.raises(EdfFormatError):
                decode(flip(raw, pos, bit))


def test_bad_content_behind_valid_checksums_is_rejected(monkeypatch):
    monkeypatch.setattr(edf_mod, "_signature_obj", lambda p: {"kernel": "k"})
    raw = encode(make_edf())
    monkeypatch.undo()
    sec = read_layout(raw).section(3)
    err = reject(raw, "section-content")
    assert "section SIGNATURE cannot be decoded" in str(err) and err.offset == sec.offset
