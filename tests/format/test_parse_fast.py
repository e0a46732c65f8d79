"""The fast path of parse_manifest: the strict path's answer, sooner, or no answer at all.

Differential fuzzing, kept: every property compares ``parse_manifest`` (fast path first), the
strict path alone, and the pure-Python path (no jsonschema-rs: the reference validator alone)
on the same bytes: the same findings (codes, messages, paths) and the same Manifest.
``make test`` runs the derandomized ``ci`` profile; ``SHARDSPEC_HYPOTHESIS_PROFILE=thorough``
(tests/conftest.py loads it) runs 20 times as many random examples. The manifests are
written by the reference writer from ``shardspec.testing.strategies``, broken in the ways those
strategies know, and mutated byte by byte and field by field as in ``test_fuzz.py``.
"""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz import dumps, json_values, manifest_regions, mutate_bytes, mutate_doc, nodes

from checkpoints import manifest_bytes
from shardspec import Manifest
from shardspec.format import parse, parse_fast, schema
from shardspec.format.parse import ParsedManifest, parse_manifest
from shardspec.format.parse_fast import fast_manifest, manifest_members
from shardspec.load.plan import plan_rank, plan_ranks
from shardspec.testing.broken import broken_checkpoints, mutation_kinds
from shardspec.testing.strategies import checkpoint_specs

