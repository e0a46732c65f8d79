"""paused_gc restores the collector's state, whatever it was and however the block ends."""

from __future__ import annotations

import gc

import pytest

from shardspec.format.gcpause import paused_gc
from shardspec.format.manifest import Piece


@pytest.mark.parametrize("enabled", [True, False])
def test_paused_gc_restores_the_previous_state(enabled: bool) -> None:
    (gc.enable if enabled else gc.disable)()
    try:
        with paused_gc():
            assert not gc.isenabled()
        assert gc.isenabled() == enabled
        with pytest.raises(RuntimeError), paused_gc():
            raise RuntimeError("boom")
        assert gc.isenabled() == enabled
    finally:
        gc.enable()


def test_piece_from_dict_equals_the_constructed_piece() -> None:
    # from_dict fills the frozen dataclass directly, bypassing __init__: it must still be the
    # same value, hash alike and stay frozen.
    data = {"rank": 3, "file": "f.safetensors", "offset": [3, 0], "shape": [1, 2], "replica": 1}
    built = Piece(rank=3, file="f.safetensors", offset=(3, 0), shape=(1, 2), replica=1)
    parsed = Piece.from_dict(data)
    assert parsed == built and hash(parsed) == hash(built) and parsed.to_dict() == data
    with pytest.raises(AttributeError):
        parsed.rank = 4  # type: ignore[misc]
    local = Piece.from_dict({"rank": 0, "file": "f.safetensors", "shape": [2]})
    assert local == Piece(rank=0, file="f.safetensors", shape=(2,))
