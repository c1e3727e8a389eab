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
