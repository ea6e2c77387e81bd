"""Load-time checks of kernels against pipeline.yaml (kiln/kernel_checks.py)."""

from __future__ import annotations

from types import SimpleNamespace

from kiln.kernel_checks import unused_dims
from kiln.pipeline import load_pipeline

PIPELINE = """\
project: p
packages: [kernels]
kernels:
  fixed:
    dtype: [f32, f16]
    shapes: {s: {X: 1}}
"""


def test_an_unused_dim_of_a_dtype_list_entry_is_one_warning_at_its_own_line(tmp_path):
    path = tmp_path / "pipeline.yaml"
    path.write_text(PIPELINE)
    pipeline = load_pipeline(path)
    source = SimpleNamespace(name="fixed", params=(("a", (5, 3)), ("b", (3,))))
    kernels = {spec.name: source for spec in pipeline.kernels}
    assert sorted(kernels) == ["fixed_f16", "fixed_f32"]
    (warning,) = unused_dims(pipeline, kernels)
    assert warning.message.startswith("shape set 's' of kernel 'fixed' binds X")
    assert warning.location.key_path == "kernels.fixed.shapes.s.X"
    assert (warning.location.line, warning.location.column) == (6, 18)
