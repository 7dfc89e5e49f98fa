"""Validation of client-supplied values, shared by every protocol (native, Realtime, WebRTC, file form).

Each helper checks one value and returns it in its Python type, or raises `ValidationError(field,
message)`; a transport turns that into its own wire error (`bad_field`, `invalid_value`, HTTP 400).
Numbers must be finite (no NaN, no ±Infinity, no 10**400 that no float can hold), integers where a
field is documented as one (`16000.0` is refused), inside the documented range. JSON text is
parsed with a nesting limit, so that no message can drive the parser or a handler into recursion.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable

MAX_DEPTH = 32
"""Deepest nesting of arrays/objects a client message may have; the protocols need 4."""


class ValidationError(ValueError):
    """A value a client sent is not acceptable: `field` names it (dotted path), `message` says why."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def show(value: Any, limit: int = 60) -> str:
    """A short, safe rendering of a client value for an error message."""
    try:
        text = json.dumps(value)
    except (ValueError, TypeError, RecursionError, OverflowError):
        text = type(value).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def number(value: Any, field: str, low: float | None = None, high: float | None = None, *,
           open_low: bool = False, open_high: bool = False, integer: bool = False) -> float | int:
    """A finite JSON number (not a bool) in [low, high] (ends excluded when `open_*`); with
    `integer`, a JSON integer (no fraction, no `.0`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValidationError(field, f"must be {'an integer' if integer else 'a number'}, not {show(value)}")
    if integer and not isinstance(value, int):
        raise ValidationError(field, f"must be an integer, not {show(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValidationError(field, f"must be a finite number, not {value}")
    if isinstance(value, int) and abs(value) > 2**53:  # 10**400 parses as an int: keep floats exact
        raise ValidationError(field, f"{show(value, 24)} is out of range")
    below = low is not None and (value <= low if open_low else value < low)
    above = high is not None and (value >= high if open_high else value > high)
    if below or above:
        lo = "" if low is None else f"{low:g} {'<' if open_low else '<='} "
        hi = "" if high is None else f" {'<' if open_high else '<='} {high:g}"
        raise ValidationError(field, f"{show(value, 24)} is outside {lo}x{hi}")
    return int(value) if integer else float(value)


def integer(value: Any, field: str, low: int | None = None, high: int | None = None) -> int:
    return number(value, field, low, high, integer=True)


def number_text(value: str, field: str, low: float | None = None, high: float | None = None, **kw) -> float:
    """A number sent as text (a form field): parsed, then checked like `number`."""
    try:
        parsed = float(value.strip())
    except (ValueError, AttributeError):
        raise ValidationError(field, f"must be a number, not {show(value)}") from None
    return number(parsed, field, low, high, **kw)


def boolean(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise ValidationError(field, f"must be true or false, not {show(value)}")
    return value


def boolean_text(value: str, field: str) -> bool:
    """`true`/`false` as a form field."""
    text = value.strip().lower() if isinstance(value, str) else None
    if text not in ("true", "false"):
        raise ValidationError(field, f"must be true or false, not {show(value)}")
    return text == "true"


def choice(value: Any, field: str, choices: Iterable[str]) -> str:
    """One of `choices` (strings; an unhashable or non-string value is refused, not raised on)."""
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        raise ValidationError(field, f"must be one of {', '.join(choices)}, not {show(value)}")
    return value


def string(value: Any, field: str, *, max_length: int, min_length: int = 0) -> str:
    if not isinstance(value, str):
        raise ValidationError(field, f"must be a string, not {show(value)}")
    if not min_length <= len(value) <= max_length:
        raise ValidationError(field, f"must be {min_length} to {max_length} characters long, not {len(value)}")
    return value


def obj(value: Any, field: str, *, nullable: bool = False) -> dict:
    """A JSON object (`null` as `{}` when `nullable`)."""
    if value is None and nullable:
        return {}
    if not isinstance(value, dict):
        raise ValidationError(field, f"must be an object{' or null' if nullable else ''}, not {show(value)}")
    return value


def depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """Nesting depth of a parsed JSON value (iterative); stops counting past `limit`."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, d)
            if deepest > limit:
                return deepest
            stack.extend((child, d + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def parse_json(text: str | bytes, field: str = "message", max_depth: int = MAX_DEPTH) -> Any:
    """`json.loads` with a nesting limit; ValidationError for invalid or too deeply nested JSON."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValidationError(field, f"nested deeper than {max_depth} levels") from None
    except (ValueError, TypeError) as e:
        raise ValidationError(field, f"not valid JSON: {e}") from None
    if depth(value, max_depth) > max_depth:
        raise ValidationError(field, f"nested deeper than {max_depth} levels")
    return value
