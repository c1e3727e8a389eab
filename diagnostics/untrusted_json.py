"""Untrusted JSON (samples files, endpoint answers, head configs, shared databases' JSON columns)
parsed with bounds, so that a hostile document gives one ``ValueError`` naming its place instead
of a ``RecursionError``, an ``OverflowError`` later, or a quarter-hour in ``int()``.

Bounds, each stated in the error:

* nesting at most ``MAX_DEPTH`` arrays and objects deep (Python's decoder would recurse until the
  interpreter's limit and raise ``RecursionError``; the depth is checked on the raw text first,
  in one linear pass, so nothing deep is ever built);
* integers of at most ``MAX_INT_DIGITS`` digits and within a signed 64-bit integer (DuckDB's
  ``BIGINT``; Python would parse 4,300 digits and then refuse with a message that names no line);
* ``NaN`` and ``±Infinity`` only where the caller allows them (log-probabilities may be ``-inf``);
* a leading UTF-8 byte-order mark is dropped (Windows editors write one); text must be UTF-8.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 64
MAX_INT_DIGITS = 19
INT_LIMIT = 2**63  # |value| < INT_LIMIT: a signed 64-bit integer
BOM = "\ufeff"

# Brackets outside strings: a string literal is skipped whole (escapes included).
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


class UntrustedJSONError(ValueError):
    """The text is not JSON within the bounds; the message names the place (``where``) and the bound."""


def nesting_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text`` (strings skipped), in one linear pass."""
    depth = deepest = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
    return deepest


def _bounded_int(where: str):
    def parse(digits: str) -> int:
        if len(digits.lstrip("-")) > MAX_INT_DIGITS:
            raise UntrustedJSONError(f"{where}: an integer of {len(digits.lstrip('-')):,} digits; at most {MAX_INT_DIGITS} are accepted")
        value = int(digits)
        if not -INT_LIMIT < value < INT_LIMIT:
            raise UntrustedJSONError(f"{where}: the integer {digits} does not fit 64 bits (|value| < 2^63)")
        return value

    return parse


def _no_constant(where: str):
    def parse(name: str) -> float:
        raise UntrustedJSONError(f"{where}: {name} is not a JSON number; write a finite number or null")

    return parse


def _finite_float(where: str):
    def parse(literal: str) -> float:
        value = float(literal)
        if value in (float("inf"), float("-inf")):
            raise UntrustedJSONError(f"{where}: the number {literal[:40]} overflows a float; write a finite number")
        return value

    return parse


def loads(text: str | bytes, where: str, *, max_depth: int = MAX_DEPTH, allow_non_finite: bool = False) -> Any:
    """``json.loads(text)`` within the bounds above; ``UntrustedJSONError`` (a ``ValueError``)
    beginning with ``where`` otherwise."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as error:
            raise UntrustedJSONError(f"{where}: not UTF-8 text (byte {error.start})") from None
    text = text.removeprefix(BOM)
    depth = nesting_depth(text)
    if depth > max_depth:
        raise UntrustedJSONError(f"{where}: JSON nested {depth} deep; at most {max_depth} levels are accepted")
    hooks: dict[str, Any] = {"parse_int": _bounded_int(where)}
    if not allow_non_finite:
        hooks["parse_constant"] = _no_constant(where)
        hooks["parse_float"] = _finite_float(where)
    try:
        return json.loads(text, **hooks)
    except json.JSONDecodeError as error:
        raise UntrustedJSONError(f"{where}: not valid JSON ({error.msg} at line {error.lineno} column {error.colno})") from None
    except RecursionError:  # not reached below MAX_DEPTH; kept so no input can raise it
        raise UntrustedJSONError(f"{where}: JSON nested too deep") from None


__all__ = ["INT_LIMIT", "MAX_DEPTH", "MAX_INT_DIGITS", "UntrustedJSONError", "loads", "nesting_depth"]
