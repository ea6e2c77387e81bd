"""`kiln inspect FILE.edf`: the listing, and a clear error for any damaged file."""

from __future__ import annotations

import os

import pytest

from kiln.errors import ArtifactError
from kiln.inspect_edf import load_edf, render
from kiln.ir.edf import read_layout
from kiln.ir.schedule_check import random_program
from kiln.stages import edf, schedule

MACHINE = {"name": "npu-v1", "clock_mhz": 1000, "units": {"dma": 2, "tensor": 1, "vector": 2}}


@pytest.fixture
def edf_path(tmp_path):
    sp = schedule.run(random_program(8, n=25), schedule.Options(), MACHINE)
    path = tmp_path / "kernel.edf"
    path.write_bytes(edf.serialize(edf.run(sp, edf.Options(), MACHINE)))
    return path


def test_render_shows_header_sections_signature_metadata_and_listing(edf_path):
    raw = edf_path.read_bytes()
    text = render(edf_path)
    assert text.startswith(f"EDF file {edf_path}\n")
    assert "  magic        KEDF" in text and "  version      1" in text
    assert f"  total size   {len(raw)} bytes" in text
    assert f"sha256 {raw[-32:].hex()} OK" in text
    for s in read_layout(raw).sections:
        assert any(
            line.split()[:4] == [str(s.type), s.name, str(s.offset), str(s.size)]
            for line in text.splitlines()
        )
    assert "  out   output  f32    64x64        16640   16384" in text
    assert '"program_sha256"' in text and '"policy": "critical-path"' in text
    e = load_edf(edf_path)
    for i, s in zip(e.scheduled.program.instrs, e.scheduled.slots, strict=True):
        assert any(
            line.split()[:3] == [str(i.id), f"{s.start}-{s.end}", s.unit] and line.endswith(i.text)
            for line in text.splitlines()
        )
    assert render(edf_path) == text


@pytest.mark.parametrize(
    "damage, check",
    [
        (lambda raw: raw[: len(raw) - 100], "size"),
        (lambda raw: raw[:20], "size"),
        (lambda raw: b"\x7fELF" + raw[4:], "magic"),
        (lambda raw: raw[:300] + bytes([raw[300] ^ 1]) + raw[301:], "section-checksum"),
        (lambda raw: raw[:-1] + bytes([raw[-1] ^ 0x80]), "trailer-checksum"),
        (lambda raw: raw[:4] + b"\x02" + raw[5:], "version"),
    ],
)
def test_damaged_file_is_an_artifact_error_naming_file_and_check(edf_path, damage, check):
    edf_path.write_bytes(damage(edf_path.read_bytes()))
    with pytest.raises(ArtifactError) as err:
        render(edf_path)
    text = err.value.render()
    assert text.startswith(f"{edf_path}: error: corrupt EDF file: {check} check failed")
    assert err.value.location.file == str(edf_path)


@pytest.mark.parametrize(
    "damage, hint",
    [
        (lambda raw: b"\x83\xa7pr" + raw[4:], "kiln inspect reads EDF binaries"),
        (lambda raw: raw[:4] + b"\x02" + raw[5:], "newer EDF format"),
        (lambda raw: raw[:6] + b"\x01" + raw[7:], "newer EDF format"),
        (lambda raw: raw[:-1] + bytes([raw[-1] ^ 1]), "rebuild it"),
    ],
)
def test_the_hint_fits_the_check_rebuilding_helps_only_damage(edf_path, damage, hint):
    # a kernel.sched or a newer Kiln's binary is not damaged: "rebuild it" misled
    edf_path.write_bytes(damage(edf_path.read_bytes()))
    with pytest.raises(ArtifactError) as err:
        render(edf_path)
    assert hint in err.value.hint


def test_missing_file_is_an_artifact_error(tmp_path):
    with pytest.raises(ArtifactError) as err:
        render(tmp_path / "nope.edf")
    assert "cannot read EDF file" in err.value.render() and "nope.edf" in err.value.render()


def test_directory_is_an_artifact_error(tmp_path):
    with pytest.raises(ArtifactError):
        render(tmp_path)


def test_a_directory_is_named_as_one_not_an_open_error(tmp_path):
    with pytest.raises(ArtifactError) as err:
        render(tmp_path)
    assert err.value.found == "a directory" and err.value.location.file == str(tmp_path)


def test_a_device_is_refused_without_reading_it():
    # /dev/zero has no end: reading it ran out of memory
    with pytest.raises(ArtifactError) as err:
        render("/dev/zero")
    assert "/dev/zero is not a regular file" in err.value.render()
    assert err.value.expected == "an EDF file (a regular file)"
    assert err.value.found == "a character device"


def test_a_fifo_with_no_writer_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "kernel.edf"
    os.mkfifo(fifo)
    with pytest.raises(ArtifactError) as err:
        render(fifo)
    assert err.value.found == "a FIFO (named pipe)"


def test_a_huge_file_that_is_no_edf_is_read_only_as_far_as_its_header(tmp_path):
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.write(b"\x7fELF" + bytes(60))
        f.truncate(64 << 30)  # sparse: 64 GiB that would not fit in memory
    with pytest.raises(ArtifactError) as err:
        render(big)
    assert "magic check failed" in err.value.render()
    assert err.value.found == repr(b"\x7fELF")


def test_a_header_claiming_other_than_the_file_size_is_a_size_error_before_reading(
    edf_path, tmp_path
):
    raw = edf_path.read_bytes()
    with open(edf_path, "r+b") as f:
        f.truncate(64 << 30)
    with pytest.raises(ArtifactError) as err:
        render(edf_path)
    assert "size check failed at byte 16: file has trailing bytes" in err.value.render()
    assert (err.value.expected, err.value.found) == (f"{len(raw)} bytes", f"{64 << 30} bytes")


def test_a_file_whose_header_claims_more_than_any_kernel_is_refused(edf_path, monkeypatch):
    import kiln.inspect_edf

    size = edf_path.stat().st_size
    monkeypatch.setattr(kiln.inspect_edf, "MAX_BYTES", size - 1)
    with pytest.raises(ArtifactError) as err:
        render(edf_path)
    assert (err.value.expected, err.value.found) == (f"at most {size - 1} bytes", f"{size} bytes")


def test_kiln_inspect_of_a_device_is_one_error_and_exit_2(tmp_path):
    from tests.conftest import run_kiln

    proc = run_kiln(tmp_path, "inspect", "/dev/zero", timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("/dev/zero: error: cannot read EDF file: /dev/zero is not a")
    assert "found: a character device" in proc.stderr
