"""The manifest's JSON Schema (SPEC 3.5), loaded from the one file in ``schema/``.

A wheel carries that file as ``shardspec/_schema/manifest.schema.json``; a source checkout
reads it from the repository's ``schema/`` folder. There is no second copy.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from .errors import Finding

__all__ = ["SCHEMA_FILE_NAME", "schema_bytes", "schema_findings", "manifest_schema"]

SCHEMA_FILE_NAME = "manifest.schema.json"


@cache
def schema_bytes() -> bytes:
    """The schema file's exact bytes."""
    packaged = resources.files("shardspec") / "_schema" / SCHEMA_FILE_NAME
    if packaged.is_file():
        return packaged.read_bytes()
    in_checkout = Path(__file__).resolve().parents[2] / "schema" / SCHEMA_FILE_NAME
    return in_checkout.read_bytes()


@cache
def manifest_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(schema_bytes())
    return schema


@cache
def _validator() -> Draft202012Validator:
    return Draft202012Validator(manifest_schema())


def _json_path(error: ValidationError) -> str:
    path = "$"
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _deepest(error: ValidationError) -> ValidationError:
    """For oneOf/anyOf failures, the most specific sub-error is the one a person can act on."""
    while error.context:
        error = max(error.context, key=lambda e: (len(e.absolute_path), -len(e.context or ())))
    return error


def schema_findings(data: Any, *, allow_unknown_fields: bool = False) -> Iterator[Finding]:
    """Every way ``data`` departs from the schema, as findings.

    With ``allow_unknown_fields`` (a manifest of a newer minor version, SPEC 4.3), fields the
    schema does not know are reported as warnings instead of errors.
    """
    for error in sorted(_validator().iter_errors(data), key=lambda e: list(map(str, e.path))):
        detail = _deepest(error)
        if detail.validator == "additionalProperties" and allow_unknown_fields:
            yield Finding(
                code="unknown-field",
                message=f"ignored a field this reader does not know: {detail.message}",
                json_path=_json_path(detail),
            )
            continue
        tensor = None
        path = list(detail.absolute_path)
        if len(path) >= 2 and path[0] == "tensors":
            tensor = str(path[1])
        yield Finding(
            code="schema",
            message=detail.message,
            tensor=tensor,
            json_path=_json_path(detail),
            hint="see schema/manifest.schema.json (`shardspec schema` prints it)",
        )
