"""Stage options: typed dataclass fields filled from pipeline.yaml (STYLE 6)."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, TypeVar, get_type_hints

from kiln.errors import StageError

T = TypeVar("T")


def build_options(cls: type[T], values: dict[str, Any] | None, stage: str) -> T:
    """Make ``cls`` from ``values``; unknown keys and wrong types are errors listing valid ones."""
    values = dict(values or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = get_type_hints(cls)
    for key, value in values.items():
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            raise StageError(
                f"unknown option {key!r} for stage {stage!r}",
                expected="one of: "
                + (", ".join(sorted(fields)) or "(this stage takes no options)"),
                found=key,
                hint=f"did you mean {close[0]!r}?" if close else None,
            )
        _check_type(stage, key, value, hints.get(key))
    return cls(**values)


def _check_type(stage: str, key: str, value: Any, hint: Any) -> None:
    allowed = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}.get(hint)
    if allowed is None:
        return
    if hint is not bool and isinstance(value, bool):
        allowed = ()
    if not isinstance(value, allowed):
        raise StageError(
            f"option {key!r} of stage {stage!r} has the wrong type",
            expected=hint.__name__,
            found=f"{value!r} ({type(value).__name__})",
        )
