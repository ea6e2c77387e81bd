"""A bad pipeline.yaml stops every command with one message at its key and exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.cli.scaffold import init_project
from tests.conftest import run_kiln


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`kiln init`'s project (one kernel, scale_add), the cwd of the test."""
    init_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / ".cache"))
    for name in ("KILN_PIPELINE_FILE", "KILN_VERBOSITY", "KILN_MESSAGE_FORMAT", "KILN_OUT_DIR"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "pipeline.yaml"


def kiln(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    from kiln.cli import main

    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out + err


def edit(path: Path, old: str, new: str) -> int:
    """Replace ``old`` by ``new``; the 1-based line where ``new`` starts."""
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return text[: text.index(old)].count("\n") + 1


@pytest.mark.parametrize(
    "old, new, command, key",
    [
        ("out_dir: build/kiln/kernel", 'out_dir: "a\\x00b"', "compile", "out_dir"),
        ("out_dir: build/kiln/kernel", 'tuning: {file: "t\\x00.jsonl"}', "tune", "tuning.file"),
    ],
)
def test_a_nul_in_a_path_is_a_load_error_not_a_traceback(
    project: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, command: str, key: str
) -> None:
    line = edit(project, old, new)
    rc, out = kiln(capsys, command)
    assert rc == 2, out
    assert f"pipeline.yaml:{line}:" in out and f"'{key}' is not a usable path" in out, out
    assert f"at key: {key}" in out and "expected: a path without NUL characters" in out, out
    assert "Traceback" not in out


MACHINE = """\
machine: m
machines:
  m:
    clock_mhz: {clock}
    sram_bytes: 65536
    units: {{dma: 1, tensor: 1, vector: 1}}
    dma: {{bytes_per_cycle: {rate}, latency: 200}}
    tensor: {{tile: [16, 16, 16], cycles_per_tile: 16}}
    vector: {{lanes: 16, latency: {{default: 4}}}}
"""


@pytest.mark.parametrize(
    "clock, rate, key, found",
    [
        (".nan", "16", "machines.m.clock_mhz", "found: .nan"),
        (".inf", "16", "machines.m.clock_mhz", "found: .inf"),
        ("500", "1.0e-300", "machines.m.dma.bytes_per_cycle", "found: 1e-300"),
    ],
)
def test_a_machine_number_the_stages_cannot_use_stops_compile_at_its_key(
    project: Path, capsys: pytest.CaptureFixture[str], clock: str, rate: str, key: str, found: str
) -> None:
    text = project.read_text(encoding="utf-8") + MACHINE.format(clock=clock, rate=rate)
    project.write_text(text, encoding="utf-8")
    word = key.rsplit(".", 1)[1]
    line = next(i for i, s in enumerate(text.splitlines(), 1) if f"{word}: " in s)
    rc, out = kiln(capsys, "compile")
    assert rc == 2, out
    assert f"pipeline.yaml:{line}:" in out and f"at key: {key}" in out and found in out, out
    assert "internal error" not in out and "Traceback" not in out


def test_overlapping_dump_entries_build_and_write_each_dump_once(project: Path) -> None:
    dumps = (
        "dumps:\n"
        "  - {kernels: [scale_add], kinds: [visa]}\n"
        "  - {kernels: [scale_add], kinds: [visa, summary]}\n"
    )
    project.write_text(project.read_text(encoding="utf-8") + dumps, encoding="utf-8")
    # a build in a process of its own: this one has the repository's kernels package imported
    proc = run_kiln(project.parent, "compile", "scale_add.small")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    written = project.parent / "build/kiln/kernel/scale_add/small/dumps"
    assert sorted(p.name for p in written.iterdir()) == ["kernel.visa", "summary"]


def test_a_kind_twice_in_one_dump_entry_is_an_error_at_the_second(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (
        project.read_text(encoding="utf-8")
        + "dumps:\n  - {kernels: [scale_add], kinds: [visa, visa]}\n"
    )
    project.write_text(text, encoding="utf-8")
    rc, out = kiln(capsys, "compile")
    assert rc == 2, out
    line = len(text.splitlines())
    column = text.splitlines()[-1].rindex("visa") + 1
    assert f"pipeline.yaml:{line}:{column}: error: 'dumps[0].kinds' lists an item twice" in out
    assert "at key: dumps[0].kinds[1]" in out and "can't have a common target" not in out


@pytest.mark.parametrize(
    "options, message, expected, found",
    [
        ("{tile_order: xy}", "invalid value for option 'tile_order' of stage 'visa'",
         "one of: mn, nm", "'xy'"),
        ("{vector_tile: -5}", "option 'vector_tile' of stage 'visa' is out of range",
         "an integer >= 0", "-5"),
        ("{reduce_split: 0}", "option 'reduce_split' of stage 'visa' is out of range",
         "an integer from 1 to 8", "0"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("where", ["kernel", "stage"])
def test_an_out_of_range_stage_option_is_a_load_error_at_its_line(
    project: Path,
    capsys: pytest.CaptureFixture[str],
    options: str,
    message: str,
    expected: str,
    found: str,
    where: str,
) -> None:
    if where == "kernel":
        line = edit(project, "    dtype: f32\n", f"    options: {{visa: {options}}}\n")
    else:
        stages = "stages:\n  - {name: trace, module: kiln.stages.trace}\n"
        stages += f"  - {{name: visa, module: kiln.stages.visa, options: {options}}}\n"
        stages += "".join(
            f"  - {{name: {n}, module: kiln.stages.{n}}}\n" for n in ("lir", "schedule", "edf")
        )
        text = project.read_text(encoding="utf-8")
        project.write_text(text + stages, encoding="utf-8")
        line = len(text.splitlines()) + 3
    rc, out = kiln(capsys, "compile")
    assert rc == 2, out
    assert f"pipeline.yaml:{line}:" in out and f"error: {message}" in out, out
    assert f"expected: {expected}" in out and f"found: {found}" in out, out
    option = options[1:].split(":")[0]
    key = "kernels.scale_add.options.visa" if where == "kernel" else "stages[1].options"
    assert f"at key: {key}.{option}" in out, out
