"""tuning.jsonl: canonical lines, exact keys, damaged files reported at their line."""

import json

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
    """A record as `kiln tune` writes one: every count in range."""
    base = dict(
        KEY,
        knobs={"visa": {"tile_m": 64}},
        default_cycles=200,
        tuned_cycles=100,
        trials=8,
        rejected=1,
        strategy="evolutionary",
        seed=0,
        budget=8,
    )
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


DROP = object()  # a key taken out of the record


def damaged(tmp_path, change) -> KilnError:
    """The error reading a file of one good record and, on line 2, ``change``: a raw
    line, or the good record with keys set (or taken out with DROP)."""
    path = tmp_path / "tuning.jsonl"
    write_records(path, {"gemm.large": record()})
    good = path.read_text()
    if isinstance(change, str):
        line = change
    else:
        data = json.loads(good)
        for name, value in change.items():
            if value is DROP:
                del data[name]
            else:
                data[name] = value
        line = json.dumps(data)
    path.write_text(good + line + "\n")
    with pytest.raises(KilnError) as info:
        read_records(path)
    text = info.value.render()
    assert text.startswith(f"{path}:2:1: error: a tuning record cannot be read"), text
    assert "pop expected" not in text and "__init__" not in text
    return info.value


@pytest.mark.parametrize(
    "change, found",
    [
        ("[1, 2, 3]", "found: a JSON list, not an object"),
        ('{"graph": "g"}', "found: no 'instance', 'shape_set', 'dtype', 'machine'"),
        ({"instance": 3}, "found: 'instance' is 3, not a string"),
        ({"trials": "many"}, "found: 'trials' is 'many', not a whole number, 1 or more"),
        # every key a record is written with is needed: without its knobs a record
        # would claim a speed-up the build never applies
        ({"knobs": DROP}, "found: no 'knobs'"),
        ({"default_cycles": DROP, "speedup": DROP}, "found: no 'default_cycles', 'speedup'"),
        ({"tuned_cycles": DROP}, "found: no 'tuned_cycles'"),
        ({"trials": DROP, "rejected": DROP}, "found: no 'trials', 'rejected'"),
        ({"budget": DROP}, "found: no 'budget'"),
        ({"seed": DROP}, "found: no 'seed'"),
        ({"strategy": DROP}, "found: no 'strategy'"),
        ({"speedup": DROP}, "found: no 'speedup'"),
        ({"bogus": 1}, "found: unexpected keys ['bogus']"),
        # values no search gives
        ({"trials": -1}, "found: 'trials' is -1, not a whole number, 1 or more"),
        ({"trials": 2.0}, "found: 'trials' is 2.0, not a whole number, 1 or more"),
        ({"rejected": -1}, "found: 'rejected' is -1, not a whole number, 0 or more"),
        ({"tuned_cycles": -5}, "found: 'tuned_cycles' is -5, not a whole number, 1 or more"),
        ({"default_cycles": 0}, "'default_cycles' is 0, not a whole number, 1 or more"),
        ({"budget": 0}, "found: 'budget' is 0, not a whole number, 1 or more"),
        ({"seed": True}, "found: 'seed' is True, not a whole number, 0 or more"),
        ({"strategy": "best"}, "'strategy' is 'best', not one of grid, random, evolutionary"),
        ({"complete": "no"}, "found: 'complete' is 'no', not true or false"),
        (
            {"tuned_cycles": 300, "speedup": 0.6667},
            "found: 'tuned_cycles' is 300, more than 'default_cycles' (200): "
            "a record is never slower than the defaults",
        ),
        ({"trials": 9}, "'trials' is 9, more than 'budget' (8): a search stops at its budget"),
        ({"rejected": 8}, "found: 'rejected' is 8, not fewer than 'trials' (8)"),
        ({"speedup": "fast"}, "'speedup' is 'fast', not default_cycles / tuned_cycles (200 / 100"),
        ({"speedup": 3.0}, "'speedup' is 3.0, not default_cycles / tuned_cycles (200 / 100 = 2.0"),
        ({"speedup": float("nan")}, "found: 'speedup' is nan, not default_cycles"),
        ({"speedup": True}, "found: 'speedup' is True, not default_cycles"),
    ],
)
def test_a_damaged_record_says_what_is_wrong_in_the_records_words(tmp_path, change, found):
    err = damaged(tmp_path, change)
    assert found in err.render(), err.render()
    if isinstance(change, str):
        key = {"[1, 2, 3]": None}.get(change, "instance")
    else:
        key = next(iter(change))
    assert err.location.key_path == key
    if key is not None:
        assert f"\n  at key: {key}\n" in err.render()


