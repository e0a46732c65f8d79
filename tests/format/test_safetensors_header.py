"""SPEC 6.3-6.5: the safetensors container rules, one hand-written header per rule."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file
from test_fuzz import dumps, mutate_bytes, mutate_doc
from test_fuzz import json_values as fuzz_values

from checkpoints import safetensors_bytes, tensor_file_bytes
from shardspec import SafetensorsError
from shardspec.format import safetensors_header
from shardspec.format.dtypes import DTYPES, byte_size
from shardspec.format.limits import MAX_SAFETENSORS_HEADER_BYTES
from shardspec.format.safetensors_header import Header, read_header


def parse(data: bytes) -> Header:
    return read_header(io.BytesIO(data), len(data), "f.safetensors")


def code_of(data: bytes) -> str:
    with pytest.raises(SafetensorsError) as info:
        parse(data)
    assert info.value.finding.file == "f.safetensors"
    return info.value.code


def entry(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def test_valid_header_parses() -> None:
    data = tensor_file_bytes({"a": ("F32", [2], b"\x00" * 8), "b": ("U8", [3], b"abc")},
                             metadata={"format": "pt"})
    header = parse(data)
    assert header.metadata == {"format": "pt"}
    assert list(header.entries) == ["a", "b"]
    a, b = header.entries["a"], header.entries["b"]
    assert (a.dtype.name, a.shape, a.begin, a.end) == ("F32", (2,), 0, 8)
    assert (b.dtype.name, b.shape, b.begin, b.end) == ("U8", (3,), 8, 11)
    assert header.data_start == len(data) - 11
    assert header.header_bytes == data[: header.data_start]


def test_trailing_space_padding_is_allowed() -> None:
    data = safetensors_bytes({"a": entry("U8", [1], 0, 1)}, b"x", pad=7)
    assert parse(data).entries["a"].end == 1


def test_empty_header_and_no_data_is_valid() -> None:
    assert parse(safetensors_bytes({})).entries == {}
    assert parse(safetensors_bytes({"__metadata__": {}})).metadata == {}


def test_file_written_by_safetensors_parses_with_identical_entries(tmp_path: Path) -> None:
    tensors = {
        "w": torch.randn(3, 5),
        "b": torch.zeros(0, 2, dtype=torch.float16),
        "s": torch.tensor(7, dtype=torch.int64),
        "q": torch.zeros(2, 3, dtype=torch.uint8).view(torch.float4_e2m1fn_x2),
        "f8": torch.zeros(4, dtype=torch.float8_e4m3fn),
    }
    path = tmp_path / "x.safetensors"
    save_file(tensors, str(path), metadata={"k": "v"})
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    reference = json.loads(raw[8 : 8 + length])
    header = parse(raw)
    assert header.metadata == reference.pop("__metadata__") == {"k": "v"}
    assert {
        name: {"dtype": e.dtype.name, "shape": list(e.shape), "data_offsets": [e.begin, e.end]}
        for name, e in header.entries.items()
    } == reference
    assert header.entries["q"].shape == (2, 6)  # F4 shapes count 4-bit elements


@pytest.mark.parametrize("size", range(8))
def test_file_shorter_than_8_bytes(size: int) -> None:
    assert code_of(b"{" * size) == "st-header-length"


def test_header_length_over_the_limit() -> None:
    data = safetensors_bytes({}, length=MAX_SAFETENSORS_HEADER_BYTES + 1)
    assert code_of(data) == "st-header-length"


def test_header_length_past_end_of_file() -> None:
    data = safetensors_bytes({}, length=100)
    assert code_of(data) == "st-header-length"


def test_header_length_of_2_to_64_minus_1_is_refused_without_allocating() -> None:
    data = struct.pack("<Q", 2**64 - 1) + b"{}"
    assert code_of(data) == "st-header-length"


def test_header_must_start_with_a_brace() -> None:
    assert code_of(safetensors_bytes(b' {"a": 1}')) == "st-header-json"
    assert code_of(safetensors_bytes(b"[]")) == "st-header-json"


def test_header_must_be_a_single_object() -> None:
    assert code_of(safetensors_bytes(b"[1, 2]")) == "st-header-json"
    assert code_of(safetensors_bytes(b'"{"')) == "st-header-json"
    assert code_of(safetensors_bytes(b"{} []")) == "st-header-json"


def test_header_must_be_json() -> None:
    assert code_of(safetensors_bytes(b'{"a": NaN}')) == "st-header-json"
    assert code_of(safetensors_bytes(b"{\xff}")) == "st-header-json"


def test_duplicate_key() -> None:
    text = b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},' \
           b'"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}'
    assert code_of(safetensors_bytes(text, b"xy")) == "st-duplicate-key"


@pytest.mark.parametrize("metadata", [{"k": 1}, {"k": None}, {"k": ["v"]}, "text", [1]])
def test_metadata_must_map_strings_to_strings(metadata: Any) -> None:
    assert code_of(safetensors_bytes({"__metadata__": metadata})) == "st-metadata"


@pytest.mark.parametrize(
    "value",
    [
        {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "extra": 0},
        {"dtype": "U8", "shape": [1]},
        "not an object",
        {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]},
        {"dtype": "U8", "shape": [1.0], "data_offsets": [0, 1]},
        {"dtype": "U8", "shape": [True], "data_offsets": [0, 1]},
        {"dtype": "U8", "shape": 1, "data_offsets": [0, 1]},
        {"dtype": "U8", "shape": [1] * 65, "data_offsets": [0, 1]},
        {"dtype": "U8", "shape": [1], "data_offsets": [1, 0]},
        {"dtype": "U8", "shape": [1], "data_offsets": [0]},
        {"dtype": "U8", "shape": [1], "data_offsets": [-1, 0]},
        {"dtype": "U8", "shape": [1], "data_offsets": [0, 2**63]},
    ],
    ids=["extra-key", "missing-key", "non-object", "negative-dim", "float-dim", "bool-dim",
         "shape-not-list", "too-many-dims", "begin-after-end", "one-offset",
         "negative-offset", "offset-2-63"],
)
def test_malformed_entry(value: Any) -> None:
    with pytest.raises(SafetensorsError) as info:
        parse(safetensors_bytes({"t": value}, b"x"))
    assert info.value.code == "st-entry"
    assert info.value.finding.tensor == "t"


@pytest.mark.parametrize("dtype", ["F9", "f32", ""])
def test_unknown_dtype(dtype: Any) -> None:
    assert code_of(safetensors_bytes({"t": {"dtype": dtype, "shape": [1],
                                            "data_offsets": [0, 1]}}, b"x")) == "st-dtype"


@pytest.mark.parametrize("dtype", [5, None, ["F32"]])
def test_a_dtype_that_is_not_a_string_is_a_malformed_entry(dtype: Any) -> None:
    """SPEC 6.3 rule 5: only a string naming no dtype is st-dtype."""
    assert code_of(safetensors_bytes({"t": {"dtype": dtype, "shape": [1],
                                            "data_offsets": [0, 1]}}, b"x")) == "st-entry"


def test_byte_size_must_match_the_shape() -> None:
    assert code_of(safetensors_bytes({"t": entry("F32", [2], 0, 7)}, b"x" * 7)) == "st-size"


def test_shape_product_overflow() -> None:
    data = safetensors_bytes({"t": entry("U8", [2**62, 4], 0, 0)})
    assert code_of(data) == "st-size"
    data = safetensors_bytes({"t": entry("F64", [2**61], 0, 0)})  # elements fit, bytes do not
    assert code_of(data) == "st-size"


def test_f4_must_fill_whole_bytes() -> None:
    assert code_of(safetensors_bytes({"t": entry("F4", [3], 0, 1)}, b"x")) == "st-size"
    assert parse(safetensors_bytes({"t": entry("F4", [4], 0, 2)}, b"xy")).entries["t"].end == 2


def test_f6_packs_four_elements_in_three_bytes() -> None:
    assert parse(safetensors_bytes({"t": entry("F6_E2M3", [4], 0, 3)}, b"xyz")).entries
    assert code_of(safetensors_bytes({"t": entry("F6_E3M2", [2], 0, 2)}, b"xy")) == "st-size"


def test_overlapping_tensors() -> None:
    data = safetensors_bytes({"a": entry("U8", [2], 0, 2), "b": entry("U8", [2], 1, 3)}, b"xyz")
    assert code_of(data) == "st-offsets"


def test_hole_between_tensors() -> None:
    data = safetensors_bytes({"a": entry("U8", [1], 0, 1), "b": entry("U8", [1], 2, 3)}, b"xyz")
    assert code_of(data) == "st-offsets"


def test_hole_at_the_start() -> None:
    assert code_of(safetensors_bytes({"a": entry("U8", [1], 1, 2)}, b"xy")) == "st-offsets"


def test_trailing_bytes_after_the_last_tensor() -> None:
    assert code_of(safetensors_bytes({"a": entry("U8", [1], 0, 1)}, b"xy")) == "st-offsets"
    assert code_of(safetensors_bytes({}, b"x")) == "st-offsets"


def test_data_past_end_of_file() -> None:
    assert code_of(safetensors_bytes({"a": entry("U8", [4], 0, 4)}, b"xy")) == "st-offsets"


def test_zero_size_tensors_may_share_an_offset() -> None:
    data = safetensors_bytes({"a": entry("U8", [0], 0, 0), "b": entry("U8", [2], 0, 2),
                              "c": entry("F32", [0, 3], 2, 2)}, b"xy")
    assert set(parse(data).entries) == {"a", "b", "c"}


def test_entries_may_be_listed_out_of_offset_order() -> None:
    data = safetensors_bytes({"b": entry("U8", [1], 1, 2), "a": entry("U8", [1], 0, 1)}, b"xy")
    assert parse(data).entries["b"].begin == 1


def test_errors_name_the_file_the_tensor_and_the_spec() -> None:
    with pytest.raises(SafetensorsError) as info:
        parse(safetensors_bytes({"bad.name": entry("F32", [2], 0, 7)}, b"x" * 7))
    text = str(info.value)
    assert "'f.safetensors'" in text and "'bad.name'" in text and "SPEC 6.3" in text


# --- the fast path: msgspec where it is sure, the same Header or the same refusal ------------


def both_paths(data: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """(fast, strict): the Header read each way, or the refusal's (code, message)."""
    out = []
    for fast in (True, False):
        monkeypatch.setattr(safetensors_header, "_FAST_PATH", fast)
        try:
            out.append(parse(data))
        except SafetensorsError as exc:
            out.append((exc.code, exc.finding.message))
    monkeypatch.setattr(safetensors_header, "_FAST_PATH", True)
    return out[0], out[1]


