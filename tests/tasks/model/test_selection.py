"""The one selection rule every subcommand uses (kiln.tasks.model.selection)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from kiln.errors import KilnError
from kiln.tasks.model.selection import Selection, one_instance, select

KERNELS = [
    ("gemm", "kernels.linalg.gemm", ("small", "wide")),
    ("gemm_bias_relu", "kernels.linalg.gemm_bias_relu", ("small",)),
    ("layernorm", "kernels.nn.layernorm", ("small",)),
    ("rmsnorm", "kernels.nn.rmsnorm", ("small",)),
    ("row_sum", "kernels.reduce.row_sum", ("small",)),
    ("row_max", "kernels.reduce.row_max", ("small",)),
    ("attention", "kernels.nn.attention", ("small",)),
]


def instance(kernel: str, path: str, shapes: str):
    return SimpleNamespace(
        kernel=kernel,
        shape_set=shapes,
        name=f"{kernel}.{shapes}",
        source=SimpleNamespace(path=path),
    )


@pytest.fixture
def project():
    instances = [instance(k, p, s) for k, p, sets in KERNELS for s in sets]
    apps = [SimpleNamespace(name="mlp"), SimpleNamespace(name="attention")]
    pipeline = SimpleNamespace(apps=apps, packages=["kernels"])
    return SimpleNamespace(instances=instances, pipeline=pipeline)


def names(selection: Selection) -> list[str]:
    return [i.name for i in selection.instances]


def test_an_exact_kernel_name_selects_only_that_kernel(project):
    assert names(select(project, ["gemm"])) == ["gemm.small", "gemm.wide"]


def test_an_instance_name_selects_one_instance(project):
    assert names(select(project, ["gemm.wide"])) == ["gemm.wide"]


def test_a_module_or_function_path_selects_what_it_defines(project):
    assert names(select(project, ["kernels.reduce"])) == ["row_sum.small", "row_max.small"]
    assert names(select(project, ["kernels.linalg.gemm"])) == ["gemm.small", "gemm.wide"]


def test_globs_select_every_match(project):
    assert names(select(project, ["gemm*"])) == ["gemm.small", "gemm.wide", "gemm_bias_relu.small"]
    assert names(select(project, ["*norm"])) == ["layernorm.small", "rmsnorm.small"]
    assert names(select(project, ["*.wide"])) == ["gemm.wide"]


@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_filter_is_an_error_not_every_kernel(project, empty):
    # '' is a substring of every name; it comes from an empty shell variable
    with pytest.raises(KilnError) as info:
        select(project, [empty])
    assert info.value.message == "an empty FILTER selects nothing"
    assert info.value.found == repr(empty)


def test_an_unambiguous_substring_selects(project):
    assert names(select(project, ["bias"])) == ["gemm_bias_relu.small"]
    assert names(select(project, ["layer"])) == ["layernorm.small"]


def test_where_one_kernel_is_needed_a_substring_of_several_lists_them(project, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["kiln", "run", "row", "--target", "sim"])
    with pytest.raises(KilnError) as info:
        select(project, ["row"], command="run")
    err = info.value
    assert "'row' matches 2 kernels: row_max, row_sum" in err.message
    assert err.hint == "type `kiln run row_max --target sim`"
    monkeypatch.setattr(sys, "argv", ["kiln", "compile", "row", "--dump-dfg", "g.json"])
    with pytest.raises(KilnError) as info:  # a dump flag needs one kernel too
        select(project, ["row"], command="compile", single=True)
    assert info.value.hint == "type `kiln compile row_max --dump-dfg g.json`"


@pytest.mark.parametrize("command", ["compile", "test", "bench", "status", "clean", "tune"])
def test_a_substring_selects_every_kernel_whose_path_holds_it(
    project, command, capsys, monkeypatch
):
    monkeypatch.delenv("KILN_VERBOSITY", raising=False)
    assert names(select(project, ["kernels.reduce.row_"], command=command)) == [
        "row_sum.small",
        "row_max.small",
    ]
    assert names(select(project, ["norm"], command=command)) == [
        "layernorm.small",
        "rmsnorm.small",
    ]
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"kiln {command}: 'kernels.reduce.row_' selects 2 kernels: row_sum, row_max",
        f"kiln {command}: 'norm' selects 2 kernels: layernorm, rmsnorm",
    ]


def test_the_selection_note_names_a_few_kernels_all_with_v_none_with_q(
    project, capsys, monkeypatch
):
    monkeypatch.delenv("KILN_VERBOSITY", raising=False)
    assert len(names(select(project, ["kernels."], command="test"))) == 8
    note = capsys.readouterr().err
    assert "'kernels.' selects 7 kernels (8 instances): gemm, gemm_bias_relu," in note
    assert "and 2 more (-v lists them)" in note
    monkeypatch.setenv("KILN_VERBOSITY", "2")
    select(project, ["kernels."], command="test")
    assert "attention" in capsys.readouterr().err
    monkeypatch.setenv("KILN_VERBOSITY", "0")
    select(project, ["kernels."], command="test")
    assert capsys.readouterr().err == ""


def test_no_match_names_the_kernels_and_the_nearest(project):
    with pytest.raises(KilnError) as info:
        select(project, ["gemn"], command="compile")
    err = info.value
    assert err.message == "no kernel matches 'gemn'"
    assert "did you mean `kiln compile gemm`?" == err.hint
    assert any("apps: attention, mlp" in n for n in err.notes)


def test_several_filters_are_a_union_in_pipeline_order(project):
    assert names(select(project, ["rmsnorm", "gemm.small"])) == ["gemm.small", "rmsnorm.small"]


def test_no_filter_is_everything_narrowed_by_shapes_and_package(project):
    assert len(select(project, []).instances) == 8
    assert names(select(project, [], shape_set="wide")) == ["gemm.wide"]
    assert names(select(project, [], packages=["kernels.nn"])) == [
        "layernorm.small",
        "rmsnorm.small",
        "attention.small",
    ]


def test_an_unknown_shape_set_says_which_exist(project):
    with pytest.raises(KilnError) as info:
        select(project, ["gemm"], shape_set="huge", command="compile")
    assert "expected: one of: small, wide" in info.value.render()


def test_an_app_is_selected_only_where_apps_are(project):
    assert select(project, ["mlp"], apps=True).app == "mlp"
    with pytest.raises(KilnError) as info:  # was "no kernel matches 'mlp'", apps: mlp noted
        select(project, ["mlp"], apps=False, command="compile")
    assert info.value.message == "'mlp' is an app, and `kiln compile` acts on kernels"
    assert info.value.hint.startswith("`kiln run mlp` builds the kernels the app reaches")
    with pytest.raises(KilnError, match="acts on kernels, not apps"):
        select(project, ["app:mlp"], command="compile")


def test_a_name_shared_by_a_kernel_and_an_app_needs_its_prefix(project):
    with pytest.raises(KilnError) as info:
        select(project, ["attention"], apps=True, command="test")
    assert "both a kernel and an app" in info.value.message
    assert "kiln test app:attention" in info.value.hint
    assert select(project, ["app:attention"], apps=True).app == "attention"
    assert names(select(project, ["kernel:attention"], apps=True)) == ["attention.small"]
    # where apps cannot be meant, the kernel is
    assert names(select(project, ["attention"])) == ["attention.small"]


def test_one_instance_refuses_several_kernels_or_shape_sets(project):
    with pytest.raises(KilnError, match="exactly one kernel"):
        one_instance(select(project, ["gemm*"]), "compile", "a dump flag")
    with pytest.raises(KilnError) as info:
        one_instance(select(project, ["gemm"]), "compile", "a dump flag")
    assert "kernel 'gemm' has 2" in info.value.message and "--shapes small" in info.value.hint
    assert one_instance(select(project, ["gemm.wide"]), "compile", "x").name == "gemm.wide"
