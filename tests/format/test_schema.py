"""The fast (jsonschema-rs) and reference (jsonschema) checks of the one schema agree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shardspec.format import schema
from shardspec.format.json_dialect import JSONProblem, parse_strict_json
from shardspec.format.limits import MAX_JSON_DEPTH, MAX_MANIFEST_BYTES

REPO = Path(__file__).resolve().parents[2]


def _manifests() -> list[tuple[str, Any]]:
    out = []
    for path in sorted((REPO / "schema" / "examples").rglob("*.json")):
        data = json.loads(path.read_text())
        out.append((str(path.relative_to(REPO)), data.get("manifest", data)))
    for path in sorted((REPO / "conformance" / "vectors").glob("*/checkpoint/shardspec.json")):
        if not path.is_file():
            continue
        try:
            data = parse_strict_json(path.read_bytes(), max_bytes=MAX_MANIFEST_BYTES,
                                     max_depth=MAX_JSON_DEPTH)
        except JSONProblem:
            continue  # the JSON dialect rejects it before any schema check
        out.append((str(path.relative_to(REPO)), data))
    return out


MANIFESTS = _manifests()


def test_the_accelerator_is_installed() -> None:
    assert schema._fast_validator() is not None


@pytest.mark.parametrize(("name", "data"), MANIFESTS, ids=[name for name, _ in MANIFESTS])
def test_fast_and_reference_validators_agree(name: str, data: Any) -> None:
    reference_ok = not any(True for _ in schema._validator().iter_errors(data))
    assert schema.is_valid(data) == reference_ok
    assert schema.is_valid(data, has_floats=schema._has_float(data)) == reference_ok


def test_a_float_where_an_integer_belongs_is_caught_on_the_fast_path() -> None:
    data = json.loads((REPO / "schema" / "examples" / "valid" / "minimal.json").read_text())
    assert schema.is_valid(data, has_floats=False)
    data["layout"]["tp_size"] = 1.0
    assert not schema.is_valid(data)
    assert [f.code for f in schema.schema_findings(data, has_floats=True)] == ["schema"]


def test_the_fast_path_schema_differs_only_in_piece_files() -> None:
    """Derived from the one schema file: a piece's file is only a string, nothing else moved."""
    original = schema.manifest_schema()
    derived = schema._piece_files_as_strings(original)
    assert derived is not original
    for kind in ("global_piece", "local_piece"):
        assert original["$defs"][kind]["properties"]["file"] == {"$ref": "#/$defs/path"}
        assert derived["$defs"][kind]["properties"]["file"] == {"type": "string"}
        derived["$defs"][kind]["properties"]["file"] = original["$defs"][kind]["properties"][
            "file"]
    assert derived == original


def test_a_schema_of_another_shape_is_not_relaxed() -> None:
    changed = json.loads(json.dumps(schema.manifest_schema()))
    changed["$defs"]["local_piece"]["properties"]["file"] = {"type": "string", "minLength": 1}
    assert schema._piece_files_as_strings(changed) is changed


@pytest.mark.parametrize(("name", "data"), MANIFESTS, ids=[name for name, _ in MANIFESTS])
def test_the_fast_path_schema_accepts_what_the_schema_accepts(name: str, data: Any) -> None:
    if schema.is_valid(data) and not schema._has_float(data):
        assert schema.is_valid_if_piece_files_listed(data)


@pytest.mark.parametrize("version, codes", [
    ("1.4", ["version-newer-minor", "unknown-field", "unknown-field"]),
    ("1.3", ["schema", "schema"]),
])
def test_records_named_like_numbers_are_located(version: str, codes: list[str]) -> None:
    """jsonschema-rs names the tensor "0" by the integer 0: it was a KeyError (found by the
    generated checkpoints of the conformance suite)."""
    from shardspec.format.parse import parse_manifest
    piece = {"rank": 0, "file": "a.safetensors", "offset": [0], "shape": [1]}
    manifest = {
        "format": "shardspec", "format_version": version,
        "layout": {"tp_size": 1, "pp_size": 1, "ep_size": 1, "world_size": 1,
                   "rank_order": "pp-ep-tp"},
        "ranks": [{"rank": 0, "tp_rank": 0, "pp_rank": 0, "ep_rank": 0, "files": [
            {"path": "a.safetensors", "size": 8, "checksums": {"sha256": "0" * 64}}]}],
        "quantization": {"method": "none"},
        "tensors": {"7": {"dtype": "F32", "shape": [1], "pieces": [piece], "x": None},
                    "0": {"alias_of": "7", "x": None}},
    }
    found = parse_manifest(json.dumps(manifest).encode()).findings
    assert sorted(f.code for f in found) == sorted(codes)
    where = {f.json_path or "" for f in found if f.code != "version-newer-minor"}
    assert len(where) == 2, where
    assert all(".tensors['0']" in w or ".tensors['7']" in w or ".tensors.0" in w
               or ".tensors.7" in w for w in where), where
