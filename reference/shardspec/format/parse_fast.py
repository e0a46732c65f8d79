"""The fast path of :func:`~shardspec.format.parse.parse_manifest`: "sound, here it is" or
"not sure".

Every rank reads and checks the whole manifest on open (SPEC 11.1), and a large mixture of
experts has a million pieces. This path answers for a sound manifest at C speed where it can:
msgspec for the JSON, ``jsonschema-rs`` for the schema, numpy for the semantic rules. Anything
short of certainty (a finding, a newer minor version, JSON it is unsure of) answers None, and the
strict path of :mod:`shardspec.format.parse`, which stays the definition, runs from the bytes and
says what is wrong. The fast path never accepts what the strict one refuses, and builds the same
:class:`~shardspec.format.manifest.Manifest` (the tests compare the two on generated manifests).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .checks_fast import is_sound
from .json_dialect import count_members, decode_fast_floats
from .limits import MAX_JSON_DEPTH, MAX_MANIFEST_BYTES, SUPPORTED_MAJOR, SUPPORTED_MINOR
from .manifest import Manifest
from .schema import is_valid_if_piece_files_listed

__all__ = ["fast_manifest"]

#: The versions read without a finding: a newer minor one has a warning and looser schema.
_VERSIONS = frozenset(f"{SUPPORTED_MAJOR}.{minor}" for minor in range(SUPPORTED_MINOR + 1))


def fast_manifest(data: bytes) -> Manifest | None:
    """The manifest of ``data`` when it is certainly sound in every check of SPEC 3-7 but
    extensions; None when that is not certain.

    Sound means what the strict path would report as no finding at all: strict JSON, a version
    this reader reads, the schema, and every semantic rule. Extensions are not judged here (the
    caller's ``ignore_extensions`` decides, as on the strict path).
    """
    decoded = decode_fast_floats(data, max_bytes=MAX_MANIFEST_BYTES, max_depth=MAX_JSON_DEPTH)
    if decoded is None:
        return None
    raw, members, floats = decoded
    version = raw.get("format_version") if isinstance(raw, dict) else None
    if not isinstance(version, str) or version not in _VERSIONS:  # [] is not hashable
        return None
    # True only with each piece's file listed for its rank: is_sound checks that (file-rank).
    if not is_valid_if_piece_files_listed(raw):
        return None
    if manifest_members(raw) != members:  # a name twice in some object: msgspec kept the last
        return None
    # jsonschema-rs takes 4.0 for an integer (SPEC 3.3 rule 3 does not): every float of the
    # text must be one of the free-form values', where any number is allowed.
    if floats and floats != _free_form_floats(raw):
        return None
    manifest = Manifest.from_dict(raw, share=True)
    return manifest if is_sound(manifest) else None


def manifest_members(raw: Mapping[str, Any]) -> int:
    """How many object members a schema-valid manifest has, counted knowing its structure.

    Only free-form values (quantization config, extensions) are walked; for the rest the
    schema says which values are objects, so a piece costs one ``len``.
    """
    count = len(raw) + len(raw["layout"]) + len(raw.get("metadata", ()))
    for rank in raw["ranks"]:
        count += len(rank) + _file_members(rank["files"])
    count += _file_members(raw.get("extra_files", ()))
    quantization = raw["quantization"]
    count += len(quantization) + count_members(quantization.get("config"))
    count += count_members(raw.get("extensions"))
    tensors = raw["tensors"]
    count += len(tensors)
    for record in tensors.values():
        count += len(record) + len(record.get("logical", ())) + len(record.get("tied_to", ()))
        pieces = record.get("pieces")
        if pieces is not None:
            count += sum(map(len, pieces))
    return count


def _free_form_floats(raw: Mapping[str, Any]) -> int:
    """How many floats the free-form values of a schema-valid manifest hold (SPEC 4.3 rule 1:
    ``quantization.config`` and extension records; ``metadata`` holds strings only)."""
    count = 0
    stack: list[Any] = [raw["quantization"].get("config"), raw.get("extensions")]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, float):
            count += 1
    return count


def _file_members(files: Iterable[Mapping[str, Any]]) -> int:
    return sum(len(f) + len(f["checksums"]) for f in files)
