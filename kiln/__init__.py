"""Kiln: a declarative build pipeline for compute kernels.

The kernel language (``device``, ``Tensor``, ``trace`` and the ops) is
re-exported from :mod:`kiln.lang` on first use, so tools that only read
configuration (the CLI, the task loader) do not pay for importing numpy.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# Kept literal so that `from kiln import <submodule>` never imports the language
# (tests/lang checks it against kiln.lang.__all__).
LANG_NAMES = frozenset(
    """DeviceFunction Tensor TensorSpec abs absolute add bf16 broadcast_to cast conv2d device
    dispatching divide equal exp f16 f32 gelu greater greater_equal i32 less less_equal log
    logical_not matmul max maximum mean min minimum multiply negative not_equal permute power
    relu reshape rsqrt sigmoid sqrt subtract sum tanh trace transpose where""".split()
)


def __getattr__(name: str) -> Any:
    if name in LANG_NAMES:
        import kiln.lang as lang

        value = getattr(lang, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")


def __dir__() -> list[str]:
    import kiln.lang as lang

    return sorted(set(globals()) | set(lang.__all__))
