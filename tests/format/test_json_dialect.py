"""SPEC 3.2-3.4: the strict JSON dialect shared by the manifest and safetensors headers."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardspec.format import json_dialect
from shardspec.format.json_dialect import (
    JSONProblem,
    _skeleton,
    count_members,
    decode_fast,
    parse_strict_json,
    parse_strict_json_numbers,
)
from shardspec.format.parse import parse_manifest

LIMITS = {"max_bytes": 1_000_000, "max_depth": 64}


def kind_of(data: bytes, **limits: int) -> str:
    with pytest.raises(JSONProblem) as info:
        parse_strict_json(data, **{**LIMITS, **limits})
    return info.value.kind


def test_plain_json_parses() -> None:
    assert parse_strict_json(b'{"a": [1, 2.5, "x", true, null]}', **LIMITS) == {
        "a": [1, 2.5, "x", True, None]
    }


def test_duplicate_name_is_refused() -> None:
    assert kind_of(b'{"a": 1, "a": 2}') == "duplicate-name"


def test_nested_duplicate_name_is_refused() -> None:
    assert kind_of(b'{"outer": [{"inner": {"k": 1, "k": 1}}]}') == "duplicate-name"


def test_same_name_in_different_objects_is_fine() -> None:
    assert parse_strict_json(b'{"a": {"k": 1}, "b": {"k": 2}}', **LIMITS) == {
        "a": {"k": 1}, "b": {"k": 2}}


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
def test_nonfinite_constants_are_refused(literal: bytes) -> None:
    assert kind_of(b'{"x": ' + literal + b"}") == "nonfinite"


@pytest.mark.parametrize("literal", [b"1e400", b"-1e400"])
def test_numbers_that_overflow_to_infinity_are_refused(literal: bytes) -> None:
    assert kind_of(b'{"x": ' + literal + b"}") == "nonfinite"


def test_byte_order_mark_is_refused() -> None:
    assert kind_of(b'\xef\xbb\xbf{"a": 1}') == "encoding"


def test_invalid_utf8_is_refused() -> None:
    assert kind_of(b'{"a": "\xff\xfe"}') == "encoding"


def test_lone_surrogate_escape_in_a_key_is_refused() -> None:
    assert kind_of(b'{"\\ud800": 1}') == "encoding"


def test_lone_surrogate_escape_in_a_value_is_refused() -> None:
    assert kind_of(b'{"a": ["ok", "\\ud800"]}') == "encoding"


def test_surrogate_pair_escape_is_fine() -> None:
    assert parse_strict_json(b'{"a": "\\ud83d\\ude00"}', **LIMITS) == {"a": "\U0001f600"}


def nested(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def test_depth_64_is_accepted() -> None:
    value = parse_strict_json(nested(64), **LIMITS)
    for _ in range(63):
        value = value[0]
    assert value == []


def test_depth_65_is_too_deep() -> None:
    assert kind_of(nested(65)) == "too-deep"


def test_objects_count_toward_depth() -> None:
    deep = b'{"a":' * 65 + b"1" + b"}" * 65
    assert kind_of(deep) == "too-deep"
    ok = b'{"a":' * 64 + b"1" + b"}" * 64
    parse_strict_json(ok, **LIMITS)


def test_pathological_nesting_is_too_deep_not_a_crash() -> None:
    assert kind_of(nested(200_000), max_bytes=1_000_000) == "too-deep"


def test_too_large_is_refused_before_parsing() -> None:
    data = b'{"a": "' + b"x" * 100 + b'"}'
    assert kind_of(data, max_bytes=len(data) - 1) == "too-large"
    parse_strict_json(data, max_bytes=len(data), max_depth=64)


@pytest.mark.parametrize("digits", [310, 4300, 4301, 5000, 100_000])
def test_huge_integer_literal_is_nonfinite_not_a_crash(digits: int) -> None:
    """SPEC 3.3 rule 2: an integer of 2^1024 or more is json-nonfinite, however long (Python
    refuses to convert one of over 4300 digits; its message must not leak through)."""
    for sign in (b"", b"-"):
        with pytest.raises(JSONProblem) as caught:
            parse_strict_json(b'{"a": ' + sign + b"1" * digits + b"}", max_bytes=10**6,
                              max_depth=64)
        assert caught.value.kind == "nonfinite"
        assert f"{digits} digits" in caught.value.message
        assert "int_max_str_digits" not in caught.value.message


@pytest.mark.parametrize("data", [b"", b"{", b'{"a": 1,}', b"{'a': 1}", b'{"a": 1} x',
                                  b'{"a": "\x01"}'])
def test_malformed_json_is_a_syntax_error(data: bytes) -> None:
    assert kind_of(data) == "syntax"


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b'{"a": 1, "a": 1}', "json-duplicate-name"),
        (b'{"a": NaN}', "json-nonfinite"),
        (b'{"a": 1e400}', "json-nonfinite"),
        (b'\xef\xbb\xbf{}', "json-encoding"),
        (b'{"\\ud800": 1}', "json-encoding"),
        (b"{", "json-syntax"),
        (nested(65), "json-too-deep"),
    ],
)
def test_parse_manifest_maps_dialect_problems_to_codes(data: bytes, code: str) -> None:
    parsed = parse_manifest(data)
    assert parsed.manifest is None
    assert [f.code for f in parsed.findings] == [code]
    assert parsed.findings[0].section.startswith("3.")


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)


def _depth_of(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth_of, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth_of, value), default=0)
    return 0


def _has_float(value: object) -> bool:
    if isinstance(value, dict):
        return any(map(_has_float, value.values()))
    if isinstance(value, list):
        return any(map(_has_float, value))
    return isinstance(value, float)


@given(_JSON_VALUES, st.booleans())
def test_depth_and_float_detection_on_raw_bytes_match_the_parsed_tree(
    value: object, ascii_only: bool
) -> None:
    data = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8")
    parsed, has_floats = parse_strict_json_numbers(data, max_bytes=1 << 20, max_depth=1000)
    assert parsed == value
    assert has_floats == _has_float(value)
    depth = _depth_of(value)
    if depth:
        with pytest.raises(JSONProblem):
            parse_strict_json_numbers(data, max_bytes=1 << 20, max_depth=depth - 1)


# --- the fast decoder: the same value as the strict parser, or no answer ----------------------


def fast(data: bytes, max_depth: int = 64) -> tuple[object, int] | None:
    return decode_fast(data, max_bytes=1 << 20, max_depth=max_depth)


@pytest.mark.parametrize("data", [
    b'\xef\xbb\xbf{"a": 1}',  # byte order mark
    b'{"a": "\xff"}', b'{"a": "\xc0\x80"}', b'{"a": "\xed\xa0\x80"}', b'{"a": "\xf4\x90\x80\x80"}',
    b'{"a": "\xe2\x82"}',  # not UTF-8: a stray byte, overlong, an encoded surrogate, too high, cut
    b'{"a": "\x01"}', b'{"a": "\t"}', b'{"a": "\x1f"}', b'{"a\x00": 1}',  # raw control characters
    b'{"a": NaN}', b'{"a": Infinity}', b'{"a": -Infinity}', b'{"a": 1e400}',
    b'{"a": 1.5}', b'{"a": 4.0}', b'{"a": 1E5}', b'{"a": -0.0}', b'[0e0]',  # fraction, exponent
    b'{"a": 12345678901234567890}', b'{"a": -' + b"9" * 20 + b"}", b'{"a": ' + b"9" * 5000 + b"}",
    b'{"a": "\\ud800"}', b'{"\\udfff": 1}', b'{"a": "\\ud83d\\ude00"}',  # surrogate escapes
    nested(65), nested(200_000), b'{"a":' * 65 + b"1" + b"}" * 65,
    b"", b"   ", b"{", b'{"a": 1,}', b"[1,]", b"{'a': 1}", b'{"a": 1} x', b'{"a": 1}{}',
    b"/* c */ {}", b'{"a": 01}', b'{"a": +1}', b'{"a": True}', b'\x0c{"a": 1}', b'{"a": "\\x"}',
])
def test_fast_decoder_gives_no_answer_where_the_strict_parser_may_differ(data: bytes) -> None:
    assert fast(data) is None


def test_fast_decoder_gives_no_answer_past_the_size_limit() -> None:
    data = b'{"a": "' + b"x" * 100 + b'"}'
    assert decode_fast(data, max_bytes=len(data) - 1, max_depth=64) is None
    assert decode_fast(data, max_bytes=len(data), max_depth=64) is not None


@pytest.mark.parametrize("data", [
    b' \t\r\n{"a": 1} \n\t', b"[]", b"{}", b"0", b'"x"', b"null", b"true", b"[false]",
    b'{"a": 1234567890123456789, "b": -1234567890123456789, "c": -0, "d": 9223372036854775808}',
    b'{"\\u00e9\\u0041": "\\/\\b\\f\\n\\r\\t\\"\\\\", "b": "a\\\\", "c": "\\\\\\""}',
    b'{"k:{[": ":,}]\\"", "x": {"y": [{"z": {}}, []]}}', "{\"é\": \"日本 😀\"}".encode(),
    nested(64), b'{"a":' * 64 + b"1" + b"}" * 64,
])
def test_fast_decoder_answers_like_the_strict_parser(data: bytes) -> None:
    answer = fast(data)
    assert answer is not None
    value, members = answer
    assert value == parse_strict_json(data, **LIMITS)
    assert members == count_members(value)


@pytest.mark.parametrize("data", [
    b'{"a": 1, "a": 1}', b'{"a": 1, "a": 2}', b'{"a": {"k": [1], "k": [1]}}',
    b'[{"x": 0}, {"y": {"z": 1, "z": 1}}]', b'{"\\u0061": 1, "a": 1}', b'{"a\\"": 1, "a\\"": 2}',
])
def test_fast_decoder_counts_the_members_a_duplicate_name_hides(data: bytes) -> None:
    answer = fast(data)
    assert answer is not None
    value, members = answer
    assert members == count_members(value) + 1
    assert kind_of(data) == "duplicate-name"


def _split_skeleton(data: bytes) -> bytes:
    """The skeleton as first written: split at quotes, keep the even-numbered chunks."""
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(unescaped.split(b'"')[0::2])


@given(st.binary(max_size=300) | st.lists(st.sampled_from(
    [b'"', b"\\", b"\\\\", b'\\"', b"a", b":", b"{", b"}", b"1", b" "]), max_size=60).map(b"".join))
def test_skeleton_keeps_the_bytes_outside_strings(data: bytes) -> None:
    assert _skeleton(data) == _split_skeleton(data)


def test_skeleton_carries_the_quote_parity_across_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_dialect, "_CHUNK", 3)
    data = b'{"ab": "c\\"d", "e": [1, "f:g"], "\\\\": 2}' * 3
    assert _skeleton(data) == _split_skeleton(data)


@given(_JSON_VALUES, st.booleans(), st.booleans())
def test_fast_decoder_agrees_with_the_strict_parser(
    value: object, ascii_only: bool, compact: bool
) -> None:
    data = json.dumps(value, ensure_ascii=ascii_only,
                      separators=(",", ":") if compact else None).encode("utf-8")
    answer = fast(data, max_depth=1000)
    strict = parse_strict_json(data, max_bytes=1 << 20, max_depth=1000)
    if answer is not None:
        assert answer == (strict, count_members(strict))
    # Where no number has a fraction, none has 20 digits and no escape is a surrogate, there is
    # an answer: the fast path is not quietly the slow one.
    if not (_has_float(value) or re.search(rb"[0-9]{20}", data)
            or re.search(rb"\\u[dD][89a-fA-F]", data)):
        assert answer is not None


@given(_JSON_VALUES.filter(lambda v: isinstance(v, dict) and len(v) > 0), st.data())
def test_fast_decoder_always_notices_a_duplicate_name(value: dict[str, object],
                                                      data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(value)))
    text = json.dumps(value).encode("utf-8")
    twice = b"{" + json.dumps(name).encode() + b": null, " + text[1:]
    answer = fast(twice, max_depth=1000)
    if answer is not None:
        assert answer[1] != count_members(answer[0])
