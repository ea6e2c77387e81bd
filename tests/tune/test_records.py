"""tuning.jsonl: canonical lines, exact keys, damaged files reported at their line."""

import json

import pytest

from kiln.errors import KilnError
from kiln.tune.records import (
    KEY_FIELDS,
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


@pytest.mark.parametrize(
    "line, found",
    [
        ("[1, 2, 3]", "found: a JSON list, not an object"),
        ('{"graph": "g"}', "found: no 'instance', 'shape_set', 'dtype', 'machine'"),
        ('{"instance": 3' + ', "%s": "x"' * 6 % KEY_FIELDS + "}", "found: 'instance' is 3, not"),
        ("KNOBS{}", "found: 'trials' is 'many', not a whole number"),
        ('KNOBS{"nostage": {"x": 1}}', "stage 'nostage': kiln tune tunes only visa, lir, schedule"),
        ('KNOBS{"visa": {"vector_tile": "zz"}}', 'vector_tile is "zz", not a whole number from 0'),
        ('KNOBS{"visa": {"vector_tile": -5}}', "visa.vector_tile is -5, not a whole number from 0"),
        ('KNOBS{"visa": {"vector_tile": 99999999999999999999999}}', "to 16777216"),
        ('KNOBS{"visa": {"reduce_split": 9}}', "reduce_split is 9, not a whole number from 1 to 8"),
        ('KNOBS{"visa": {"tile_q": 8}}', "tile_q is not one kiln tune sets; visa knobs: tile_m"),
        ('KNOBS{"lir": {"double_buffer": "yes"}}', 'lir.double_buffer is "yes", not true or false'),
        ('KNOBS{"schedule": {"policy": "nosuch"}}', "not 'critical-path' or 'in-order'"),
        ('KNOBS{"visa": [1]}', "found: knobs of stage 'visa' must be a mapping of option -> value"),
    ],
)  # fmt: skip
def test_a_damaged_record_says_what_is_wrong_in_the_records_words(tmp_path, line, found):
    path = tmp_path / "tuning.jsonl"
    write_records(path, {"gemm.large": record()})
    good = path.read_text()
    if line.startswith("KNOBS"):
        data = json.loads(good)
        if line == "KNOBS{}":
            data["trials"] = "many"
        else:
            data["knobs"] = json.loads(line[len("KNOBS") :])
        line = json.dumps(data)
    path.write_text(good + line + "\n")
    with pytest.raises(KilnError) as info:
        read_records(path)
    text = info.value.render()
    assert text.startswith(f"{path}:2:1: error: a tuning record cannot be read"), text
    assert found in text
    assert "pop expected" not in text and "__init__" not in text


def test_every_knob_the_search_can_choose_is_a_valid_record_knob():
    from kiln.tune.records import KNOB_VALUES
    from kiln.tune.space import knobs_for
    from tests.tune.graphs import MACHINE, traced

    graphs = [
        traced("gemm", "kernels.linalg", M=64, K=64, N=64),
        traced("softmax", "kernels.normalization", R=8, C=64),
    ]
    for graph in graphs:
        for knob in knobs_for(graph, MACHINE):
            wanted, ok = KNOB_VALUES[knob.stage][knob.option]
            assert all(ok(v) for v in knob.values), (knob, wanted)
