"""Pieces (format/pieces.py): built from parsed JSON as the constructor builds them, compared
and hashed by value, and never walked by the garbage collector."""

from __future__ import annotations

import gc
import pickle
from typing import Any

import pytest

from shardspec.format.pieces import Piece, build_pieces

DICTS: list[dict[str, Any]] = [
    {"rank": 0, "file": "a.safetensors", "offset": [0, 0], "shape": [2, 4]},
    {"rank": 1, "file": "a.safetensors", "offset": [2, 0], "shape": [2, 4], "replica": 1},
]


def test_built_from_dicts_as_the_constructor_builds_them() -> None:
    assert build_pieces(DICTS) == (
        Piece(rank=0, file="a.safetensors", offset=(0, 0), shape=(2, 4)),
        Piece(rank=1, file="a.safetensors", offset=(2, 0), shape=(2, 4), replica=1))
    assert [p.to_dict() for p in build_pieces(DICTS)] == [
        {"rank": 0, "file": "a.safetensors", "offset": [0, 0], "shape": [2, 4]},
        {"rank": 1, "file": "a.safetensors", "offset": [2, 0], "shape": [2, 4], "replica": 1}]


def test_a_rank_local_piece_ignores_offset_and_replica() -> None:
    """Members of those names in a rank-local piece are unknown fields (SPEC 4.3)."""
    assert build_pieces(DICTS, local=True)[1] == Piece(rank=1, file="a.safetensors",
                                                       shape=(2, 4))


def test_shared_values_are_one_object() -> None:
    first, second = build_pieces(DICTS, {})
    assert first.shape is second.shape and first.file is second.file


def test_compared_and_hashed_by_value_and_immutable() -> None:
    piece = Piece(rank=0, file="a.safetensors", shape=(2,), offset=(0,))
    same = Piece.from_dict({"rank": 0, "file": "a.safetensors", "offset": [0], "shape": [2]})
    assert piece == same and hash(piece) == hash(same) and len({piece, same}) == 1
    assert piece != Piece(rank=0, file="a.safetensors", shape=(2,), offset=(0,), replica=1)
    assert pickle.loads(pickle.dumps(piece)) == piece
    with pytest.raises(AttributeError):
        piece.rank = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        Piece(0, "a.safetensors", (2,))  # type: ignore[misc]  # keywords only


def test_not_tracked_by_the_garbage_collector() -> None:
    assert not any(gc.is_tracked(p) for p in build_pieces(DICTS))
