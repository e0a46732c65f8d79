"""The manifest's JSON Schema (SPEC 3.5), loaded from the one file in ``schema/``.

A wheel carries that file as ``shardspec/_schema/manifest.schema.json``; a source checkout
reads it from the repository's ``schema/`` folder. There is no second copy.

Two validators read that one file: ``jsonschema-rs`` (compiled, about 80x faster) answers
"valid or not" on the load path, where every rank checks the whole manifest; the ``jsonschema``
reference implementation explains what is wrong when something is, and handles newer minor
versions. Without ``jsonschema-rs`` installed, ``jsonschema`` does both.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError

from .errors import Finding

__all__ = [
    "SCHEMA_FILE_NAME",
    "is_valid",
    "is_valid_if_piece_files_listed",
    "manifest_schema",
    "MAX_SCHEMA_FINDINGS",
    "schema_bytes",
    "schema_findings",
]

SCHEMA_FILE_NAME = "manifest.schema.json"


@cache
def schema_bytes() -> bytes:
    """The schema file's exact bytes."""
    packaged = resources.files("shardspec") / "_schema" / SCHEMA_FILE_NAME
    if packaged.is_file():
        return packaged.read_bytes()
    in_checkout = Path(__file__).resolve().parents[3] / "schema" / SCHEMA_FILE_NAME
    return in_checkout.read_bytes()


@cache
def manifest_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(schema_bytes())
    return schema


def _is_integer_token(checker: object, instance: object) -> bool:
    # SPEC 3.3: integers are written as integer tokens; JSON Schema alone would accept 4.0.
    return isinstance(instance, int) and not isinstance(instance, bool)


@cache
def _ecma(pattern: str) -> re.Pattern[str]:
    """``pattern`` with ECMA-262's ``$`` (SPEC 3.5): the end of the string only. Python's ``$``
    also matches before a final newline, so ``"1.2\n"`` would pass the version's pattern."""
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"(?![\s\S])"
    return re.compile(pattern)


def _ecma_pattern(validator: Any, pattern: str, instance: Any, schema: Any
                  ) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _ecma(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


_StrictValidator = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    validators={"pattern": _ecma_pattern},
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer_token),
)


@cache
def _validator() -> Draft202012Validator:
    validator: Draft202012Validator = _StrictValidator(manifest_schema())
    return validator


def _open_objects(node: Any) -> Any:
    """The schema with every ``additionalProperties: false`` dropped: unknown fields allowed."""
    if isinstance(node, dict):
        return {key: _open_objects(value) for key, value in node.items()
                if not (key == "additionalProperties" and value is False)}
    if isinstance(node, list):
        return [_open_objects(value) for value in node]
    return node


@cache
def _open_validator() -> Draft202012Validator:
    """Checks a newer minor version's manifest: everything but unknown fields (SPEC 4.3).

    Integer tokens stay strict (SPEC 3.3 rule 3): ``4.0`` is not an integer in any version.
    """
    validator: Draft202012Validator = _StrictValidator(_open_objects(manifest_schema()))
    return validator


@cache
def _fast_validator() -> Any:
    try:
        import jsonschema_rs
    except ImportError:  # optional accelerator: the reference validator still answers
        return None
    return jsonschema_rs.validator_for(manifest_schema())


