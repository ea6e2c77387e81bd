"""kiln/pipeline/yamlpos.py: YAML is loaded safely and within bounds, errors at their line."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kiln.errors import PipelineError
from kiln.pipeline import yamlpos
from kiln.pipeline.yamlpos import MAX_DEPTH, load_yaml

FILE = Path("/project/pipeline.yaml")


def error_of(text: str) -> PipelineError:
    with pytest.raises(PipelineError) as info:
        load_yaml(FILE, text)
    return info.value


def billion_laughs(levels: int = 9) -> str:
    rows = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    rows += [f"l{n}: &l{n} [" + ", ".join([f"*l{n - 1}"] * 9) + "]" for n in range(1, levels + 1)]
    return "\n".join(rows) + "\n"


def test_alias_bomb_is_refused_quickly_at_its_line():
    start = time.perf_counter()
    err = error_of(billion_laughs())
    assert time.perf_counter() - start < 2.0
    assert "aliases expand to too many values" in err.message
    assert err.location.line == 7  # the first anchor whose expansion passes the bound


def test_a_few_aliases_are_fine():
    data, _ = load_yaml(FILE, billion_laughs(levels=3))
    assert len(data["l3"]) == 9 and data["l3"][0][0][0] == ["lol"] * 9


def test_deep_nesting_is_refused_at_its_line():
    text = "a: 1\nb: " + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "\n"
    err = error_of(text)
    assert "nested too deeply" in err.message
    assert err.location.line == 2
    assert max(len(row) for row in err.render().splitlines()) < 200


def test_nesting_beyond_libyaml_limit_is_an_error_not_a_crash():
    err = error_of("a: " + "[" * 10_000 + "]" * 10_000)
    assert err.location.line == 1


@pytest.mark.parametrize(
    "text", ["x: !!python/object/apply:os.system [ls]\n", "x: !!python/object:os.X {a: 1}\n"]
)
def test_python_tags_on_collections_are_refused(text):
    err = error_of(text)
    assert "is not allowed" in err.message and err.location.line == 1


def test_python_tags_on_scalars_are_refused():
    assert "could not determine a constructor" in error_of("x: !!python/name:os.system\n").message


def test_unclosed_quote_is_reported_where_it_opens():
    err = error_of('project: e2e\nname: "abc\nother: 1\nmore: 2\n')
    assert err.location.line == 2 and err.location.column == 7
    assert "unclosed quote" in err.message


def test_control_byte_is_reported_at_its_line():
    err = error_of("a: 1\nb: x\x00y\n")
    assert err.location.line == 2 and err.location.column == 5
    assert "U+0000" in err.message


def test_huge_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(yamlpos, "MAX_FILE_BYTES", 1000)
    path = tmp_path / "pipeline.yaml"
    path.write_text("# " + "x" * 2000 + "\n")
    with pytest.raises(PipelineError, match="too large"):
        load_yaml(path)


def test_utf16_file_is_named_and_the_fix_given(tmp_path):
    path = tmp_path / "pipeline.yaml"
    path.write_bytes("project: demo\n".encode("utf-16"))
    with pytest.raises(PipelineError, match="not UTF-8") as info:
        load_yaml(path)
    assert "UTF-16" in info.value.found and "UTF-8" in info.value.hint


def test_latin1_byte_is_shown_in_its_line(tmp_path):
    path = tmp_path / "pipeline.yaml"
    path.write_bytes("project: demo\nkernels: {b\xe4d: 1}\n".encode("latin-1"))
    with pytest.raises(PipelineError, match="not UTF-8") as info:
        load_yaml(path)
    loc = info.value.location
    assert (loc.line, loc.column, loc.source) == (2, 12, "kernels: {b\ufffdd: 1}")


def test_yaml_12_floats_are_numbers_and_quoted_ones_stay_strings():
    text = "a: [1e-5, 1E3, -2e+4, 1.0e5, .5e1, 12, 1.5, '1e-5', \"1E3\", 1e, e5, 1e-5x, 0x10]\n"
    data, _ = load_yaml(FILE, text)
    assert data["a"] == [1e-5, 1e3, -2e4, 1e5, 5.0, 12, 1.5, "1e-5", "1E3", "1e", "e5", "1e-5x", 16]
    assert [type(v) for v in data["a"][:7]] == [float] * 5 + [int, float]


def test_yaml_12_floats_leave_pyyamls_own_loader_alone():
    import yaml

    load_yaml(FILE, "a: 1e-5\n")
    assert yaml.safe_load("a: 1e-5\n") == {"a": "1e-5"}  # YAML 1.1, as PyYAML reads it
