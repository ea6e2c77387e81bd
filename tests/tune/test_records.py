"""tuning.jsonl: canonical lines, exact keys, damaged files reported at their line."""

import pytest

from kiln.errors import KilnError
from kiln.tune.records import (
    TuningKey,
    TuningRecord,
    cached_records,
    read_records,
    write_records,
)

KEY = dict(
    instance="gemm.large",
    graph="g" * 64,
    shape_set="large",
    dtype="f32",
    machine="m1",
    options="o1",
    compiler="c1",
)


def record(**over) -> TuningRecord:
    base = dict(KEY, knobs={"visa": {"tile_m": 64}}, default_cycles=200, tuned_cycles=100)
    return TuningRecord(**{**base, **over})


def test_records_round_trip_sorted_and_byte_stable(tmp_path):
    path = tmp_path / "tuning.jsonl"
    records = {"z.small": record(instance="z.small"), "a.large": record(instance="a.large")}
    assert write_records(path, records)
    text = path.read_text()
    assert text.splitlines()[0].startswith('{"budget"')
    assert [line.split('"instance":"')[1].split('"')[0] for line in text.splitlines()] == [
        "a.large",
        "z.small",
    ]
    assert '"speedup":2.0' in text
    assert read_records(path) == records
    assert not write_records(path, dict(reversed(list(records.items()))))  # same bytes


def test_a_key_matches_only_when_every_part_is_equal():
    key = TuningKey(**KEY)
    assert key.matches(record())
    for part in ("graph", "shape_set", "dtype", "machine", "options", "compiler"):
        changed = record(**{part: "other"})
        assert not key.matches(changed)
        assert key.stale_parts(changed) == [part]
    assert not key.matches(record(instance="gemm.small"))


def test_a_damaged_line_is_an_error_at_its_line(tmp_path):
    path = tmp_path / "tuning.jsonl"
    write_records(path, {"gemm.large": record()})
    path.write_text(path.read_text() + '{"instance": "x", "bogus": 1}\n')
    with pytest.raises(KilnError) as info:
        read_records(path)
    assert info.value.location.line == 2
    assert "bogus" in info.value.render()
    path.write_text("not json\n")
    with pytest.raises(KilnError) as info:
        read_records(path)
    assert info.value.location.line == 1


def test_missing_file_is_empty_and_the_cache_sees_rewrites(tmp_path):
    path = tmp_path / "tuning.jsonl"
    assert read_records(path) == {} and cached_records(str(path)) == {}
    write_records(path, {"gemm.large": record()})
    assert cached_records(str(path))["gemm.large"].tuned_cycles == 100
    write_records(path, {"gemm.large": record(tuned_cycles=90)})
    assert cached_records(str(path))["gemm.large"].tuned_cycles == 90