def _piece_files_as_strings(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with each piece's ``file`` checked only to be a string.

    In the schema a piece's file is a ``$defs/path``, whose pattern (lookarounds, run by a
    backtracking regex engine) took 88% of ``jsonschema-rs``'s time on a 100,000-piece manifest.
    Where every piece's file is one of its rank's listed files, each of which was checked as a
    ``$defs/path`` under ``ranks``, checking it again cannot fail. Should the schema's pieces
    ever look different, the schema is returned as it is: slower, never wrong.
    """
    derived = copy.deepcopy(schema)
    pieces = [derived["$defs"].get(kind, {}) for kind in ("global_piece", "local_piece")]
    files = [piece.get("properties", {}).get("file") for piece in pieces]
    if any(file != {"$ref": "#/$defs/path"} for file in files):
        return schema
    for piece in pieces:
        piece["properties"]["file"] = {"type": "string"}
    return derived


@cache
def _listed_files_validator() -> Any:
    try:
        import jsonschema_rs
    except ImportError:
        return None
    return jsonschema_rs.validator_for(_piece_files_as_strings(manifest_schema()))


def is_valid_if_piece_files_listed(data: Any) -> bool | None:
    """Whether ``data`` matches the schema, provided every piece's ``file`` is a listed file.

    The fast path's schema check (:mod:`shardspec.format.parse_fast`): True is a promise only once
    the caller has also checked that each piece's file is among its rank's files, as
    :func:`shardspec.format.checks_fast.is_sound` does. ``jsonschema-rs`` takes 4.0 for an
    integer, SPEC 3.3 does not: a float anywhere but in a free-form value is for the caller to
    refuse (the fast path counts them). None where ``jsonschema-rs`` is not installed.
    """
    validator = _listed_files_validator()
    return None if validator is None else bool(validator.is_valid(data))


def _has_float(data: Any) -> bool:
    """Whether any number was written with a fraction or exponent (SPEC 3.3 rule 3 needs care)."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, float):
            return True
    return False


def is_valid(data: Any, *, has_floats: bool | None = None) -> bool:
    """Whether ``data`` matches the schema: the fast check used before any detail is needed.

    ``has_floats`` (whether any number is a float; None: look) is known to the JSON parser.
    """
    fast = _fast_validator()
    if has_floats is None:
        has_floats = _has_float(data)
    # A float may sit where the schema wants an integer token, which only the reference
    # validator's strict type checker refuses; floats are rare in a manifest.
    if fast is None or has_floats:
        return not any(True for _ in _validator().iter_errors(data))
    return bool(fast.is_valid(data))


def _json_path(error: ValidationError) -> str:
    path = "$"
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _deepest(error: ValidationError) -> ValidationError:
    """For oneOf/anyOf failures, the most specific sub-error is the one a person can act on.

    It is taken from the branch the instance comes closest to (fewest errors), so a rank-local
    tensor with a typo is told about the typo, not that global tensors need an offset.
    """
    while error.context:
        branches: dict[Any, list[ValidationError]] = {}
        for sub in error.context:
            branches.setdefault(sub.relative_schema_path[0], []).append(sub)
        closest = min(branches.values(), key=len)
        error = max(closest, key=lambda e: (len(e.absolute_path), -len(e.context or ())))
    return error


def _unknown_fields(error: ValidationError) -> list[ValidationError] | None:
    """The unknown-field errors that alone explain ``error``, or None where more is wrong.

    For a oneOf (a tensor record), the branch that fails only by unknown fields is the one the
    record is meant to be; the other branches' complaints are not about this record.
    """
    if error.validator == "additionalProperties":
        return [error]
    if error.validator in ("oneOf", "anyOf"):
        branches: dict[Any, list[ValidationError]] = {}
        for sub in error.context or ():
            branches.setdefault(sub.relative_schema_path[0], []).append(sub)
        for subs in branches.values():
            found = [_unknown_fields(sub) for sub in subs]
            if all(f is not None for f in found):
                return [leaf for f in found if f is not None for leaf in f]
    return None


def _by_path(errors: Iterator[ValidationError]) -> list[ValidationError]:
    return sorted(errors, key=lambda e: list(map(str, e.path)))


#: Schema errors explained one by one; the rest are counted in one more finding. A manifest
#: can hold a million errors (one unknown member a piece); collecting each cost minutes and
#: gigabytes, and no one reads past the first few.
MAX_SCHEMA_FINDINGS = 100


@cache
def _open_fast_validator() -> Any:
    try:
        import jsonschema_rs
    except ImportError:
        return None
    return jsonschema_rs.validator_for(_open_objects(manifest_schema()))


