"""Property: HF -> convert(TP=N, PP=M) -> reshard(TP=K, PP=M') -> merge gives back the original
Hugging Face tensors bit for bit, for generated N, K in {1, 2, 4} and M, M' in {1, 2}; the
resharded checkpoint validates with every checksum, and every resharded rank holds exactly the
torch slice of its style (the test's own table of Llama styles, not the converter's).

A TP=1 source (N=1) carries no split to infer: its pieces have one offset per dimension, so
:mod:`shardspec.reshard.plan` (by design, see its docstring) lays every tensor out replicated
under the target TP size, and ``reshard`` has no ``split_dims`` to say otherwise. For N=1 the
property therefore expects every resharded rank to hold whole tensors (which still merges back
bit for bit), and additionally checks that a :class:`Resharder` given the split dims of the TP
plan (``split_dims``) loads the torch slices of each style from that same TP=1 source.
"""

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
from shardspec import Layout
from shardspec.convert import convert, merge
from shardspec.format.manifest import Alias, TensorRecord
from shardspec.format.stages import assign_stages
from shardspec.reshard import load_resharded, reshard
from shardspec.reshard.plan import Resharder
from tiny_llama import TINY_LLAMA_DRAWS, tiny_llama

CPU = torch.device("cpu")


def _want(full: dict[str, torch.Tensor], name: str, dim: int | None, tp: int, tp_rank: int
          ) -> torch.Tensor:
    return full[name] if dim is None else torch.chunk(full[name], tp, dim=dim)[tp_rank]


def _assert_bitwise(got: torch.Tensor, want: torch.Tensor, name: str) -> None:
    assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape), name
    assert raw_bytes(got) == raw_bytes(want), name


@pytest.mark.filterwarnings("ignore:pipeline stage")  # more stages than layers: announced
@settings(max_examples=20, deadline=None)
@given(
    src_tp=st.sampled_from([1, 2, 4]),
    src_pp=st.integers(1, 2),
    dst_tp=st.sampled_from([1, 2, 4]),
    dst_pp=st.integers(1, 2),
    **TINY_LLAMA_DRAWS,
)
def test_convert_reshard_merge_round_trip(
    src_tp: int, src_pp: int, dst_tp: int, dst_pp: int, layers: int, tie: bool, bias: bool,
    shards: int, dtype: torch.dtype, seed: int,
) -> None:
    tensors = tiny_llama(layers, dtype, tie, bias, seed)  # N and K: even splits
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        src = write_hf_dir(root / "hf", tensors, shards=shards, tie=tie, kv_heads=4)
        convert(src, root / "ckpt", tp_size=src_tp, pp_size=src_pp)
        layout = Layout(tp_size=dst_tp, pp_size=dst_pp)
        manifest = reshard(root / "ckpt", root / "resharded", layout)
        assert manifest.layout.tp_size == dst_tp and manifest.layout.pp_size == dst_pp
        report = shardspec.validate(root / "resharded", checksums=True)
        assert report.ok, report.findings

        # the global tensors, the tied LM head given back by convert included
        full = dict(tensors)
        if tie:
            full["lm_head.weight"] = tensors["model.embed_tokens.weight"]
        source = shardspec.open(root / "ckpt").manifest
        aliases = {n: r.alias_of for n, r in source.tensors.items() if isinstance(r, Alias)}
        # convert aliases the tied pair only where both live on the same ranks (PP=1)
        assert bool(aliases) == (tie and src_pp == 1)
        # stages under M': assign_stages's, an alias and its target on the stages of both
        stages = {n: {s} for n, s in assign_stages(full, dst_pp).items()}
        for alias, target in aliases.items():
            stages[alias] = stages[target] = stages[alias] | stages[target]

        for rank in range(layout.size):
            coords = layout.coordinates(rank)
            loaded = shardspec.load_rank(root / "resharded", rank, device="cpu")
            assert set(loaded) == {n for n in full if coords["pp_rank"] in stages[n]}
            for name, tensor in loaded.items():
                # a TP=1 source has no inferable split: everything comes back replicated
                dim = None if src_tp == 1 else expected_split_dim(name)
                _assert_bitwise(tensor, _want(full, name, dim, dst_tp, coords["tp_rank"]), name)

        if src_tp == 1 and dst_tp > 1:
            # the same TP=1 source, with the split dims of the TP plan given explicitly
            split_dims = {n: expected_split_dim(n) for n, r in source.tensors.items()
                          if isinstance(r, TensorRecord)}
            resharder = Resharder(source, layout, split_dims=split_dims)
            for rank in range(layout.size):
                tp_rank = layout.coordinates(rank)["tp_rank"]
                got = load_resharded(root / "ckpt", source, rank, layout, CPU,
                                     resharder=resharder)
                for name, tensor in got.items():
                    want = _want(full, name, expected_split_dim(name), dst_tp, tp_rank)
                    _assert_bitwise(tensor, want, name)

        merge(root / "resharded", root / "merged")
        merged = load_hf_dir(root / "merged")
        assert sorted(merged) == sorted(tensors)
        for name, tensor in tensors.items():
            _assert_bitwise(merged[name], tensor, name)
