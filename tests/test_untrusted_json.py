"""The bounded JSON parser refuses deep nesting, huge integers and non-finite numbers in one line."""

import pytest

from diagnostics.untrusted_json import UntrustedJSONError, loads, nesting_depth


def test_plain_documents_parse():
    assert loads('{"a": [1, 2.5, "x[{"], "b": null}', "f") == {"a": [1, 2.5, "x[{"], "b": None}
    assert loads(b'\xef\xbb\xbf{"a": 1}', "f") == {"a": 1}  # a UTF-8 BOM is dropped
    assert loads('[-9223372036854775807]', "f") == [-(2**63) + 1]


def test_depth_is_counted_outside_strings():
    assert nesting_depth('{"a": "[[[[[[", "b": [[1]]}') == 3
    assert nesting_depth('["\\"[[["]') == 1


@pytest.mark.parametrize("text, words", [
    ("[" * 100_000 + "]" * 100_000, "nested 100000 deep"),
    ("[" * 65 + "]" * 65, "nested 65 deep"),
    ("1" * 5000, "5,000 digits"),
    ("9223372036854775808", "does not fit 64 bits"),
    ("[NaN]", "NaN is not a JSON number"),
    ("[1e999]", "overflows a float"),
    ('{"a": ', "not valid JSON"),
    (b"\xff\xfe", "not UTF-8"),
])
def test_hostile_documents_give_one_line(text, words):
    with pytest.raises(UntrustedJSONError) as error:
        loads(text, "samples.jsonl line 3")
    message = str(error.value)
    assert message.startswith("samples.jsonl line 3: ") and words in message and "\n" not in message


def test_non_finite_allowed_where_asked():
    assert loads("[-Infinity]", "f", allow_non_finite=True) == [float("-inf")]


def _reference_depth(text: str) -> int:
    """A reference lexer, one character at a time: inside a string a backslash skips the next character."""
    depth = deepest = 0
    inside = escaped = False
    for char in text:
        if inside:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                inside = False
        elif char == '"':
            inside = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _random_value(rng, depth: int):
    kind = rng.randrange(4 if depth < 6 else 2)
    if kind == 0:
        return rng.randrange(-5, 5)
    if kind == 1:  # strings made of the characters that fool a lexer: quotes, backslashes, brackets
        return "".join(rng.choice(['"', "\\", "[", "]", "{", "}", "a", "\\\\", '\\"', "é"]) for _ in range(rng.randrange(8)))
    if kind == 2:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {_random_value(rng, 6): _random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def test_depth_agrees_with_a_reference_lexer_on_tricky_strings():
    """Everyday, 0.3 s: 2,000 random documents whose strings are made of quotes, backslashes and
    brackets (json.dumps escapes them), and their texts cut at random places (invalid JSON)."""
    import json
    import random

    rng = random.Random(7)
    for _ in range(2000):
        text = json.dumps(_random_value(rng, 0), ensure_ascii=rng.random() < 0.5)
        assert nesting_depth(text) == _reference_depth(text), text
        cut = text[: rng.randrange(len(text) + 1)]
        assert nesting_depth(cut) == _reference_depth(cut), cut


def test_depth_check_memory_does_not_grow_per_character():
    """Everyday, 0.2 s. An 8 MB line of one string made of escaped quotes (and one of many short
    strings) is checked with at most one copy of the line plus a fixed working set; the regular
    expression used before kept ~100 bytes per character (800 MB here, 24 GB for a 200 MB line)."""
    import tracemalloc

    size = 8 * 2**20
    for line in (b'{"a": "' + b'\\"' * (size // 2) + b'", "b": [[1]]}', b"[" + b'"a",' * (size // 4) + b"[[1]]]"):
        tracemalloc.start()
        try:
            depth = nesting_depth(line)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert depth in (2, 3)
        assert peak < len(line) + 64 * 2**20, f"{peak / 2**20:.0f} MiB for a {len(line) / 2**20:.0f} MiB line"
