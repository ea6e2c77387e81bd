"""Unknown names in a kernel (``kiln.fft``, a misspelled Tensor method) are TraceErrors at
the kernel's own line with the nearest names and a pointer to docs/language.md."""

from __future__ import annotations

import importlib.util

import pytest

import kiln
from kiln import trace
from kiln.errors import TraceError

KERNELS = """\
import kiln
from kiln import Tensor, device


@device
def spectrum(x: Tensor[8]):
    return kiln.fft(x)


@device
def typo(x: Tensor[8]):
    return kiln.softmx(x)


@device
def method(x: Tensor[8]):
    return x.sigmod()
"""


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    path = tmp_path_factory.mktemp("names") / "names_kernels.py"
    path.write_text(KERNELS)
    spec = importlib.util.spec_from_file_location("names_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, str(path)


@pytest.mark.parametrize(
    "kernel, line, suggestion",
    [("spectrum", 7, None), ("typo", 12, "kiln.softmax"), ("method", 17, "sigmoid")],
)
def test_unknown_name_points_at_the_kernel_line_with_suggestions(kernels, kernel, line, suggestion):
    module, path = kernels
    with pytest.raises(TraceError) as info:
        trace(getattr(module, kernel), {}, "f32")
    err = info.value
    assert err.location.file == path
    assert err.location.line == line
    text = str(err)
    assert "docs/language.md" in text
    if suggestion:
        assert f"did you mean {suggestion}" in text


def test_unknown_name_is_still_an_attribute_error_for_hasattr():
    assert not hasattr(kiln, "fft")
    assert hasattr(kiln, "softmax") and hasattr(kiln, "conv")


def test_submodules_still_import():
    from kiln import compare  # noqa: F401  (a submodule, not an op)


def test_every_exported_name_resolves():
    for name in kiln.LANG_NAMES:
        assert getattr(kiln, name) is not None
