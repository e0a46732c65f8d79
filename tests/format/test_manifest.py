"""SPEC 3.1 and 5.2: the typed manifest, its stable serialization and the rank order."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import asdict

from shardspec import Layout, Manifest
from shardspec.format.manifest import RANK_ORDERS, Alias, Piece, TensorRecord, format_version


def test_format_version_is_1_3() -> None:
    assert format_version() == "1.3"


def test_from_dict_to_dict_round_trip(manifest_dict: dict[str, Any]) -> None:
    manifest = Manifest.from_dict(manifest_dict)
    assert manifest.to_dict() == manifest_dict
    assert Manifest.from_dict(manifest.to_dict()) == manifest


def test_from_dict_reads_every_kind_of_record(manifest_dict: dict[str, Any]) -> None:
    manifest = Manifest.from_dict(manifest_dict)
    assert manifest.world_size == 2
    assert manifest.tensors["lm_head.weight"] == Alias(alias_of="model.embed_tokens.weight")
    local = manifest.tensors["layers.0.qkv.weight"]
    assert isinstance(local, TensorRecord) and local.rank_local and local.shape is None
    norm = manifest.tensors["layers.0.norm.weight"]
    assert isinstance(norm, TensorRecord) and norm.shape == (4,)
    assert [p.replica for p in norm.pieces] == [0, 1]
    scalar = manifest.tensors["step"]
    assert isinstance(scalar, TensorRecord) and scalar.shape == () and not scalar.rank_local


def test_replica_zero_is_omitted_and_defaults_back() -> None:
    piece = Piece(rank=0, file="a.safetensors", shape=(2,), offset=(0,))
    assert "replica" not in piece.to_dict()
    assert Piece.from_dict({"rank": 0, "file": "a.safetensors", "offset": [0], "shape": [2],
                            "replica": 0}) == piece


def test_from_dict_builds_the_objects_the_constructors_build(manifest_dict: dict[str, Any]
                                                            ) -> None:
    """Tensor records are filled in without ``__init__``: nothing tells them apart."""
    for share in (False, True):
        manifest = Manifest.from_dict(manifest_dict, share=share)
        for record in manifest.tensors.values():
            if isinstance(record, TensorRecord):
                rebuilt = TensorRecord(dtype=record.dtype, shape=record.shape,
                                       logical=record.logical, tied_to=record.tied_to,
                                       pieces=tuple(
                                           Piece(**asdict(p)) for p in record.pieces))
                assert rebuilt == record and vars(rebuilt) == vars(record)
                assert [asdict(p) for p in rebuilt.pieces] == [asdict(p) for p in record.pieces]
                assert list(vars(record)) == ["dtype", "shape", "pieces", "logical",
                                               "tied_to"]


def test_sharing_makes_equal_shapes_one_object(manifest_dict: dict[str, Any]) -> None:
    shared = Manifest.from_dict(manifest_dict, share=True)
    assert shared == Manifest.from_dict(manifest_dict)
    pieces = [p for t in shared.tensors.values() if isinstance(t, TensorRecord)
              for p in t.pieces]
    by_value = {p.shape: p.shape for p in pieces}
    assert all(p.shape is by_value[p.shape] for p in pieces)
    assert len({id(p.file) for p in pieces}) == len({p.file for p in pieces})


def test_without_sharing_an_int_is_never_taken_for_a_bool() -> None:
    """from_dict of unchecked data keeps each value as given ((True,) == (1,) as keys)."""
    data = {"dtype": "U8", "rank_local": True, "pieces": [
        {"rank": 0, "file": "a", "shape": [True]}, {"rank": 1, "file": "a", "shape": [1]}]}
    record = TensorRecord.from_dict(data)
    assert [type(p.shape[0]) for p in record.pieces] == [bool, int]


def test_to_json_is_stable_byte_for_byte(manifest_dict: dict[str, Any]) -> None:
    first = Manifest.from_dict(manifest_dict).to_json()
    again = Manifest.from_dict(json.loads(first)).to_json()
    assert first == again
    assert first.endswith(b"\n") and not first.endswith(b"\n\n")
    assert json.loads(first) == manifest_dict


def test_to_json_keeps_non_ascii_names_as_utf8(manifest_dict: dict[str, Any]) -> None:
    manifest_dict["metadata"] = {"modèle": "名前"}
    data = Manifest.from_dict(manifest_dict).to_json()
    assert "modèle".encode() in data and "名前".encode() in data


def test_to_json_puts_flat_records_on_one_line(manifest_dict: dict[str, Any]) -> None:
    text = Manifest.from_dict(manifest_dict).to_json().decode()
    piece_lines = [line for line in text.splitlines() if '"offset"' in line]
    assert piece_lines and all(line.strip().startswith('{"rank"') for line in piece_lines)


def test_layout_world_size_defaults_to_product() -> None:
    assert Layout(tp_size=2, pp_size=3, ep_size=4).world_size == 24


def test_layout_refuses_unknown_rank_order() -> None:
    with pytest.raises(ValueError, match="rank_order"):
        Layout(tp_size=2, rank_order="tp-tp-pp")


def test_default_order_with_ep_1_is_vllm_rank() -> None:
    layout = Layout(tp_size=4, pp_size=3)
    for pp_rank, tp_rank in itertools.product(range(3), range(4)):
        rank = pp_rank * 4 + tp_rank  # vLLM: rank = pp_rank * tp_size + tp_rank
        assert layout.rank_of(tp_rank=tp_rank, pp_rank=pp_rank, ep_rank=0) == rank
        assert layout.coordinates(rank) == {"tp_rank": tp_rank, "pp_rank": pp_rank, "ep_rank": 0}


def test_default_order_formula_with_ep() -> None:
    layout = Layout(tp_size=2, pp_size=3, ep_size=5)
    for pp_rank, ep_rank, tp_rank in itertools.product(range(3), range(5), range(2)):
        assert layout.rank_of(tp_rank=tp_rank, pp_rank=pp_rank, ep_rank=ep_rank) == (
            (pp_rank * 5 + ep_rank) * 2 + tp_rank)


@pytest.mark.parametrize("order", RANK_ORDERS)
def test_every_rank_order_numbers_ranks_slowest_to_fastest(order: str) -> None:
    sizes = {"tp": 2, "pp": 3, "ep": 4}
    layout = Layout(tp_size=2, pp_size=3, ep_size=4, rank_order=order)
    slow, middle, fast = order.split("-")
    seen = []
    for a, b, c in itertools.product(range(sizes[slow]), range(sizes[middle]),
                                     range(sizes[fast])):
        coords = {f"{slow}_rank": a, f"{middle}_rank": b, f"{fast}_rank": c}
        rank = layout.rank_of(**coords)
        assert rank == (a * sizes[middle] + b) * sizes[fast] + c
        assert layout.coordinates(rank) == coords
        seen.append(rank)
    assert seen == list(range(24))


@given(
    sizes=st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(1, 6)),
    order=st.sampled_from(RANK_ORDERS),
    data=st.data(),
)
def test_coordinates_invert_rank_of(sizes: tuple[int, int, int], order: str,
                                    data: st.DataObject) -> None:
    tp, pp, ep = sizes
    layout = Layout(tp_size=tp, pp_size=pp, ep_size=ep, rank_order=order)
    coords = {
        "tp_rank": data.draw(st.integers(0, tp - 1)),
        "pp_rank": data.draw(st.integers(0, pp - 1)),
        "ep_rank": data.draw(st.integers(0, ep - 1)),
    }
    rank = layout.rank_of(**coords)
    assert 0 <= rank < layout.size
    assert layout.coordinates(rank) == coords