@pytest.mark.parametrize(
    "knobs, key, found",
    [
        ({"nostage": {"x": 1}}, "nostage", "stage 'nostage': kiln tune tunes only visa, lir"),
        ({"visa": {"vector_tile": "zz"}}, "visa.vector_tile", 'is "zz", not a whole number from 0'),
        (
            {"visa": {"vector_tile": -5}},
            "visa.vector_tile",
            "is -5, not a whole number from 0",
        ),
        ({"visa": {"vector_tile": 99999999999999999999999}}, "visa.vector_tile", "to 16777216"),
        (
            {"visa": {"reduce_split": 9}},
            "visa.reduce_split",
            "9, not a whole number from 1 to 8",
        ),
        ({"visa": {"tile_q": 8}}, "visa.tile_q", "tile_q is not one kiln tune sets; visa knobs:"),
        ({"lir": {"double_buffer": "yes"}}, "lir.double_buffer", 'is "yes", not true or false'),
        ({"schedule": {"policy": "x"}}, "schedule.policy", "not 'critical-path' or 'in-order'"),
        (
            {"visa": [1]},
            "visa",
            "knobs of stage 'visa' must be a mapping of option -> value",
        ),
        ([1], "", "found: 'knobs' must be a mapping of stage -> options"),
    ],
)
def test_a_bad_knob_is_named_by_its_key_path(tmp_path, knobs, key, found):
    err = damaged(tmp_path, {"knobs": knobs})
    assert found in err.render(), err.render()
    assert err.location.key_path == "knobs" + (f".{key}" if key else "")


def test_every_record_kiln_tune_has_written_is_read_back(tmp_path):
    """The first format (no ``complete``), an interrupted record, and one line as
    `kiln tune` wrote it before the reader checked every key: all still read."""
    path = tmp_path / "tuning.jsonl"
    first = (
        '{"budget":16,"compiler":"c1","default_cycles":62108,"dtype":"f32","graph":"g",'
        '"instance":"transpose.large","knobs":{"schedule":{"policy":"in-order"},'
        '"visa":{"vector_tile":65536}},"machine":"m1","options":"o1","rejected":0,"seed":0,'
        '"shape_set":"large","speedup":2.8521,"strategy":"evolutionary","trials":16,'
        '"tuned_cycles":21776}'
    )
    partial = record(instance="gemm.small", trials=3, budget=64, complete=False)
    path.write_text(first + "\n" + partial.to_line() + "\n")
    got = read_records(path)
    assert got["transpose.large"].speedup == pytest.approx(2.8521, abs=1e-4)
    assert got["transpose.large"].knobs["visa"] == {"vector_tile": 65536}
    assert got["gemm.small"] == partial and not got["gemm.small"].complete
    one = record(default_cycles=7, tuned_cycles=3, rejected=0, trials=1)  # 2.3333x
    write_records(path, {"gemm.large": one})
    assert read_records(path) == {"gemm.large": one}


def test_the_strategies_a_record_may_name_are_the_searchs():
    from kiln.tune.records import STRATEGIES
    from kiln.tune.search import STRATEGIES as SEARCHED

    assert STRATEGIES == SEARCHED


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
