"""Kiln: a declarative build pipeline for compute kernels.

The kernel language (``device``, ``Tensor``, ``trace`` and the ops) is
re-exported from :mod:`kiln.lang` on first use, so tools that only read
configuration (the CLI, the task loader) do not pay for importing numpy.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    import kiln.lang as lang

    if name in lang.__all__:
        value = getattr(lang, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")


def __dir__() -> list[str]:
    import kiln.lang as lang

    return sorted(set(globals()) | set(lang.__all__))
