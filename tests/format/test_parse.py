"""SPEC 2.3, 3.5 and 4: the manifest chain from bytes (schema, versions, extensions)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import shardspec
from checkpoints import SCHEMA_FILE, Tiny, manifest_bytes, rewrite_manifest
from shardspec.format.limits import MAX_MANIFEST_BYTES, SUPPORTED_MINOR
from shardspec.format.parse import parse_manifest
from shardspec.format.schema import manifest_schema, schema_bytes, schema_findings
from shardspec.storage.manifest_file import read_manifest


def codes(data: dict[str, Any], **kwargs: Any) -> list[str]:
    return [f.code for f in parse_manifest(manifest_bytes(data), **kwargs).findings]


def test_valid_manifest_has_no_findings(manifest_dict: dict[str, Any]) -> None:
    parsed = parse_manifest(manifest_bytes(manifest_dict))
    assert parsed.findings == []
    assert parsed.manifest is not None
    assert parsed.manifest.to_dict() == manifest_dict


def test_schema_bytes_are_the_schema_file() -> None:
    assert schema_bytes() == SCHEMA_FILE.read_bytes()
    assert manifest_schema()["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_schema_lists_every_dtype() -> None:
    from shardspec.format.dtypes import DTYPES

    assert manifest_schema()["$defs"]["dtype"]["enum"] == list(DTYPES)


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d.pop("tensors"),
        lambda d: d.update(format="safetensors"),
        lambda d: d["layout"].update(tp_size=0),
        lambda d: d["tensors"]["layers.0.col.weight"].update(dtype="F9"),
        lambda d: d["tensors"]["layers.0.col.weight"]["shape"].__setitem__(0, -8),
        lambda d: d["ranks"][0]["files"][0]["checksums"].update(sha256="ABC"),
        lambda d: d["tensors"].update({"__metadata__": {"alias_of": "step"}}),
        lambda d: d.update(surprise=True),
        lambda d: d["tensors"]["layers.0.qkv.weight"].update(surprise=True),
        lambda d: d.update(format_version="1"),
    ],
    ids=["missing-tensors", "bad-magic", "tp-0", "bad-dtype", "negative-dim", "bad-digest",
         "reserved-name", "unknown-top-level-field", "unknown-tensor-field", "bad-version"],
)
def test_schema_violations_are_schema_findings(manifest_dict: dict[str, Any], edit: Any) -> None:
    edit(manifest_dict)
    parsed = parse_manifest(manifest_bytes(manifest_dict))
    assert parsed.manifest is None
    assert parsed.findings and {f.code for f in parsed.findings} == {"schema"}
    assert all(f.section == "3.5" and f.json_path for f in parsed.findings)


def test_schema_finding_for_a_tensor_names_the_branch_it_resembles(
    manifest_dict: dict[str, Any],
) -> None:
    manifest_dict["tensors"]["layers.0.qkv.weight"]["typo"] = 1
    (finding,) = parse_manifest(manifest_bytes(manifest_dict)).findings
    assert finding.tensor == "layers.0.qkv.weight"
    assert "typo" in finding.message


def test_major_version_2_is_refused_whatever_its_body(manifest_dict: dict[str, Any]) -> None:
    manifest_dict["format_version"] = "2.0"
    assert codes(manifest_dict) == ["version-major"]
    assert codes({"format": "shardspec", "format_version": "2.0", "anything": [1]}) == [
        "version-major"]
    finding = parse_manifest(manifest_bytes(manifest_dict)).findings[0]
    assert finding.severity == "error" and finding.section == "4.2"


def test_major_version_0_is_refused(manifest_dict: dict[str, Any]) -> None:
    manifest_dict["format_version"] = "0.9"
    assert codes(manifest_dict) == ["version-major"]


def test_newer_minor_is_read_with_unknown_fields_as_warnings(
    manifest_dict: dict[str, Any],
) -> None:
    manifest_dict["format_version"] = "1.7"
    manifest_dict["future_top_level"] = {"x": 1}
    parsed = parse_manifest(manifest_bytes(manifest_dict))
    assert [f.code for f in parsed.findings] == ["version-newer-minor", "unknown-field"]
    assert all(f.severity == "warning" for f in parsed.findings)
    assert parsed.manifest is not None
    assert "future_top_level" in parsed.findings[1].message


@pytest.mark.parametrize(
    "where",
    ["layout", "rank", "file", "global", "global-piece", "rank-local", "local-piece", "alias",
     "quantization"],
)
def test_newer_minor_ignores_unknown_fields_in_every_record(
    manifest_dict: dict[str, Any], where: str
) -> None:
    tensors = manifest_dict["tensors"]
    target = {
        "layout": manifest_dict["layout"],
        "rank": manifest_dict["ranks"][1],
        "file": manifest_dict["ranks"][1]["files"][0],
        "global": tensors["layers.0.col.weight"],
        "global-piece": tensors["layers.0.col.weight"]["pieces"][1],
        "rank-local": tensors["layers.0.qkv.weight"],
        "local-piece": tensors["layers.0.qkv.weight"]["pieces"][0],
        "alias": tensors["lm_head.weight"],
        "quantization": manifest_dict["quantization"],
    }[where]
    target["from_the_future"] = 1
    manifest_dict["format_version"] = f"1.{SUPPORTED_MINOR + 1}"
    parsed = parse_manifest(manifest_bytes(manifest_dict))
    assert [f.code for f in parsed.findings] == ["version-newer-minor", "unknown-field"]
    assert "from_the_future" in parsed.findings[1].message
    assert parsed.manifest is not None


def test_newer_minor_still_enforces_known_rules(manifest_dict: dict[str, Any]) -> None:
    manifest_dict["format_version"] = "1.7"
    manifest_dict["tensors"]["layers.0.col.weight"]["dtype"] = "F9"
    manifest_dict["tensors"]["layers.0.col.weight"]["future"] = 1
    parsed = parse_manifest(manifest_bytes(manifest_dict))
    assert parsed.manifest is None
    assert [f.code for f in parsed.findings] == ["version-newer-minor", "schema"]
    assert parsed.findings[1].json_path == "$.tensors.layers.0.col.weight.dtype"


def test_unknown_field_in_current_minor_is_a_schema_error(
    manifest_dict: dict[str, Any],
) -> None:
    manifest_dict["ranks"][0]["files"][0]["mtime"] = 0
    (finding,) = schema_findings(manifest_dict)
    assert finding.code == "schema" and finding.json_path == "$.ranks[0].files[0]"
    (finding,) = schema_findings(manifest_dict, allow_unknown_fields=True)
    assert finding.code == "unknown-field" and finding.severity == "warning"


def test_allowing_unknown_fields_still_requires_known_ones() -> None:
    found = list(schema_findings({"format": "shardspec", "x": 1}, allow_unknown_fields=True))
    assert found and {f.code for f in found} == {"schema"}


def test_must_understand_extension_is_refused(manifest_dict: dict[str, Any]) -> None:
    manifest_dict["extensions"] = {"org.example.packing": {"must_understand": True, "v": 2}}
    parsed = parse_manifest(manifest_bytes(manifest_dict))
    assert [f.code for f in parsed.findings] == ["extension-unsupported"]
    assert parsed.errors and parsed.findings[0].section == "4.4"


def test_ignore_extensions_lets_a_named_must_understand_extension_through(
    manifest_dict: dict[str, Any],
) -> None:
    manifest_dict["extensions"] = {"org.example.packing": {"must_understand": True}}
    assert codes(manifest_dict, ignore_extensions=["org.example.other"]) == [
        "extension-unsupported"]
    assert codes(manifest_dict, ignore_extensions=["org.example.packing"]) == [
        "extension-ignored"]


def test_optional_extension_is_ignored_with_a_warning(manifest_dict: dict[str, Any]) -> None:
    manifest_dict["extensions"] = {"org.example.hint": {"must_understand": False}}
    parsed = parse_manifest(manifest_bytes(manifest_dict))
    assert [(f.code, f.severity) for f in parsed.findings] == [("extension-ignored", "warning")]
    assert parsed.manifest is not None


def test_extension_without_must_understand_is_a_schema_error(
    manifest_dict: dict[str, Any],
) -> None:
    manifest_dict["extensions"] = {"org.example.hint": {}}
    assert codes(manifest_dict) == ["schema"]


def test_open_refuses_must_understand_extension_unless_ignored(tiny: Tiny) -> None:
    rewrite_manifest(tiny.path, lambda d: d.update(
        extensions={"org.example.packing": {"must_understand": True}}))
    with pytest.raises(shardspec.ExtensionError) as info:
        shardspec.open(tiny.path)
    assert info.value.code == "extension-unsupported"
    checkpoint = shardspec.open(tiny.path, ignore_extensions=["org.example.packing"])
    assert [w.code for w in checkpoint.warnings] == ["extension-ignored"]
    assert set(checkpoint.load_rank(0, "cpu")) == set(tiny.expected[0])


def test_open_reads_a_newer_minor_with_warnings(tiny: Tiny) -> None:
    def edit(data: dict[str, Any]) -> None:
        data["format_version"] = "1.9"
        data["tensors"]["layers.0.qkv.weight"]["packing"] = "future"

    rewrite_manifest(tiny.path, edit)
    checkpoint = shardspec.open(tiny.path)
    assert [w.code for w in checkpoint.warnings] == ["version-newer-minor", "unknown-field"]
    assert set(checkpoint.load_rank(1, "cpu")) == set(tiny.expected[1])


def test_missing_manifest_is_not_committed(tmp_path: Path) -> None:
    (tmp_path / "model-rank-0-part-0.safetensors").write_bytes(b"")
    parsed = read_manifest(tmp_path)
    assert [f.code for f in parsed.findings] == ["not-committed"]
    with pytest.raises(shardspec.NotCommittedError) as info:
        shardspec.open(tmp_path)
    assert info.value.section == "2.3"


def test_manifest_that_is_a_directory_is_not_regular(tmp_path: Path) -> None:
    (tmp_path / "shardspec.json").mkdir()
    assert [f.code for f in read_manifest(tmp_path).findings] == ["file-not-regular"]


def test_oversized_manifest_is_refused_without_reading_it(tmp_path: Path) -> None:
    with open(tmp_path / "shardspec.json", "wb") as handle:
        handle.truncate(MAX_MANIFEST_BYTES + 1)  # sparse: nothing is really written
    assert [f.code for f in read_manifest(tmp_path).findings] == ["json-too-large"]


@pytest.mark.parametrize(
    ("data", "code"),
    [(b"\xef\xbb\xbf{}", "json-encoding"), (b"{,}", "json-syntax"),
     (b'{"format": 1, "format": 2}', "json-duplicate-name"),
     (b'{"x": Infinity}', "json-nonfinite")],
)
def test_open_raises_manifest_syntax_errors(tmp_path: Path, data: bytes, code: str) -> None:
    (tmp_path / "shardspec.json").write_bytes(data)
    with pytest.raises(shardspec.ManifestSyntaxError) as info:
        shardspec.open(tmp_path)
    assert info.value.code == code
    assert "shardspec.json" in str(info.value) and "SPEC 3." in str(info.value)


def test_non_object_manifest_is_a_schema_error() -> None:
    assert [f.code for f in parse_manifest(b"[1, 2]").findings] == ["schema"]


def test_manifest_symlink_outside_is_refused(tmp_path: Path, tiny: Tiny) -> None:
    outside = tmp_path / "elsewhere.json"
    outside.write_bytes((tiny.path / "shardspec.json").read_bytes())
    (tiny.path / "shardspec.json").unlink()
    os.symlink(outside, tiny.path / "shardspec.json")
    assert [f.code for f in read_manifest(tiny.path).findings] == ["path-escapes"]