@pytest.mark.parametrize("text", [
    '{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "a": {"dtype": "U8", '
    '"shape": [1], "data_offsets": [0, 1]}}',
    '{"a": {"dtype": "U8", "dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}',
    '{"__metadata__": {"k": "v", "k": "v"}, "a": {"dtype": "U8", "shape": [1], '
    '"data_offsets": [0, 1]}}',
    '{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "x": 1}, "a": 2}',
])
def test_a_name_twice_gets_the_strict_refusal(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fast, strict = both_paths(safetensors_bytes(text, b"x"), monkeypatch)
    assert fast == strict and strict[0] == "st-duplicate-key"


def test_a_valid_header_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    data = tensor_file_bytes({"a": ("F32", [2], b"\x00" * 8), "b": ("U8", [3], b"abc")},
                             metadata={"format": "pt"})
    strict = safetensors_header._strict_json

    def refuse(body: bytes, file: str) -> Any:
        raise AssertionError("the strict parser ran")

    monkeypatch.setattr(safetensors_header, "_strict_json", refuse)
    fast = parse(data)
    monkeypatch.setattr(safetensors_header, "_strict_json", strict)
    monkeypatch.setattr(safetensors_header, "_FAST_PATH", False)
    assert fast == parse(data)


_SIZES = st.sampled_from([0, 1, 2, 3, 4, 8, 2**62, 2**63 - 1, 2**63, -1])


@st.composite
def header_files(draw: st.DrawFn) -> bytes:
    """A valid data file, perhaps then mutated field by field or byte by byte."""
    entries: dict[str, Any] = {}
    position = 0
    for name in draw(st.lists(st.sampled_from(["a", "b", "c", "é", "x\\y", 'q"']), unique=True,
                              max_size=4)):
        dtype = draw(st.sampled_from(["U8", "F32", "BF16", "F4", "BOOL"]))
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        size = byte_size(DTYPES[dtype], shape)
        if size is None:
            continue
        entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [position,
                                                                          position + size]}
        position += size
    if draw(st.booleans()):
        entries["__metadata__"] = draw(st.dictionaries(st.text(max_size=3), st.text(max_size=3),
                                                       max_size=2))
    if draw(st.booleans()):
        entries = mutate_doc(draw, entries, fuzz_values | _SIZES)
    body = dumps(draw, entries, compact=draw(st.booleans()))
    if draw(st.booleans()):
        body = mutate_bytes(draw, body)
    return safetensors_bytes(body, b"\x00" * position, pad=draw(st.integers(0, 3)))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(header_files())
def test_fast_and_strict_paths_read_every_header_alike(data: bytes) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        fast, strict = both_paths(data, monkeypatch)
    assert fast == strict
