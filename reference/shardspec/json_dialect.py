"""The strict JSON dialect of SPEC 3: UTF-8, no duplicate names, no NaN/Infinity, bounded.

Used for the manifest and for safetensors headers, so both parsers agree on what JSON is.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["JSONProblem", "parse_strict_json"]


class JSONProblem(Exception):
    """Why bytes are not acceptable JSON; ``kind`` is one of the SPEC 3 rule names."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        #: "encoding", "syntax", "duplicate-name", "nonfinite", "too-large" or "too-deep"
        self.kind = kind
        self.message = message


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise JSONProblem("duplicate-name", f"the name {key!r} appears twice in one object")
        obj[key] = value
    return obj


def _reject_constant(name: str) -> Any:
    raise JSONProblem("nonfinite", f"{name} is not allowed (I-JSON)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JSONProblem("nonfinite", f"the number {text} is out of range (I-JSON)")
    return value


def _check_tree(value: Any, max_depth: int) -> None:
    """Check nesting depth and that every string is valid Unicode (no lone surrogates)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            if depth > max_depth:
                raise JSONProblem("too-deep", f"nesting is deeper than {max_depth}")
            for key, child in item.items():
                _check_string(key)
                stack.append((child, depth + 1))
        elif isinstance(item, list):
            if depth > max_depth:
                raise JSONProblem("too-deep", f"nesting is deeper than {max_depth}")
            stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, str):
            _check_string(item)


def _check_string(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise JSONProblem(
            "encoding", f"the string {text!r} is not valid Unicode (a lone surrogate escape)"
        ) from None


def parse_strict_json(data: bytes, *, max_bytes: int, max_depth: int) -> Any:
    """Parse ``data`` as SPEC 3 JSON, raising :class:`JSONProblem` on any departure."""
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
    _check_tree(value, max_depth)
    return value