def _located(data: Any, open_schema: bool, has_floats: bool) -> tuple[Any, int]:
    """``data`` with only the tensors that have errors (the first :data:`MAX_SCHEMA_FINDINGS`
    of them), and how many errors lie in the tensors left out.

    The reference validator, which explains errors, walks everything at about 0.5 ms a tensor;
    ``jsonschema-rs`` finds where the errors are at C speed. Tensor records are checked each
    on its own (their names are free-form), so a tensor left out takes no error with it. With
    floats, or without ``jsonschema-rs``, nothing is left out (``jsonschema-rs`` takes 4.0 for
    an integer: only the reference validator finds that error).
    """
    fast = _open_fast_validator() if open_schema else _fast_validator()
    tensors = data.get("tensors") if isinstance(data, dict) else None
    if fast is None or has_floats or not isinstance(tensors, dict):
        return data, 0
    kept: dict[str, Any] = {}
    left_out = 0
    for error in fast.iter_errors(data):
        path = error.instance_path
        if not path or path[0] != "tensors":
            continue
        if len(path) < 2:  # about the tensors object itself (a reserved name): keep them all
            return data, 0
        name = path[1]
        if name in kept:
            continue
        if len(kept) < MAX_SCHEMA_FINDINGS:
            kept[name] = tensors[name]
        else:
            left_out += 1
    return {**data, "tensors": kept}, left_out


def _open_valid(data: Any, has_floats: bool) -> bool:
    """Whether ``data`` holds to the schema but for unknown fields (SPEC 4.3)."""
    fast = _open_fast_validator()
    if fast is None or has_floats:
        return next(iter(_open_validator().iter_errors(data)), None) is None
    return bool(fast.is_valid(data))


def _first_errors(validator: Draft202012Validator, data: Any) -> tuple[list[ValidationError], int]:
    """The first :data:`MAX_SCHEMA_FINDINGS` errors (by path) and how many more there are;
    only those are kept, so memory stays linear in the manifest, not in its errors."""
    errors: list[ValidationError] = []
    more = 0
    for error in validator.iter_errors(data):
        if len(errors) < MAX_SCHEMA_FINDINGS:
            errors.append(error)
        else:
            more += 1
    return _by_path(iter(errors)), more


def _more_finding(more: int) -> Finding:
    return Finding(
        code="schema", json_path="$",
        message=f"{more} more schema error(s) not listed: the first {MAX_SCHEMA_FINDINGS} are",
        hint="fix those, or see schema/manifest.schema.json (`shardspec schema` prints it)")


def schema_findings(
    data: Any, *, allow_unknown_fields: bool = False, has_floats: bool | None = None
) -> Iterator[Finding]:
    """How ``data`` departs from the schema, as findings: at most
    :data:`MAX_SCHEMA_FINDINGS` explained, and one more that counts the rest.

    With ``allow_unknown_fields`` (a manifest of a newer minor version, SPEC 4.3), fields the
    schema does not know are reported as warnings instead of errors.
    """
    if has_floats is None:
        has_floats = _has_float(data)
    if is_valid(data, has_floats=has_floats):
        return
    located, left_out = _located(data, False, has_floats)
    errors, more = _first_errors(_validator(), located)
    more += left_out
    if allow_unknown_fields and errors:
        # Only fields the schema does not know may be ignored: anything else it checks must
        # still hold, so check that first with unknown fields allowed everywhere.
        if _open_valid(data, has_floats):
            for error in errors:
                for detail in _unknown_fields(error) or [_deepest(error)]:
                    yield Finding(
                        code="unknown-field",
                        message=f"ignored a field this reader does not know: {detail.message}",
                        json_path=_json_path(detail),
                    )
            if more:
                yield Finding(code="unknown-field", json_path="$",
                              message=f"ignored {more} more unknown field(s), not listed")
            return
        located, left_out = _located(data, True, has_floats)
        errors, more = _first_errors(_open_validator(), located)
        more += left_out
    for error in errors:
        detail = _deepest(error)
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
    if more:
        yield _more_finding(more)