MANIFEST = "shardspec.json"
#: Half the profile's examples, as in test_conformance.py: each writes a checkpoint.
PROPERTY = settings(max_examples=max(settings.default.max_examples // 2, 1), deadline=None,
                    suppress_health_check=list(HealthCheck))


def strict(data: bytes, ignore: tuple[str, ...] = ()) -> ParsedManifest:
    return parse._parse_manifest(data, ignore)


def pure_python(data: bytes, ignore: tuple[str, ...] = ()) -> ParsedManifest:
    """``parse_manifest`` as it runs without jsonschema-rs: no fast path, and the reference
    validator alone finds and explains every schema error."""
    with mock.patch.object(schema, "_fast_validator", lambda: None), \
            mock.patch.object(schema, "_open_fast_validator", lambda: None), \
            mock.patch.object(schema, "_listed_files_validators", lambda: None):
        return parse_manifest(data, ignore_extensions=ignore)


def assert_same_answer(data: bytes, ignore: tuple[str, ...] = ()) -> ParsedManifest:
    """The three paths give the same findings and manifest: fast (msgspec, jsonschema-rs,
    numpy), strict, and pure Python; returns the strict path's answer."""
    expected = strict(data, ignore)
    assert parse_manifest(data, ignore_extensions=ignore) == expected
    assert pure_python(data, ignore) == expected
    manifest = fast_manifest(data)
    if manifest is not None:  # an answer is a promise: nothing but extensions to report
        assert expected.manifest is not None
        # Each rank's plan, built from its own pieces only, is the validator's plan of it.
        ranks = range(expected.manifest.world_size)
        assert [plan_rank(manifest, r) for r in ranks] == plan_ranks(expected.manifest, ranks)
        assert manifest == expected.manifest
        assert all(f.code.startswith("extension-") for f in expected.findings), expected.findings
    return expected


def test_a_sound_manifest_takes_the_fast_path(manifest_dict: dict[str, Any]) -> None:
    assert fast_manifest(manifest_bytes(manifest_dict)) == Manifest.from_dict(manifest_dict)


def test_the_switch_forces_the_strict_path(manifest_dict: dict[str, Any],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bytes] = []
    monkeypatch.setattr(parse, "fast_manifest", lambda data: calls.append(data))
    monkeypatch.setattr(parse, "_FAST_PATH", False)
    assert parse_manifest(manifest_bytes(manifest_dict)).findings == []
    assert calls == []


def test_members_are_counted_like_the_generic_walk(manifest_dict: dict[str, Any]) -> None:
    manifest_dict["quantization"] = {"method": "gptq", "config": {"bits": 4, "x": [{"y": {}}]}}
    manifest_dict["metadata"] = {"a": "b"}
    manifest_dict["extensions"] = {"my-ext": {"must_understand": False, "k": {"v": [{}]}}}
    assert schema.is_valid(manifest_dict)
    from shardspec.format.json_dialect import count_members

    assert manifest_members(manifest_dict) == count_members(manifest_dict)


def _objects(data: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The JSON path of every non-empty object in ``data``."""
    found = []
    for path in nodes(data):
        node = data
        for key in path:
            node = node[key]
        if isinstance(node, dict) and node:
            found.append(path)
    return sorted(found, key=str)


def _kind(path: tuple[Any, ...]) -> tuple[Any, ...]:
    """``path`` with indices as "*" and without the tensor's name."""
    named = path[1:2] if path[:1] == ("tensors",) else ()
    return tuple("*" if isinstance(k, int) else k for k in path if (k,) != named)


def _with_duplicate(data: dict[str, Any], path: tuple[Any, ...], same: bool) -> bytes:
    """``data`` as JSON with the first name of the object at ``path`` written twice."""
    data = copy.deepcopy(data)
    node = data
    for key in path:
        node = node[key]
    name = next(iter(node))
    marker = "\u0000duplicate\u0000"
    node[marker] = node[name] if same else {"not": "the same"}
    text = json.dumps(data).encode()
    return text.replace(json.dumps(marker).encode(), json.dumps(name).encode())


@pytest.mark.parametrize("same", [True, False], ids=["same-value", "other-value"])
def test_a_name_twice_in_any_object_gets_the_strict_finding(
    manifest_dict: dict[str, Any], same: bool
) -> None:
    """At every level: the manifest, layout, a rank, a file, its checksums, quantization, the
    tensors (two tensors of one name), a tensor, a piece, a logical record, metadata and
    extensions."""
    manifest_dict["quantization"] = {"method": "gptq", "config": {"bits": 4, "group": {"k": 1}}}
    manifest_dict["metadata"] = {"a": "b"}
    manifest_dict["extensions"] = {"my-ext": {"must_understand": False}}
    manifest_dict["tensors"]["layers.0.col.weight"]["logical"] = {"dtype": "F32", "shape": [8]}
    manifest_dict["extra_files"] = [{"path": "config.json", "size": 2,
                                     "checksums": {"sha256": "0" * 64}}]
    paths = _objects(manifest_dict)
    kinds = {_kind(path) for path in paths}
    assert kinds >= {(), ("layout",), ("ranks", "*"), ("ranks", "*", "files", "*"),
                     ("ranks", "*", "files", "*", "checksums"), ("quantization",),
                     ("quantization", "config", "group"), ("tensors",),
                     ("tensors", "pieces", "*"), ("tensors", "logical"), ("metadata",),
                     ("extensions", "my-ext"), ("extra_files", "*")}, kinds
    for path in paths:
        data = _with_duplicate(manifest_dict, path, same)
        expected = assert_same_answer(data)
        assert [f.code for f in expected.findings] == ["json-duplicate-name"], path
        assert "appears twice in one object" in expected.findings[0].message
        assert fast_manifest(data) is None


def test_a_piece_file_outside_its_rank_is_never_fast(manifest_dict: dict[str, Any]) -> None:
    """The fast schema check leaves a piece's path to the listed-file rule; both refuse."""
    piece = manifest_dict["tensors"]["layers.0.col.weight"]["pieces"][0]
    for path, code in [("../escape.safetensors", "schema"), ("a//b", "schema"),
                       ("unlisted.safetensors", "file-rank"),
                       (manifest_dict["ranks"][1]["files"][0]["path"], "file-rank")]:
        piece["file"] = path
        data = manifest_bytes(manifest_dict)
        assert fast_manifest(data) is None
        assert code in {f.code for f in assert_same_answer(data).findings}


def _with_copies(manifest_dict: dict[str, Any], source: str, count: int) -> list[str]:
    """``count`` more tensors whose records are copies of ``source``'s: equal pieces texts,
    as every layer of a model has. Returns their names, ``source`` first."""
    names = [source] + [f"{source}.copy{i}" for i in range(count)]
    for name in names[1:]:
        manifest_dict["tensors"][name] = copy.deepcopy(manifest_dict["tensors"][source])
    return names


def test_equal_pieces_texts_share_one_tuple_of_pieces(manifest_dict: dict[str, Any]) -> None:
    """Each distinct pieces text is decoded and built once: tensors with equal texts share
    one tuple (memory), and the manifest equals the one built piece by piece."""
    global_names = _with_copies(manifest_dict, "layers.0.col.weight", 3)
    local_names = _with_copies(manifest_dict, "model.embed_tokens.weight", 2)
    data = manifest_bytes(manifest_dict)
    manifest = fast_manifest(data)
    assert manifest is not None
    assert manifest == Manifest.from_dict(manifest_dict) == strict(data).manifest
    for names in (global_names, local_names):
        records = [manifest.tensors[name] for name in names]
        assert all(r.pieces is records[0].pieces for r in records)  # type: ignore[union-attr]
    col = manifest.tensors["layers.0.col.weight"]
    row = manifest.tensors["layers.0.row.weight"]
    assert col.pieces is not row.pieces  # type: ignore[union-attr]


@pytest.mark.parametrize(("change", "code"), [
    ({"shape": [8, 5]}, "coverage-gap"),      # the shared pieces no longer cover the tensor
    ({"shape": [6, 4]}, "piece-bounds"),      # nor fit in it
])
def test_a_tensor_sharing_its_pieces_text_is_judged_by_its_own_shape(
        manifest_dict: dict[str, Any], change: dict[str, Any], code: str) -> None:
    """The per-piece rules run once per distinct (dtype, shape, pieces): a tensor whose pieces
    text equals a sound tensor's, but whose shape differs, is checked on its own."""
    names = _with_copies(manifest_dict, "layers.0.col.weight", 2)
    manifest_dict["tensors"][names[1]].update(change)  # in the middle: sound on both sides
    data = manifest_bytes(manifest_dict)
    assert fast_manifest(data) is None
    assert code in {f.code for f in assert_same_answer(data).findings}
    assert {f.tensor for f in strict(data).findings if f.code == code} == {names[1]}


def test_pieces_of_sub_byte_dtypes_are_judged_per_dtype(manifest_dict: dict[str, Any]) -> None:
    """One pieces text under two dtypes: whole bytes at 16 bits, not at 4 (SPEC 6.5)."""
    pieces = [{"rank": r, "file": manifest_dict["ranks"][r]["files"][0]["path"],
               "offset": [r, 0], "shape": [1, 1]} for r in range(2)]
    tensors = manifest_dict["tensors"]
    sound = {"dtype": "BF16", "shape": [2, 1], "pieces": pieces}
    tensors["x"] = sound
    assert fast_manifest(manifest_bytes(manifest_dict)) is not None
    del tensors["x"]
    tensors["y"] = {"dtype": "F4", "shape": [2, 1], "pieces": copy.deepcopy(pieces)}
    tensors["x"] = sound  # sound ones on both sides of it
    tensors["z"] = copy.deepcopy(sound)
    data = manifest_bytes(manifest_dict)
    assert fast_manifest(data) is None
    findings = assert_same_answer(data).findings
    assert findings and {f.tensor for f in findings if f.severity == "error"} == {"y"}


def test_a_global_pieces_text_under_a_rank_local_record(manifest_dict: dict[str, Any]) -> None:
    """Equal texts, other kinds: a rank-local record's pieces have no offset (the schema)."""
    record = copy.deepcopy(manifest_dict["tensors"]["layers.0.col.weight"])
    del record["shape"]
    record["rank_local"] = True
    manifest_dict["tensors"]["x"] = record
    data = manifest_bytes(manifest_dict)
    assert fast_manifest(data) is None
    assert "schema" in {f.code for f in assert_same_answer(data).findings}


def test_a_name_twice_in_a_shared_pieces_text(manifest_dict: dict[str, Any]) -> None:
    """The member count covers every tensor's copy of a shared text."""
    _with_copies(manifest_dict, "layers.0.col.weight", 3)
    data = manifest_bytes(manifest_dict)
    doubled = data.replace(b'"shape": [4, 4]}', b'"shape": [4, 4], "shape": [4, 4]}')
    assert doubled.count(b'"shape": [4, 4], "shape"') >= 8  # both pieces of 4 equal texts
    assert fast_manifest(doubled) is None
    assert "json-duplicate-name" in {f.code for f in assert_same_answer(doubled).findings}


def test_a_newer_minor_version_takes_the_strict_path(manifest_dict: dict[str, Any]) -> None:
    manifest_dict["format_version"] = "1.99"
    data = manifest_bytes(manifest_dict)
    assert fast_manifest(data) is None
    assert [f.code for f in assert_same_answer(data).findings] == ["version-newer-minor"]


def test_without_jsonschema_rs_the_fast_path_gives_no_answer(
    manifest_dict: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schema, "_listed_files_validators", lambda: None)
    monkeypatch.setattr(parse_fast, "is_valid_if_piece_files_listed",
                        schema.is_valid_if_piece_files_listed)
    assert fast_manifest(manifest_bytes(manifest_dict)) is None


@pytest.mark.parametrize(("token", "codes", "answers"), [
    (b"4.0", [], True), (b"4e0", [], True), (b"0.01", [], True), (b"[1.5, 2E-3, -0.0]", [], True),
    (b"12345678901234567890", [], False),
    (b"1e400", ["json-nonfinite"], False), (b"NaN", ["json-nonfinite"], False),
    (b"-0", [], True), (b"-9223372036854775808", [], True),
])
def test_numbers_in_a_free_form_config(manifest_dict: dict[str, Any], token: bytes,
                                       codes: list[str], answers: bool) -> None:
    """A float in a free-form value keeps the fast path (GPTQ's damp_percent sent a whole
    manifest to Python jsonschema, 37x slower); a 20-digit integer is left to the strict one."""
    manifest_dict["quantization"] = {"method": "gptq", "config": {"damp": "@@"}}
    manifest_dict["extensions"] = {"org.example.x": {"must_understand": False, "f": "@@"}}
    data = manifest_bytes(manifest_dict).replace(b'"@@"', token)
    ignore = ("org.example.x",)
    assert [f.code for f in assert_same_answer(data, ignore).findings
            if f.code != "extension-ignored"] == codes
    assert (fast_manifest(data) is not None) == answers


@pytest.mark.parametrize("where", ["shape", "size", "rank"])
def test_a_float_where_an_integer_goes_is_never_fast(manifest_dict: dict[str, Any],
                                                     where: str) -> None:
    """SPEC 3.3 rule 3: 4.0 is not an integer token, though jsonschema-rs takes it for one; a
    float in the config beside it must not hide it from the fast path's count."""
    manifest_dict["quantization"] = {"method": "gptq", "config": {"damp": 0.01}}
    data = manifest_bytes(manifest_dict)
    if where == "shape":
        data = data.replace(b'"shape": [8, 4]', b'"shape": [8.0, 4]', 1)
    elif where == "size":
        data = data.replace(b'"tp_size": 2', b'"tp_size": 2e0', 1)
    else:
        data = data.replace(b'"rank": 0,', b'"rank": 0.0,', 1)
    assert data != manifest_bytes(manifest_dict)
    assert "schema" in [f.code for f in assert_same_answer(data).findings]
    assert fast_manifest(data) is None


# --- properties over generated checkpoints -----------------------------------------------------


def _written(data: st.DataObject, tmp: str) -> tuple[Any, bytes]:
    written = data.draw(checkpoint_specs()).write(Path(tmp) / "valid")
    return written, (written.path / MANIFEST).read_bytes()


@PROPERTY
@given(data=st.data())
def test_generated_checkpoints_take_the_fast_path(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        written, blob = _written(data, tmp)
        expected = assert_same_answer(blob, written.ignore_extensions)
        sound = expected.manifest is not None and all(
            f.code.startswith("extension-") for f in expected.findings)
        if written.spec.newer_minor:
            assert fast_manifest(blob) is None
        elif sound and not _has_float(expected.manifest):
            # the fast path is not quietly the strict one (a float in a free-form value, as
            # in a quantization config, leaves the answer to the strict path)
            assert fast_manifest(blob) == expected.manifest


def _has_float(manifest: Manifest | None) -> bool:
    if manifest is None:
        return False
    text = json.dumps([dict(manifest.quantization.config), dict(manifest.extensions)])
    return any(isinstance(v, float) for v in _leaves(json.loads(text)))


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


@PROPERTY
@given(data=st.data())
def test_broken_checkpoints_get_the_strict_findings(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        kind = data.draw(st.sampled_from(mutation_kinds()))
        written, _ = _written(data, tmp)
        mutation = data.draw(broken_checkpoints(written, kind))
        root = Path(tmp) / "broken"
        shutil.copytree(written.path, root, symlinks=True)
        mutation.apply(root)
        if (root / MANIFEST).is_file():
            assert_same_answer((root / MANIFEST).read_bytes(), written.ignore_extensions)


@PROPERTY
@given(data=st.data())
def test_mutated_manifests_get_the_strict_findings(data: st.DataObject) -> None:
    """Fields replaced, deleted, added, duplicated, swapped, renamed, re-typed; then bytes
    flipped, cut, inserted, or nasty tokens spliced in."""
    with tempfile.TemporaryDirectory() as tmp:
        written, blob = _written(data, tmp)
        doc = json.loads(blob)
        if data.draw(st.booleans(), label="fields"):
            blob = dumps(data.draw, mutate_doc(data.draw, doc, json_values))
        if data.draw(st.booleans(), label="bytes"):
            blob = mutate_bytes(data.draw, blob, manifest_regions(blob))
        assert_same_answer(blob, written.ignore_extensions)
