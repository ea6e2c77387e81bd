"""Kiln: a declarative build pipeline for compute kernels.

The kernel language (``device``, ``Tensor``, ``trace`` and the ops) is
re-exported from :mod:`kiln.lang` on first use, so tools that only read
configuration (the CLI, the task loader) do not pay for importing numpy.
"""

from __future__ import annotations

import importlib.util
from typing import Any

__version__ = "0.1.0"

# Kept literal so that `from kiln import <submodule>` never imports the language
# (tests/lang checks it against kiln.lang.__all__).
LANG_NAMES = frozenset(
    """DeviceFunction INF Tensor TensorSpec abs absolute add arange argmax argmin bf16
    bool_ broadcast_to cast ceil clip concatenate conv conv2d conv_dgrad conv_wgrad
    device dispatching divide dot einsum equal erf exp expand_dims expm1 f16 f32 flatten
    flip floor full full_like gelu greater greater_equal i32 inf less less_equal log
    log1p log_softmax logical_and logical_not logical_or logical_xor logsumexp matmul
    matrix_transpose max maximum mean min minimum moveaxis multiply negative not_equal
    ones_like permute power prod reciprocal relu reshape round rsqrt sigmoid sign silu
    softmax softplus sqrt square squeeze stack std subtract sum swapaxes tanh trace
    transpose var where zeros_like""".split()
)


def load_outputs(directory: Any) -> dict[str, Any]:
    """The outputs ``kiln run --save-outputs DIR`` wrote, name -> array, in their own dtypes.

    Plain ``np.load`` reads each file too (bf16 is saved as its exact f32
    widening); this gives bf16 back as bf16. See :mod:`kiln.outputs`.
    """
    from kiln.outputs import load_outputs as load

    return load(directory)


def __getattr__(name: str) -> Any:
    if name in LANG_NAMES:
        import kiln.lang as lang

        value = getattr(lang, name)
        globals()[name] = value
        return value
    if name.startswith("_") or importlib.util.find_spec(f"kiln.{name}") is not None:
        raise AttributeError(f"module 'kiln' has no attribute {name!r}")  # a submodule
    from kiln.lang.errors import unknown_name  # a misspelled op: say which ones exist

    raise unknown_name("kiln", name, LANG_NAMES)


def __dir__() -> list[str]:
    import kiln.lang as lang

    return sorted(set(globals()) | set(lang.__all__))
