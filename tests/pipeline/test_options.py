"""kiln/options.py: the choices and bounds an option declares are checked when it is built."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kiln.options import OptionError, accepted, build_options, option


@dataclass(frozen=True)
class Options:
    order: str = option("mn", choices=("mn", "nm"))
    split: int = option(1, minimum=1, maximum=8)
    tile: int = option(0, minimum=0)
    fusion: bool = True


@pytest.mark.parametrize(
    "values, message, expected, found, hint",
    [
        ({"order": "nmm"}, "invalid value for option 'order' of stage 's'", "one of: mn, nm",
         "'nmm'", "did you mean 'nm'?"),
        ({"split": 0}, "option 'split' of stage 's' is out of range", "an integer from 1 to 8",
         "0", None),
        ({"split": 9}, "option 'split' of stage 's' is out of range", "an integer from 1 to 8",
         "9", None),
        ({"tile": -5}, "option 'tile' of stage 's' is out of range", "an integer >= 0", "-5",
         None),
    ],
)  # fmt: skip
def test_a_value_the_option_does_not_accept_is_an_error_naming_the_option(
    values: dict, message: str, expected: str, found: str, hint: str | None
) -> None:
    with pytest.raises(OptionError) as info:
        build_options(Options, values, "s")
    err = info.value
    assert (err.message, err.expected, err.found, err.hint) == (message, expected, found, hint)
    assert err.option == next(iter(values))


def test_accepted_values_and_undeclared_fields_build() -> None:
    built = build_options(Options, {"order": "nm", "split": 8, "tile": 0, "fusion": False}, "s")
    assert built == Options("nm", 8, 0, False)
    assert accepted(Options, "split") == {"minimum": 1, "maximum": 8}
    assert accepted(Options, "fusion") == {}


def test_the_visa_stage_declares_what_its_options_accept() -> None:
    from kiln.stages import visa

    assert accepted(visa.Options, "tile_order") == {"choices": ("mn", "nm")}
    assert accepted(visa.Options, "reduce_split") == {"minimum": 1, "maximum": 8}
    assert accepted(visa.Options, "vector_tile") == {"minimum": 0}
