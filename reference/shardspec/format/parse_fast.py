"""The fast path of :func:`~shardspec.format.parse.parse_manifest`: "sound, here it is" or
"not sure".

Every rank reads and checks the whole manifest on open (SPEC 11.1), and a large mixture of
experts has a million pieces. This path answers for a sound manifest at C speed where it can:
msgspec for the JSON, ``jsonschema-rs`` for the schema, numpy for the semantic rules. Anything
short of certainty (a finding, a newer minor version, JSON it is unsure of) answers None, and the
strict path of :mod:`shardspec.format.parse`, which stays the definition, runs from the bytes and
says what is wrong. The fast path never accepts what the strict one refuses, and builds the same
:class:`~shardspec.format.manifest.Manifest` (the tests compare the two on generated manifests).

A model repeats itself: at TP=8 the 291 tensors of a Llama have 7 distinct lists of pieces
(every layer's ``q_proj`` is split alike, into the same files), and a mixture of experts
repeats one list per expert kind and rank. So each tensor's ``pieces`` is decoded as its JSON
text (``msgspec.Raw``), each distinct text once, and tensors with the same text share one list:
the typed manifest shares one tuple of pieces for them (:meth:`Manifest.from_dict`) and the
per-piece rules check it once (:func:`~shardspec.format.checks_fast.is_sound`). Equal texts
are equal values, so this changes no verdict; the member count still covers every copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any

import msgspec

from .checks_fast import is_sound
from .json_dialect import count_members, decode_fast_floats
from .limits import MAX_JSON_DEPTH, MAX_MANIFEST_BYTES, SUPPORTED_MAJOR, SUPPORTED_MINOR
from .manifest import Manifest
from .schema import is_valid_if_piece_files_listed, json_leaves, manifest_schema

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
    decoded = decode_fast_floats(data, max_bytes=MAX_MANIFEST_BYTES, max_depth=MAX_JSON_DEPTH,
                                 decode=_decoder().decode)
    if decoded is None:
        return None
    typed, members, floats = decoded
    raw = _document(typed)
    if raw is None:
        return None
    version = raw.get("format_version")
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


@cache
def _decoder() -> msgspec.json.Decoder[Any]:
    """A decoder of the manifest's members, by the schema's names, that keeps each tensor's
    ``pieces`` as its JSON text. A member the schema does not name (an unknown field, a newer
    minor version's) fails the decode: the strict path reports it."""
    schema = manifest_schema()
    kinds = _refs(schema["$defs"]["tensor"])
    tensor_fields = sorted({name for kind in kinds
                            for name in schema["$defs"][kind]["properties"]})
    unset: Any = msgspec.UNSET
    tensor = msgspec.defstruct(
        "_TensorText", [(name, msgspec.Raw | msgspec.UnsetType if name == "pieces" else Any,
                         unset) for name in tensor_fields], forbid_unknown_fields=True)
    document = msgspec.defstruct(
        "_ManifestText", [(name, dict[str, tensor] | msgspec.UnsetType  # type: ignore[valid-type]
                           if name == "tensors" else Any, unset)
                          for name in schema["properties"]], forbid_unknown_fields=True)
    return msgspec.json.Decoder(document)


def _refs(node: Any) -> set[str]:
    """The ``$defs`` names a schema node refers to (the kinds of a tensor record)."""
    if isinstance(node, dict):
        found = {node["$ref"].rsplit("/", 1)[-1]} if "$ref" in node else set()
        return found.union(*map(_refs, node.values()))
    return set().union(*map(_refs, node)) if isinstance(node, list) else set()


def _builtins(struct: Any) -> dict[str, Any]:
    """A decoded struct as the dict of the members its text had."""
    unset = msgspec.UNSET
    return {name: value for name in struct.__struct_fields__
            if (value := getattr(struct, name)) is not unset}


def _document(typed: Any) -> dict[str, Any] | None:
    """The manifest as builtins, as msgspec would have decoded it, except that tensors whose
    ``pieces`` texts are equal share one list. None when a pieces text does not decode."""
    raw = _builtins(typed)
    tensors = raw.get("tensors")
    if tensors is None:
        return raw
    lists: dict[bytes, Any] = {}
    records: dict[str, Any] = {}
    for name, record in tensors.items():
        members = _builtins(record)
        text = members.get("pieces")
        if text is not None:
            key = bytes(text)
            pieces = lists.get(key)
            if pieces is None:
                try:
                    pieces = lists[key] = msgspec.json.decode(key)
                except (msgspec.MsgspecError, RecursionError, ValueError):
                    return None
            members["pieces"] = pieces
        records[name] = members
    raw["tensors"] = records
    return raw


def manifest_members(raw: Mapping[str, Any]) -> int:
    """How many object members a schema-valid manifest has, counted knowing its structure.

    Only free-form values (quantization config, extensions) are walked; for the rest the
    schema says which values are objects, so a piece costs one ``len``, and a list of pieces
    that several tensors share (see the module docstring) is counted once and multiplied.
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
    of_list: dict[int, int] = {}  # id of a list of pieces -> its members (the lists are alive)
    for record in tensors.values():
        count += len(record) + len(record.get("logical", ())) + len(record.get("tied_to", ()))
        pieces = record.get("pieces")
        if pieces is not None:
            members = of_list.get(id(pieces))
            if members is None:
                members = of_list[id(pieces)] = sum(map(len, pieces))
            count += members
    return count


def _free_form_floats(raw: Mapping[str, Any]) -> int:
    """How many floats the free-form values of a schema-valid manifest hold (SPEC 4.3 rule 1:
    ``quantization.config`` and extension records; ``metadata`` holds strings only)."""
    free_form = json_leaves(raw["quantization"].get("config"), raw.get("extensions"))
    return sum(isinstance(item, float) for item in free_form)


def _file_members(files: Iterable[Mapping[str, Any]]) -> int:
    return sum(len(f) + len(f["checksums"]) for f in files)
