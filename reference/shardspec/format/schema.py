"""The manifest's JSON Schema (SPEC 3.5), loaded from the one file in ``schema/``.

A wheel carries that file as ``shardspec/_schema/manifest.schema.json``; a source checkout
reads it from the repository's ``schema/`` folder. There is no second copy.

Two validators read that one file: ``jsonschema-rs`` (compiled, about 80x faster) answers
"valid or not" on the load path, where every rank checks the whole manifest; the ``jsonschema``
reference implementation explains what is wrong when something is, and handles newer minor
versions. Without ``jsonschema-rs`` installed, ``jsonschema`` does both.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError

from .errors import Finding
from .manifest import tensor_kind

#: The compiled validator's module, a declared dependency imported with this module (2 ms a
#: process, once, rather than inside its first ``open()``); None where it is not installed,
#: and then the reference validator answers alone.
jsonschema_rs: ModuleType | None
try:
    import jsonschema_rs
except ImportError:
    jsonschema_rs = None

__all__ = [
    "SCHEMA_FILE_NAME",
    "is_valid",
    "is_valid_if_piece_files_listed",
    "json_leaves",
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
    if jsonschema_rs is None:
        return None
    return jsonschema_rs.validator_for(manifest_schema())


def _copy_of(schema: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of a JSON value: a JSON round trip, about 4x faster than ``copy.deepcopy``
    (which a fresh process's first ``open()`` pays twice)."""
    copied: dict[str, Any] = json.loads(json.dumps(schema))
    return copied


def _piece_files_as_strings(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with each piece's ``file`` checked only to be a string.

    In the schema a piece's file is a ``$defs/path``, whose pattern (lookarounds, run by a
    backtracking regex engine) took 88% of ``jsonschema-rs``'s time on a 100,000-piece manifest.
    Where every piece's file is one of its rank's listed files, each of which was checked as a
    ``$defs/path`` under ``ranks``, checking it again cannot fail. Should the schema's pieces
    ever look different, the schema is returned as it is: slower, never wrong.
    """
    derived = _copy_of(schema)
    pieces = [derived["$defs"].get(kind, {}) for kind in ("global_piece", "local_piece")]
    files = [piece.get("properties", {}).get("file") for piece in pieces]
    if any(file != {"$ref": "#/$defs/path"} for file in files):
        return schema
    for piece in pieces:
        piece["properties"]["file"] = {"type": "string"}
    return derived


def _piece_items_unchecked(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with the items of every tensor kind's ``pieces`` allowed whatever they are
    (everything else about ``pieces``, and every other member, still checked)."""
    derived = _copy_of(schema)
    for definition in derived["$defs"].values():
        pieces = definition.get("properties", {}).get("pieces") if isinstance(
            definition, dict) else None
        if isinstance(pieces, dict) and "items" in pieces:
            pieces["items"] = True
    return derived


@cache
def _listed_files_validators() -> tuple[Any, Any] | None:
    """For :func:`is_valid_if_piece_files_listed`: the manifest with its pieces unchecked, and
    one tensor record whole, both with piece files checked as strings."""
    if jsonschema_rs is None:
        return None
    schema = _piece_files_as_strings(manifest_schema())
    record = {"$ref": "#/$defs/tensor", "$defs": schema["$defs"]}
    return (jsonschema_rs.validator_for(_piece_items_unchecked(schema)),
            jsonschema_rs.validator_for(record))


def is_valid_if_piece_files_listed(data: Any) -> bool | None:
    """Whether ``data`` matches the schema, provided every piece's ``file`` is a listed file.

    The fast path's schema check (:mod:`shardspec.format.parse_fast`): True is a promise only once
    the caller has also checked that each piece's file is among its rank's files, as
    :func:`shardspec.format.checks_fast.is_sound` does. ``jsonschema-rs`` takes 4.0 for an
    integer, SPEC 3.3 does not: a float anywhere but in a free-form value is for the caller to
    refuse (the fast path counts them). None where ``jsonschema-rs`` is not installed.

    Tensors that share one list of pieces (the fast path gives equal texts one list) have it
    checked once per kind of record: the manifest is checked with the pieces' items left out,
    then one record of each (list, kind) whole. A record's kind is decided by which members it
    has (SPEC 4.3 rule 2, :func:`~shardspec.format.manifest.tensor_kind`) and nothing else in
    a record constrains its pieces, so the others' pieces would be judged alike.
    """
    validators = _listed_files_validators()
    if validators is None:
        return None
    without_items, record_validator = validators
    if not without_items.is_valid(data):
        return False
    checked: set[tuple[int, str]] = set()
    for record in data["tensors"].values():
        pieces = record.get("pieces")
        if pieces is None:
            continue
        key = (id(pieces), tensor_kind(record))  # the lists are alive: ids are unique
        if key not in checked:
            if not record_validator.is_valid(record):
                return False
            checked.add(key)
    return True


def json_leaves(*roots: Any) -> Iterator[Any]:
    """The values within decoded JSON ``roots`` that are neither objects nor arrays."""
    stack = list(roots)
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        else:
            yield item


def _has_float(data: Any) -> bool:
    """Whether any number was written with a fraction or exponent (SPEC 3.3 rule 3 needs care)."""
    return any(isinstance(item, float) for item in json_leaves(data))


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
    if jsonschema_rs is None:
        return None
    return jsonschema_rs.validator_for(_open_objects(manifest_schema()))


#: Containers whose items the schema checks each on its own: key -> the items' definition.
_UNITS = {"ranks": "rank", "extra_files": "file", "tensors": "tensor"}


