"""pipeline.yaml's JSON Schema: loading it, validating against it, and saying what is wrong.

jsonschema's own messages name neither the file nor the line, nor what to
write instead: ``validate_schema`` turns the most relevant error into a
PipelineError at the offending key, with expected, found and a hint.
jsonschema is imported only when a pipeline is validated.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.errors import PipelineError
from kiln.pipeline.yamlpos import describe, did_you_mean, join_path

if TYPE_CHECKING:
    from kiln.pipeline.defaults import LayeredSourceMap
    from kiln.pipeline.yamlpos import SourceMap

    Positions = SourceMap | LayeredSourceMap  # a file's positions, or pipeline.yaml's + Kiln's

SCHEMA_PATH = Path(__file__).with_name("pipeline.schema.json")
_validator: Any = None


def load_schema() -> dict[str, Any]:
    """The JSON Schema of pipeline.yaml (draft 2020-12), as a dict."""
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def _get_validator() -> Any:
    global _validator
    if _validator is None:
        from jsonschema import Draft202012Validator, validators

        def is_integer(_checker: Any, value: Any) -> bool:  # 3.0 is not a dim size
            return isinstance(value, int) and not isinstance(value, bool)

        checker = Draft202012Validator.TYPE_CHECKER.redefine("integer", is_integer)
        cls = validators.extend(Draft202012Validator, type_checker=checker)
        schema = load_schema()
        _validator = cls(_inline_refs(schema, schema.pop("$defs")))
    return _validator


def _inline_refs(node: Any, defs: dict[str, Any]) -> Any:
    """Replace each local ``{"$ref": "#/$defs/x"}`` by a copy of x (the schema has no cycles).

    Resolving thousands of $refs was most of the validation time of a large
    pipeline; sibling annotations (title, description) override the target's.
    """
    if isinstance(node, list):
        return [_inline_refs(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _inline_refs(value, defs) for key, value in node.items()}
    ref = node.pop("$ref", None)
    if ref is None:
        return node
    target = _inline_refs(defs[ref.removeprefix("#/$defs/")], defs)
    if set(node) <= {"title", "description"}:
        return {**target, **node}
    return {**node, "allOf": [target]}


def validate_schema(data: dict[str, Any], smap: Positions) -> None:
    """PipelineError at the key of the most relevant schema violation in ``data``, if any."""
    from jsonschema.exceptions import best_match

    error = best_match(_get_validator().iter_errors(data))
    if error is not None:
        raise _translate(error, smap)


INPUT_TITLE = "argument input"  # the schema's title of one argument's input spec
INPUT_FORMS = "one distribution: {normal: {mean: 0, std: 1}}, {integers: {low: 0, high: 10}}, ..."


def _input_problem(
    kind: str, value: Any, path: str, kinds: list[str], smap: Positions
) -> PipelineError:
    """A spec under ``inputs:`` that is not one ``{distribution: parameters}`` mapping."""
    arg = path.rsplit(".", 1)[-1]
    hint = None
    if isinstance(value, str) and value in kinds:
        hint = f"write `{arg}: {{{value}: {{}}}}` for the defaults of {value}"
    elif isinstance(value, str) and value.endswith(".npy"):
        hint = f"write `{arg}: {{npy: {value}}}`"
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        hint = f"write `{arg}: {{constant: {value}}}` for a constant"
    if kind == "maxProperties":
        message = f"the input of argument '{arg}' names {len(value)} distributions"
    else:
        message = f"the input of argument '{arg}' names no distribution"
    return smap.error(
        message, path, value=True, expected=INPUT_FORMS, found=describe(value), hint=hint
    )


_TYPE_WORDS = {"object": "a mapping", "array": "a list", "string": "a string", "null": "null"}
_TYPE_WORDS |= {"integer": "an integer", "number": "a number", "boolean": "a boolean"}
_RANGE_WORDS = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}


def _translate(error: Any, smap: Positions) -> PipelineError:
    """Turn one jsonschema error into a PipelineError at the right key."""
    parts = list(error.absolute_path)
    path = join_path(parts)
    where = f"'{path}'" if path else "the top level"
    schema = error.schema if isinstance(error.schema, dict) else {}
    kind, rule, value = error.validator, error.validator_value, error.instance
    if "propertyNames" in error.relative_schema_path and kind == "enum":  # a key from a list
        message = f"unknown {schema.get('title', 'key')} '{value}' in {where}"
        key_path = join_path([*parts, value])
        expected, hint = "one of: " + ", ".join(rule), did_you_mean(value, rule)
        return smap.error(message, key_path, expected=expected, found=repr(value), hint=hint)
    if "propertyNames" in error.relative_schema_path:  # a badly formed key: point at the key
        fixed = str(value).replace("-", "_").replace(".", "_")
        hint = f"did you mean '{fixed}'?" if fixed.isidentifier() and fixed != value else None
        expected = f"{schema.get('title', 'a name')} (pattern {schema.get('pattern')})"
        message = f"invalid name '{value}' in {where}"
        key_path = join_path([*parts, value])
        return smap.error(message, key_path, expected=expected, found=repr(value), hint=hint)
    if schema.get("title") == INPUT_TITLE and kind != "additionalProperties":
        return _input_problem(kind, value, path, list(schema.get("properties", {})), smap)
    if kind == "additionalProperties":
        allowed = list(schema.get("properties", {}))
        key = next(k for k in value if k not in allowed)
        message = f"unknown key '{key}'" + (f" in {where}" if path else "")
        if schema.get("title") == INPUT_TITLE:
            message = f"unknown input distribution '{key}' for argument '{parts[-1]}'"
        expected, hint = "one of: " + ", ".join(allowed), did_you_mean(key, allowed)
        key_path = join_path([*parts, key])
        return smap.error(message, key_path, expected=expected, found=repr(key), hint=hint)
    if kind == "required":
        name = next(r for r in rule if r not in value)
        message = f"missing required key '{name}'" + (f" in {where}" if path else "")
        expected = "required keys: " + ", ".join(rule)
        written = [k for k in value if not smap.is_builtin(join_path([*parts, k]))]
        found = "keys: " + (", ".join(written) or "(none)")
        return smap.error(message, join_path([*parts, name]), expected=expected, found=found)
    if kind == "uniqueItems" and isinstance(value, list):  # point at the second one
        first, again = _repeated(value)
        item = join_path([*parts, again])
        return smap.error(
            f"{where} lists an item twice: {value[again]!r}",
            item,
            value=True,
            expected="each item once",
            found=f"{value[again]!r} at {join_path([*parts, first])} and {item}",
            hint=f"remove the second {value[again]!r}",
        )
    message, expected, found, hint = _value_problem(kind, rule, value, schema, path, where)
    return smap.error(
        message or error.message, path, value=True, expected=expected, found=found, hint=hint
    )


def _repeated(items: list[Any]) -> tuple[int, int]:
    """The indexes of the first item that comes again, and of its second place."""
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        key = repr(item)
        if key in seen:
            return seen[key], i
        seen[key] = i
    return 0, 0


def _value_problem(
    kind: str, rule: Any, value: Any, schema: dict[str, Any], path: str, where: str
) -> tuple[str | None, str | None, str | None, str | None]:
    """(message, expected, found, hint) for a bad value; message None if unrecognised."""
    title = schema.get("title")
    if kind == "type":
        types = [rule] if isinstance(rule, str) else rule
        expected = " or ".join(_TYPE_WORDS.get(t, t) for t in types)
        expected += f" ({title})" if title else ""
        return f"wrong type for {where}", expected, describe(value), _type_hint(types, value)
    if kind in _RANGE_WORDS:
        integer = isinstance(value, int) and "integer" in str(schema.get("type"))
        expected = number_range(schema, "an integer" if integer else "a number")
        if isinstance(value, float) and not math.isfinite(value):
            return f"{where} is not a finite number", expected, _yaml_float(value), None
        return f"value out of range for {where}", expected, repr(value), None
    if kind == "enum":
        expected = "one of: " + ", ".join(map(str, rule))
        return f"invalid value for {where}", expected, describe(value), did_you_mean(value, rule)
    if kind == "pattern":
        expected = f"{title or 'a string'} (pattern {rule})"
        return f"invalid {title or 'value'} for {where}", expected, repr(value), None
    keys = path.split(".")
    if kind == "minProperties" and keys[0] == "kernels" and keys[2:3] == ["shapes"]:
        if len(keys) == 4:
            message = f"shape set '{keys[3]}' of kernel '{keys[1]}' binds no dims"
            return message, "at least one dim binding such as `{M: 64}`", "an empty mapping", None
        message = f"kernel '{keys[1]}' has no shape sets"
        return message, "shape sets such as `small: {M: 64}`", "an empty mapping", None
    if kind in ("minItems", "maxItems") and schema.get("minItems") == schema.get("maxItems"):
        message = f"wrong number of items in {where}"
        return message, f"exactly {rule} items", f"{len(value)} items", None
    if kind in ("minItems", "minProperties", "minLength") and rule == 1:
        return f"{where} must not be empty", "at least one entry", describe(value), None
    return None, None, None, None


def number_range(schema: dict[str, Any], noun: str) -> str:
    """What a number must be, from all its schema bounds: "a finite number >= 0.001 and <= 10"."""
    bounds = [f"{_RANGE_WORDS[k]} {_number_text(schema[k])}" for k in _RANGE_WORDS if k in schema]
    if noun == "a number":
        noun = "a finite number"
    return " and ".join([f"{noun} {bounds[0]}", *bounds[1:]]) if bounds else noun


def _number_text(number: float) -> str:
    return str(int(number)) if isinstance(number, float) and number.is_integer() else str(number)


def _yaml_float(value: float) -> str:
    """How YAML spells a non-finite float: .nan, .inf, -.inf."""
    return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")


def check_finite(data: Any, smap: Positions) -> None:
    """PipelineError at the first NaN or infinity where the schema asks for a number.

    JSON Schema has no word for "finite" and NaN passes every bound, so a
    `.nan` clock or tolerance would pass validation and break a build (or
    make every check pass): this walks the data beside the schema.
    """
    problem = _first_non_finite(data, _get_validator().schema, [])
    if problem is None:
        return
    parts, schema, value = problem
    path = join_path(parts)
    raise smap.error(
        f"'{path}' is not a finite number",
        path,
        value=True,
        expected=number_range(schema, "a number"),
        found=_yaml_float(value),
        hint="write a number such as 1.5 or 1e-5 (.nan and .inf are not numbers Kiln can use)",
    )


def _first_non_finite(value: Any, schema: Any, parts: list) -> tuple[list, dict, float] | None:
    if not isinstance(schema, dict):
        return None
    for sub in schema.get("allOf", ()):
        found = _first_non_finite(value, sub, parts)
        if found is not None:
            return found
    if isinstance(value, float):
        types = schema.get("type")
        numeric = "number" in (types if isinstance(types, list) else [types])
        return (parts, schema, value) if numeric and not math.isfinite(value) else None
    if isinstance(value, dict):
        props, extra = schema.get("properties", {}), schema.get("additionalProperties")
        for key, item in value.items():
            found = _first_non_finite(item, props.get(key, extra), [*parts, key])
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _first_non_finite(item, schema.get("items"), [*parts, i])
            if found is not None:
                return found
    return None


def _type_hint(types: list[str], value: Any) -> str | None:
    """How to write a value YAML typed otherwise than meant: `yes` is a boolean, "8" a string."""
    if "string" in types and isinstance(value, bool):
        return "YAML reads unquoted yes/no/on/off/true/false as a boolean: quote the word"
    if "string" in types and isinstance(value, int | float):
        return f'quote it to make it a string: "{value}"'
    if "integer" in types and isinstance(value, float) and value.is_integer():
        if abs(value) >= 1e16:  # past float's exact whole numbers: its digits mean nothing
            return "write it as a whole number without a dot or exponent"
        return f"write it as a whole number without a dot or exponent: {int(value)}"
    if isinstance(value, str) and ("integer" in types or "number" in types):
        text = value.strip()
        try:
            number = float(text) if "number" in types else int(text)
        except ValueError:
            return None
        if not math.isfinite(number):  # unquoted, nan and inf are words to YAML too
            return None
        return f"write the number without quotes: {text}"  # as written: 1e-5, not 1e-05
    if isinstance(value, str) and "boolean" in types and value.lower() in ("true", "false"):
        return f"write {value.lower()} without quotes"
    return None
