"""Findings and errors: every code has a family, a SPEC section and a readable message."""

from __future__ import annotations

import re

import pytest

from shardspec.format.errors import (
    CODES,
    Finding,
    IntegrityError,
    ShardspecError,
    raise_first_error,
)


@pytest.mark.parametrize("code", sorted(CODES))
def test_every_code_is_well_formed(code: str) -> None:
    entry = CODES[code]
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", code)
    assert re.fullmatch(r"\d+(\.\d+)?", entry.section)
    assert entry.severity in ("error", "warning")
    assert issubclass(entry.error, ShardspecError) and entry.error is not ShardspecError
    assert entry.summary


def test_finding_text_names_everything() -> None:
    finding = Finding(code="file-size", message="too short", file="a.safetensors", tensor="w",
                      json_path="$.ranks[0]", hint="download it again")
    assert str(finding) == ("[file-size] too short (file 'a.safetensors', tensor 'w', at "
                            "$.ranks[0]) — SPEC 9.1. Hint: download it again")
    assert finding.to_dict() == {
        "code": "file-size", "severity": "error", "section": "9.1", "message": "too short",
        "file": "a.safetensors", "tensor": "w", "json_path": "$.ranks[0]",
        "hint": "download it again"}


def test_finding_without_location() -> None:
    finding = Finding(code="not-committed", message="no manifest")
    assert str(finding) == "[not-committed] no manifest — SPEC 2.3"
    assert set(finding.to_dict()) == {"code", "severity", "section", "message"}


def test_error_carries_its_finding() -> None:
    finding = Finding(code="checksum-mismatch", message="differs", file="x")
    error = IntegrityError(finding)
    assert error.finding is finding and error.code == "checksum-mismatch"
    assert error.section == "9.2" and str(error) == str(finding)


def test_raise_first_error_returns_warnings_or_raises_the_first_error() -> None:
    warning = Finding(code="extension-ignored", message="w")
    assert raise_first_error([warning]) == [warning]
    first = Finding(code="coverage-gap", message="a", tensor="t")
    with pytest.raises(ShardspecError) as info:
        raise_first_error([warning, first, Finding(code="file-missing", message="b")])
    assert info.value.finding is first
    assert type(info.value).__name__ == "TensorRecordError"
