"""Untrusted JSON (samples files, endpoint answers, head configs, shared databases' JSON columns)
parsed with bounds, so that a hostile document gives one ``ValueError`` naming its place instead
of a ``RecursionError``, an ``OverflowError`` later, or a quarter-hour in ``int()``.

Bounds, each stated in the error:

* nesting at most ``MAX_DEPTH`` arrays and objects deep (Python's decoder would recurse until the
  interpreter's limit and raise ``RecursionError``; the depth is checked on the raw bytes first,
  in linear time and at most about three bytes of memory per input byte, so nothing deep is ever
  built: see ``nesting_depth``);
* integers of at most ``MAX_INT_DIGITS`` digits and within a signed 64-bit integer (DuckDB's
  ``BIGINT``; Python would parse 4,300 digits and then refuse with a message that names no line);
* ``NaN`` and ``±Infinity`` only where the caller allows them (log-probabilities may be ``-inf``);
* a leading UTF-8 byte-order mark is dropped (Windows editors write one); text must be UTF-8.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

MAX_DEPTH = 64
MAX_INT_DIGITS = 19
INT_LIMIT = 2**63  # |value| < INT_LIMIT: a signed 64-bit integer
BOM = "\ufeff"

# The depth check works on the UTF-8 bytes (brackets, quotes and backslashes are ASCII, and no
# byte of a multi-byte UTF-8 character is ASCII), with ``bytes.replace`` and numpy over fixed-size
# chunks: no step keeps anything per character or per match. (The regular expression used before,
# a string literal as ``"(?:[^"\\]|\\.)*"``, kept a backtracking frame per character: about 120
# bytes of memory per character of one string, 24 GB for a 200 MB line; ``re.sub`` or ``split``
# would keep an object per string.)
_STEP = np.zeros(256, dtype=np.int8)  # +1 opens an array or object, −1 closes one
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1
_QUOTE = ord('"')
_DEPTH_CHUNK = 1 << 20  # bytes looked at a time: about 12 MiB of working arrays


class UntrustedJSONError(ValueError):
    """The text is not JSON within the bounds; the message names the place (``where``) and the bound."""


def nesting_depth(text: str | bytes) -> int:
    """The deepest nesting of arrays and objects in ``text`` (strings skipped): with ``o_i = +1``
    for ``[``/``{``, ``−1`` for ``]``/``}`` and 0 for every other byte or a byte inside a string,
    the largest prefix sum ``max_k Σ_{i≤k} o_i``.

    Escapes go first: every ``\\\\`` pair, then every ``\\"``, each removed left to right as the
    lexer pairs them, so each quote left opens or closes a string and a byte lies inside one when
    an odd number of quotes precede it. Linear time; memory at most two copies of the input plus
    a fixed ~12 MiB. Exact for valid JSON, and for invalid JSON up to the first byte the decoder
    refuses (a stray backslash outside a string), which is as deep as the decoder ever goes."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    codes = np.frombuffer(raw, dtype=np.uint8)
    depth = deepest = 0
    inside = 0  # 1 when the chunk so far ends inside a string
    for start in range(0, len(codes), _DEPTH_CHUNK):
        chunk = codes[start:start + _DEPTH_CHUNK]
        parity = np.cumsum(chunk == _QUOTE, dtype=np.int32)  # quotes up to and including each byte
        parity += inside
        parity &= 1  # odd: inside a string (a bracket is never a quote, so the quote itself does not matter)
        steps = _STEP[chunk]  # a fresh int8 array (fancy indexing copies)
        steps[parity.astype(bool)] = 0
        running = np.cumsum(steps, dtype=np.int32)  # |running| <= chunk length < 2**31
        deepest = max(deepest, depth + int(running.max()))
        depth, inside = depth + int(running[-1]), int(parity[-1])
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
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    raw = raw.removeprefix(BOM.encode("utf-8"))
    depth = nesting_depth(raw)  # before decoding: nothing is built from a document too deep
    if depth > max_depth:
        raise UntrustedJSONError(f"{where}: JSON nested {depth} deep; at most {max_depth} levels are accepted")
    if isinstance(text, str):
        text = text.removeprefix(BOM)
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise UntrustedJSONError(f"{where}: not UTF-8 text (byte {error.start})") from None
    del raw
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
