"""Property: HF -> convert(TP=N, PP=M) -> merge gives back the original tensors bit for bit, and
every rank's piece is the slice torch takes for its style (checked against the test's own table
of Llama styles, not the converter's)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import shardspec
from checkpoints import raw_bytes
from hf_helpers import expected_split_dim, load_hf_dir, write_hf_dir
from shardspec.convert import convert, merge
from shardspec.format.stages import assign_stages
from tiny_llama import TINY_LLAMA_DRAWS, tiny_llama


@pytest.mark.filterwarnings("ignore:pipeline stage")  # more stages than layers: announced
@settings(max_examples=25)
@given(
    tp=st.sampled_from([1, 2, 4]),
    pp=st.integers(1, 3),
    **TINY_LLAMA_DRAWS,
)
def test_convert_merge_round_trip(tp: int, pp: int, layers: int, tie: bool, bias: bool,
                                  shards: int, dtype: torch.dtype, seed: int) -> None:
    tensors = tiny_llama(layers, dtype, tie, bias, seed)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        src = write_hf_dir(root / "hf", tensors, shards=shards, tie=tie, kv_heads=4)
        manifest = convert(src, root / "ckpt", tp_size=tp, pp_size=pp)
        layout = manifest.layout

        # each rank holds exactly its stage's tensors, each the torch slice of its style
        full = dict(tensors)
        if tie:
            full["lm_head.weight"] = tensors["model.embed_tokens.weight"]
        stage = assign_stages(full, pp)
        for rank in range(layout.world_size):
            coords = layout.coordinates(rank)
            loaded = shardspec.load_rank(root / "ckpt", rank, device="cpu")
            assert set(loaded) == {n for n in full if stage[n] == coords["pp_rank"]}
            for name, tensor in loaded.items():
                dim = expected_split_dim(name)
                want = full[name] if dim is None else \
                    torch.chunk(full[name], tp, dim=dim)[coords["tp_rank"]]
                assert tensor.dtype == want.dtype and tensor.shape == want.shape, name
                assert raw_bytes(tensor) == raw_bytes(want), name

        merge(root / "ckpt", root / "merged")
        merged = load_hf_dir(root / "merged")
        assert sorted(merged) == sorted(tensors)
        for name, tensor in tensors.items():
            assert merged[name].dtype == tensor.dtype and merged[name].shape == tensor.shape
            assert raw_bytes(merged[name]) == raw_bytes(tensor), name