@dataclass
class _Located:
    """Where the errors are: the manifest without its items (``top``), the items with an error
    (at most :data:`MAX_SCHEMA_FINDINGS`), and how many errors lie in the items left out."""

    top: Any
    items: list[tuple[str, Any, Any]]
    left_out: int
    #: Containers kept whole in ``top``: an error is about the container itself.
    whole: set[str]


def _locate(data: Any, open_schema: bool, checkable: Any) -> _Located | None:
    """Where ``data``'s errors are, found by ``jsonschema-rs``; None when it cannot say.

    The reference validator, which explains errors, walks everything at about 0.5 ms a tensor
    or rank; ``jsonschema-rs`` finds where the errors are at C speed. Rank, file and tensor
    records are each checked on their own (the schema relates no two), so the reference
    validator explains the records with an error, one by one, and the manifest with every
    container cut to at most one record (``ranks`` must have one). ``checkable`` is ``data``
    as jsonschema-rs can judge it (:func:`_checkable`); None (no jsonschema-rs): it cannot say.
    """
    fast = _open_fast_validator() if open_schema else _fast_validator()
    if fast is None or checkable is None or not isinstance(data, dict):
        return None
    top = dict(data)
    for key in _UNITS:
        value = data.get(key)
        if isinstance(value, list):
            top[key] = value[:1] if key == "ranks" else []
        elif isinstance(value, dict):
            top[key] = {}
    items: dict[tuple[str, Any], Any] = {}
    whole: set[str] = set()
    left_out = 0
    for error in fast.iter_errors(checkable):
        path = error.instance_path
        if not path or path[0] not in _UNITS or path[0] in whole:
            continue
        if len(path) < 2:  # about the container itself (a reserved tensor name): keep it
            top[path[0]] = data[path[0]]
            whole.add(path[0])
            continue
        container = data[path[0]]
        # jsonschema-rs gives a key that looks like a number ("0", a tensor's name) as an int
        key = str(path[1]) if isinstance(container, dict) else path[1]
        where = (path[0], key)
        if where in items:
            continue
        if len(items) < MAX_SCHEMA_FINDINGS:
            items[where] = container[key]
        else:
            left_out += 1
    kept = [(key, at, item) for (key, at), item in items.items() if key not in whole]
    return _Located(top, kept, left_out, whole)


def _first_errors(validator: Draft202012Validator, data: Any, located: _Located | None
                  ) -> tuple[list[ValidationError], int]:
    """The first :data:`MAX_SCHEMA_FINDINGS` errors (by path) and how many more there are;
    only those are kept, so memory stays linear in the manifest, not in its errors."""
    if located is None:
        found: Iterator[ValidationError] = validator.iter_errors(data)
        left_out = 0
    else:
        found = _located_errors(validator, located)
        left_out = located.left_out
    errors: list[ValidationError] = []
    more = left_out
    for error in found:
        if len(errors) < MAX_SCHEMA_FINDINGS:
            errors.append(error)
        else:
            more += 1
    return _by_path(iter(errors)), more


def _located_errors(validator: Draft202012Validator, located: _Located
                    ) -> Iterator[ValidationError]:
    for error in validator.iter_errors(located.top):
        path = error.absolute_path
        # an item left in a cut container (ranks[0]) is explained with the items, if at all
        if len(path) >= 2 and path[0] in _UNITS and path[0] not in located.whole:
            continue
        yield error
    for key, at, item in located.items:
        for error in validator.descend(item, {"$ref": f"#/$defs/{_UNITS[key]}"}, path=at):
            error.path.appendleft(key)
            yield error


def _open_valid(data: Any, checkable: Any) -> bool:
    """Whether ``data`` holds to the schema but for unknown fields (SPEC 4.3)."""
    fast = _open_fast_validator()
    if fast is None or checkable is None:
        return next(iter(_open_validator().iter_errors(data)), None) is None
    return bool(fast.is_valid(checkable))


#: What a float outside the free-form values becomes for jsonschema-rs: no integer, string or
#: boolean, so wherever the schema types a member it is refused there, as the float is by
#: the reference validator (SPEC 3.3 rule 3; the schema has no "number" member).
_FLOAT_MARK = {"": "a number with a fraction or an exponent"}


def _checkable(data: Any, has_floats: bool) -> Any:
    """``data`` as jsonschema-rs can judge it, or None where it cannot be used.

    jsonschema-rs takes 4.0 for an integer: with floats, each one outside the free-form
    values (``quantization``'s config and extension records, where any number is allowed)
    becomes :data:`_FLOAT_MARK` in a copy, so the errors are found, and located, at C speed.
    """
    if _fast_validator() is None:
        return None
    if not has_floats or not isinstance(data, dict):
        return data if not has_floats else None
    return {key: value if key in ("quantization", "extensions") else _mark_floats(value)
            for key, value in data.items()}


def _mark_floats(value: Any) -> Any:
    if isinstance(value, float):
        return _FLOAT_MARK
    if isinstance(value, dict):
        return {key: _mark_floats(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_mark_floats(item) for item in value]
    return value


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
    checkable = _checkable(data, has_floats)
    if checkable is None:
        if is_valid(data, has_floats=has_floats):
            return
    elif _fast_validator().is_valid(checkable):
        return
    errors, more = _first_errors(_validator(), data, _locate(data, False, checkable))
    if allow_unknown_fields and errors:
        # Only fields the schema does not know may be ignored: anything else it checks must
        # still hold, so check that first with unknown fields allowed everywhere.
        if _open_valid(data, checkable):
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
        errors, more = _first_errors(_open_validator(), data, _locate(data, True, checkable))
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
