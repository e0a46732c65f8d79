"""The strict JSON dialect of SPEC 3: UTF-8, no duplicate names, no NaN/Infinity, bounded.

Used for the manifest and for safetensors headers, so both parsers agree on what JSON is.
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import Any

__all__ = ["JSONProblem", "parse_strict_json", "parse_strict_json_numbers"]


class JSONProblem(Exception):
    """Why bytes are not acceptable JSON; ``kind`` is one of the SPEC 3 rule names."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        #: "encoding", "syntax", "duplicate-name", "nonfinite", "too-large" or "too-deep"
        self.kind = kind
        self.message = message


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):  # rare: only then look for the name to report
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise JSONProblem("duplicate-name", f"the name {key!r} appears twice in one object")
            seen.add(key)
    return obj


def _reject_constant(name: str) -> Any:
    raise JSONProblem("nonfinite", f"{name} is not allowed (I-JSON)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JSONProblem("nonfinite", f"the number {text} is out of range (I-JSON)")
    return value


_NOT_BRACKETS = bytes(range(256)).translate(None, b"[]{}")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_NON_INTEGER_NUMBER = re.compile(rb"[0-9][.eE]")


def _skeleton(data: bytes) -> bytes:
    """A valid JSON text with every string's content removed: numbers, literals, punctuation.

    In valid JSON a backslash occurs only inside strings, as an escape read from the left, so
    dropping escaped backslashes and then escaped quotes leaves only delimiting quotes; the
    even-numbered chunks between them are what lies outside strings. All at C speed.
    """
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(unescaped.split(b'"')[0::2])


#: +1 for an opening bracket, -1 for a closing one: nesting depth by table look-up.
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


def _depth(skeleton: bytes) -> int:
    """Deepest nesting of a valid JSON text with its strings removed."""
    return max(accumulate(map(_STEP.__getitem__, skeleton.translate(None, _NOT_BRACKETS))),
               default=0)


def _check_string(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise JSONProblem(
            "encoding", f"the string {text!r} is not valid Unicode (a lone surrogate escape)"
        ) from None


def _check_strings(value: Any) -> None:
    """Every string and name is valid Unicode (no lone surrogate from a \\u escape)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                _check_string(key)
                stack.append(child)
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            _check_string(item)


def parse_strict_json(data: bytes, *, max_bytes: int, max_depth: int) -> Any:
    """Parse ``data`` as SPEC 3 JSON, raising :class:`JSONProblem` on any departure."""
    return parse_strict_json_numbers(data, max_bytes=max_bytes, max_depth=max_depth)[0]


def parse_strict_json_numbers(data: bytes, *, max_bytes: int, max_depth: int) -> tuple[Any, bool]:
    """Like :func:`parse_strict_json`; also says whether any number has a fraction or exponent.

    SPEC 3.3 rule 3 wants integer tokens where the schema says integer; knowing that no number
    anywhere has a fraction or exponent lets the schema check skip that question.
    """
    if len(data) > max_bytes:
        raise JSONProblem("too-large", f"{len(data)} bytes is over the limit of {max_bytes}")
    if data.startswith(b"\xef\xbb\xbf"):
        raise JSONProblem("encoding", "a UTF-8 byte order mark is not allowed")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JSONProblem("encoding", f"not valid UTF-8 at byte {exc.start}") from None
    try:
        value = json.loads(
            text,
            object_pairs_hook=_reject_duplicates,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
        )
    except RecursionError:
        raise JSONProblem("too-deep", f"nesting is deeper than {max_depth}") from None
    except json.JSONDecodeError as exc:
        raise JSONProblem(
            "syntax", f"{exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except ValueError as exc:  # e.g. an integer with more digits than Python will convert
        raise JSONProblem("syntax", str(exc)) from None
    skeleton = _skeleton(data)
    if _depth(skeleton) > max_depth:
        raise JSONProblem("too-deep", f"nesting is deeper than {max_depth}")
    if _SURROGATE_ESCAPE.search(data):
        _check_strings(value)
    return value, _NON_INTEGER_NUMBER.search(skeleton) is not None
