"""The damage check over recorded files (tasks/chain/manifest.py)."""

import json
import os

from kiln.tasks.chain import manifest


def _instance(root, name="k.small"):
    out = root / "out" / name
    out.mkdir(parents=True)
    for file, text in (("kernel.visa", "visa"), ("kernel.edf", "edf-bytes")):
        (out / file).write_text(text)
    manifest.record(str(out), [str(out / "kernel.visa"), str(out / "kernel.edf")])
    return out


def test_an_untouched_build_is_intact_and_the_index_holds_stats_only(tmp_path):
    out, state = _instance(tmp_path), tmp_path / "state"
    state.mkdir()
    intact: set[str] = set()
    assert manifest.drop_damaged([str(out)], str(state), intact) == []
    assert intact == {str(out / "kernel.visa"), str(out / "kernel.edf")}
    index = json.loads((state / manifest.INDEX).read_text())
    assert index["format"] == manifest.INDEX_FORMAT
    entry = index["dirs"][str(out)]["kernel.edf"]
    assert entry == [len("edf-bytes"), (out / "kernel.edf").stat().st_mtime_ns]
    again: set[str] = set()  # from the index alone
    assert manifest.drop_damaged([str(out)], str(state), again) == [] and again == intact


def test_an_edited_artifact_is_removed_and_left_out_of_the_intact_set(tmp_path, capsys):
    out, state = _instance(tmp_path), tmp_path / "state"
    state.mkdir()
    manifest.drop_damaged([str(out)], str(state))  # the index is made
    (out / "kernel.edf").write_text("edf-BYTES")  # same size, new bytes
    intact: set[str] = set()
    assert manifest.drop_damaged([str(out)], str(state), intact) == [str(out / "kernel.edf")]
    assert not (out / "kernel.edf").exists()
    assert intact == {str(out / "kernel.visa")}
    assert "changed since Kiln wrote it" in capsys.readouterr().err
    # the index forgets it: the next check finds nothing to say
    assert manifest.drop_damaged([str(out)], str(state)) == []


def test_a_touched_file_with_its_bytes_is_kept_and_its_new_stat_remembered(tmp_path):
    out, state = _instance(tmp_path), tmp_path / "state"
    state.mkdir()
    manifest.drop_damaged([str(out)], str(state))
    os.utime(out / "kernel.edf", ns=(10**18, 10**18))
    intact: set[str] = set()
    assert manifest.drop_damaged([str(out)], str(state), intact) == []
    assert str(out / "kernel.edf") in intact
    index = json.loads((state / manifest.INDEX).read_text())
    assert index["dirs"][str(out)]["kernel.edf"][1] == 10**18
    assert manifest.read(str(out))["kernel.edf"][1] == 10**18


def test_a_missing_file_is_not_intact_and_not_reported(tmp_path):
    out, state = _instance(tmp_path), tmp_path / "state"
    state.mkdir()
    (out / "kernel.visa").unlink()
    intact: set[str] = set()
    assert manifest.drop_damaged([str(out)], str(state), intact) == []
    assert intact == {str(out / "kernel.edf")}


def test_an_index_of_the_older_format_is_ignored_and_rewritten(tmp_path):
    out, state = _instance(tmp_path), tmp_path / "state"
    state.mkdir()
    old = {"format": 1, "dirs": {str(out): {"kernel.edf": [1, 2, "0" * 64]}}}
    (state / manifest.INDEX).write_text(json.dumps(old))
    intact: set[str] = set()
    assert manifest.drop_damaged([str(out)], str(state), intact) == []
    assert len(intact) == 2
    assert json.loads((state / manifest.INDEX).read_text())["format"] == manifest.INDEX_FORMAT


def test_a_damaged_index_entry_sends_the_directory_to_its_own_manifest(tmp_path):
    out, state = _instance(tmp_path), tmp_path / "state"
    state.mkdir()
    manifest.drop_damaged([str(out)], str(state))
    doc = json.loads((state / manifest.INDEX).read_text())
    doc["dirs"][str(out)]["kernel.edf"] = "garbage"
    (state / manifest.INDEX).write_text(json.dumps(doc))
    intact: set[str] = set()
    assert manifest.drop_damaged([str(out)], str(state), intact) == []
    assert len(intact) == 2
