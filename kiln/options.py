"""Stage options: typed dataclass fields filled from pipeline.yaml (STYLE 6).

A field made with ``option(default, choices=..., minimum=..., maximum=...)``
also says which values it accepts: ``build_options`` refuses the others, so
the loader's check of pipeline.yaml (which builds every stage's options)
reports them at their line, before a build runs.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable
from typing import Any, TypeVar, get_type_hints

from kiln.errors import StageError

T = TypeVar("T")
_ACCEPTS = "kiln.accepts"  # the field metadata key of option()'s constraints


@dataclasses.dataclass
class OptionError(StageError):
    """A StageError about one option: ``option`` names it, for the error's key path."""

    option: str | None = None


def option(
    default: Any,
    *,
    choices: Iterable[Any] | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
) -> Any:
    """A dataclass field for a stage option, with the values it accepts."""
    accepts = {"choices": tuple(choices) if choices is not None else None}
    accepts |= {"minimum": minimum, "maximum": maximum}
    return dataclasses.field(
        default=default, metadata={_ACCEPTS: {k: v for k, v in accepts.items() if v is not None}}
    )


def accepted(cls: type, name: str) -> dict[str, Any]:
    """The constraints ``option()`` declared on field ``name`` of ``cls`` ({} if none)."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            return dict(f.metadata.get(_ACCEPTS, {}))
    return {}


def build_options(cls: type[T], values: dict[str, Any] | None, stage: str) -> T:
    """Make ``cls`` from ``values``; unknown keys, wrong types and refused values are errors."""
    values = dict(values or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = get_type_hints(cls)
    for key, value in values.items():
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            raise OptionError(
                f"unknown option {key!r} for stage {stage!r}",
                expected="one of: "
                + (", ".join(sorted(fields)) or "(this stage takes no options)"),
                found=key,
                hint=f"did you mean {close[0]!r}?" if close else None,
                option=key,
            )
        _check_type(stage, key, value, hints.get(key))
        _check_accepted(stage, key, value, fields[key].metadata.get(_ACCEPTS, {}))
    return cls(**values)


def _check_type(stage: str, key: str, value: Any, hint: Any) -> None:
    allowed = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}.get(hint)
    if allowed is None:
        return
    if hint is not bool and isinstance(value, bool):
        allowed = ()
    if not isinstance(value, allowed):
        raise OptionError(
            f"option {key!r} of stage {stage!r} has the wrong type",
            expected=hint.__name__,
            found=f"{value!r} ({type(value).__name__})",
            option=key,
        )


def _check_accepted(stage: str, key: str, value: Any, accepts: dict[str, Any]) -> None:
    choices = accepts.get("choices")
    if choices is not None and value not in choices:
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        raise OptionError(
            f"invalid value for option {key!r} of stage {stage!r}",
            expected="one of: " + ", ".join(map(str, choices)),
            found=repr(value),
            hint=f"did you mean {close[0]!r}?" if close else None,
            option=key,
        )
    low, high = accepts.get("minimum"), accepts.get("maximum")
    if (low is not None and value < low) or (high is not None and value > high):
        noun = "an integer" if isinstance(value, int) else "a number"
        if low is not None and high is not None:
            expected = f"{noun} from {low} to {high}"
        else:
            expected = f"{noun} >= {low}" if low is not None else f"{noun} <= {high}"
        raise OptionError(
            f"option {key!r} of stage {stage!r} is out of range",
            expected=expected,
            found=repr(value),
            option=key,
        )
