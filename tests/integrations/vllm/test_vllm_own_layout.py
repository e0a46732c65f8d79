"""The vLLM plugin at a checkpoint's own layout, without an engine: a ``convert --names vllm``
rank whose fused ``qkv_proj`` / ``gate_up_proj`` are global tensors held in one piece per part
(format 1.3) is recognised as the worker's own state, and each piece is read straight into its
rows of the parameter. (The real engine: tests/integrations/vllm/test_vllm_engine.py.)"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import shardspec
from hf_helpers import llama_tensors, write_hf_dir
from shardspec import Layout, Shard
from shardspec.convert import convert
from shardspec.convert.tp_plan import PlanWarning
from shardspec.integrations.vllm.layouts import EngineRank
from shardspec.integrations.vllm.own_layout import is_own_state, rank_values
from shardspec.integrations.vllm.placements import own_layout_plan
from shardspec.integrations.vllm.regions import Heads
from shardspec.integrations.vllm.replay import replay

GATE_UP = "model.layers.0.mlp.gate_up_proj.weight"


def _converted(tmp_path: Path, tp: int, kv_heads: int, **kwargs: object) -> Path:
    tensors = llama_tensors(layers=1, hidden=16, heads=4, kv_heads=kv_heads, bias=True,
                            dtype=torch.bfloat16)
    src = write_hf_dir(tmp_path / "hf", tensors, config={
        "num_attention_heads": 4, "num_key_value_heads": kv_heads, "hidden_size": 16})
    dst = tmp_path / "ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)  # replicated key/value heads
        convert(src, dst, tp_size=tp, names="vllm", **kwargs)  # type: ignore[arg-type]
    return dst


@pytest.mark.parametrize(("tp", "kv_heads", "rank_local"), [
    (1, 2, False), (2, 2, False), (4, 2, False), (2, 1, False), (2, 2, True)])
def test_a_rank_of_pieces_per_part_is_read_into_its_rows_of_each_parameter(
        tmp_path: Path, tp: int, kv_heads: int, rank_local: bool) -> None:
    dst = _converted(tmp_path, tp, kv_heads, **({"sharded_state": True} if rank_local else {}))
    checkpoint = shardspec.open(dst)
    heads = Heads(4, kv_heads, 4)
    for rank in range(tp):
        want = checkpoint.load_rank(rank, "cpu")
        shapes = {name: tuple(t.shape) for name, t in want.items()}
        assert is_own_state(checkpoint.manifest, rank, EngineRank(tp, rank), shapes, heads)
        plan = checkpoint.plan(rank)
        assert {n: s for n, (_, s) in rank_values(plan).items()} == \
            {n: s for n, s in shapes.items() if n in rank_values(plan)}
        assert bool(plan.joins) == (tp > 1 and not rank_local)
        targets = {name: torch.full_like(t, float("nan")) if t.is_floating_point()
                   else torch.empty_like(t) for name, t in want.items()}
        placed = own_layout_plan({f.record.path: list(f.expected) for f in plan.files},
                                 targets, plan.joins)
        for name, join in plan.joins.items():  # one contiguous read a piece, rows in order
            reads = sorted((r for r in placed.reads if r.target == name), key=lambda r: r.dst)
            assert [r.count for r in reads] == [1] * len(join.pieces)
            assert [r.file for r in reads] == [p.file for p in join.pieces]
            assert all(a.dst + a.length == b.dst for a, b in zip(reads, reads[1:], strict=False))
        replay(dst, checkpoint.manifest, placed, targets)
        for name, tensor in want.items():
            assert torch.equal(targets[name], tensor), (rank, name)


def test_pieces_that_are_not_vllms_parts_are_not_the_workers_state(tmp_path: Path) -> None:
    """A global gate_up_proj cut in one slice a rank (as resharding cuts a tensor) has the
    shape of vLLM's parameter but not its rows: not the worker's own state. Nor is a fused
    tensor whose parts are unknown (no head counts)."""
    torch.manual_seed(0)
    fused = torch.randn(64, 16)
    ckpt = tmp_path / "matrix"
    shardspec.save({r: {GATE_UP: fused[r * 32:(r + 1) * 32]} for r in range(2)}, ckpt,
                   layout=Layout(tp_size=2),
                   sharding={r: {GATE_UP: Shard((64, 16), (r * 32, 0))} for r in range(2)})
    manifest = shardspec.open(ckpt).manifest
    shapes = {GATE_UP: (32, 16)}
    assert not any(is_own_state(manifest, r, EngineRank(2, r), shapes, None) for r in range(2))
    per_part = tmp_path / "per-part"
    shardspec.save({r: {GATE_UP: torch.cat([fused[r * 16:(r + 1) * 16],
                                            fused[32 + r * 16:32 + (r + 1) * 16]])}
                    for r in range(2)}, per_part, layout=Layout(tp_size=2),
                   sharding={r: {GATE_UP: [Shard((64, 16), (r * 16, 0), shape=(16, 16)),
                                           Shard((64, 16), (32 + r * 16, 0), shape=(16, 16))]}
                             for r in range(2)})
    manifest = shardspec.open(per_part).manifest
    assert all(is_own_state(manifest, r, EngineRank(2, r), shapes, None) for r in range(2))
    qkv = _converted(tmp_path, 2, 2)
    manifest = shardspec.open(qkv).manifest
    shapes = {n: tuple(t.shape) for n, t in shardspec.load_rank(qkv, 0, device="cpu").items()}
    assert is_own_state(manifest, 0, EngineRank(2, 0), shapes, Heads(4, 2, 4))
    assert not is_own_state(manifest, 0, EngineRank(2, 0), shapes, None)
    assert not is_own_state(manifest, 0, EngineRank(2, 0), shapes, Heads(4, 4, 2))


def test_a_join_along_another_dim_is_read_as_a_run_of_each_row(tmp_path: Path) -> None:
    """Pieces joined along dim 1 (columns): each piece lands as its run of every row of the
    parameter, one strided read."""
    torch.manual_seed(1)
    full = torch.randn(4, 12)
    value = torch.cat([full[:, 0:3], full[:, 6:9]], dim=1)  # rank 0's columns of two parts
    ckpt = tmp_path / "columns"
    shardspec.save({0: {"w": value}, 1: {"w": torch.cat([full[:, 3:6], full[:, 9:12]], 1)}},
                   ckpt, layout=Layout(tp_size=2),
                   sharding={r: {"w": [Shard((4, 12), (0, 3 * r), shape=(4, 3)),
                                       Shard((4, 12), (0, 6 + 3 * r), shape=(4, 3))]}
                             for r in range(2)})
    checkpoint = shardspec.open(ckpt)
    plan = checkpoint.plan(0)
    targets = {"w": torch.full((4, 6), float("nan"))}
    placed = own_layout_plan({f.record.path: list(f.expected) for f in plan.files}, targets,
                             plan.joins)
    assert sorted((r.dst, r.dst_stride, r.length, r.count) for r in placed.reads) == [
        (0, 24, 12, 4), (12, 24, 12, 4)]
    replay(ckpt, checkpoint.manifest, placed, targets)
    assert torch.equal(targets["w"], value)
