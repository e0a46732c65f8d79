"""SPEC 11.3: resharding on load and `shardspec reshard`: bit-exact slices, partial reads,
refusals (rank-local tensors, non-TP splits, another ep_size), pipeline-stage changes."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

import shardspec
import shardspec.reshard.boxes as reshard_boxes
import shardspec.reshard.load as reshard_load
from checkpoints import Tiny, assert_same_tensor, raw_bytes, sha256_file, write_handmade
from shardspec import Layout, Quantization, RequestError, Shard
from shardspec.cli import app
from shardspec.format.stages import assign_stages
from shardspec.reshard import load_resharded, reshard
from shardspec.reshard.boxes import COALESCE_GAP, ReadStats
from shardspec.reshard.plan import Resharder, plan_reshard, slice_of

#: name -> (global tensor, split dim or None for replicated)
Weights = dict[str, tuple[torch.Tensor, int | None]]

CPU = torch.device("cpu")


# --- building checkpoints ----------------------------------------------------------------------


def llama(
    *,
    vocab: int,
    hidden: int,
    kv: int,
    inter: int,
    layers: int,
    dtype: torch.dtype = torch.bfloat16,
    tie: bool = False,
    seed: int = 0,
) -> Weights:
    """Tiny Llama-shaped global tensors with vLLM's split dims (lm_head tied if ``tie``)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    embed = rand(vocab, hidden)
    weights: Weights = {"model.embed_tokens.weight": (embed, 0)}
    for i in range(layers):
        p = f"model.layers.{i}."
        weights |= {
            p + "input_layernorm.weight": (rand(hidden), None),
            p + "self_attn.q_proj.weight": (rand(hidden, hidden), 0),
            p + "self_attn.k_proj.weight": (rand(kv, hidden), 0),
            p + "self_attn.v_proj.weight": (rand(kv, hidden), 0),
            p + "self_attn.o_proj.weight": (rand(hidden, hidden), 1),
            p + "post_attention_layernorm.weight": (rand(hidden), None),
            p + "mlp.gate_proj.weight": (rand(inter, hidden), 0),
            p + "mlp.up_proj.weight": (rand(inter, hidden), 0),
            p + "mlp.down_proj.weight": (rand(hidden, inter), 1),
        }
    weights["model.norm.weight"] = (rand(hidden), None)
    weights["lm_head.weight"] = (embed, 0) if tie else (rand(vocab, hidden), 0)
    return weights


def mixed(seed: int = 0) -> Weights:
    """Every kind the issue names: colwise, rowwise, replicated in bf16, fp32 and fp8, a scalar,
    zero-size tensors, uneven splits, and tied embeddings (an alias)."""
    gen = torch.Generator().manual_seed(seed)
    embed = torch.randn(11, 6, generator=gen).to(torch.bfloat16)
    fp8 = torch.randn(10, 7, generator=gen).to(torch.float8_e4m3fn)
    return {
        "model.embed_tokens.weight": (embed, 0),
        "lm_head.weight": (embed, 0),
        "col.bf16": (torch.randn(13, 5, generator=gen).to(torch.bfloat16), 0),
        "row.bf16": (torch.randn(5, 13, generator=gen).to(torch.bfloat16), 1),
        "col.f32": (torch.randn(9, 3, generator=gen), 0),
        "row.f32": (torch.randn(3, 2, 9, generator=gen), 2),
        "col.fp8": (fp8, 0),
        "row.fp8": (fp8.t().contiguous(), 1),
        "norm.bf16": (torch.randn(6, generator=gen).to(torch.bfloat16), None),
        "norm.f32": (torch.randn(6, generator=gen), None),
        "norm.fp8": (torch.randn(6, generator=gen).to(torch.float8_e5m2), None),
        "bias.middle": (torch.randn(2, 12, 3, generator=gen), 1),
        "step": (torch.tensor(7.25, dtype=torch.float64), None),
        "empty.rows": (torch.zeros(0, 4, dtype=torch.float16), 0),
        "empty.cols": (torch.zeros(6, 0, dtype=torch.float16), 0),
        "empty.replicated": (torch.zeros(3, 0), None),
    }


def save_sharded(
    path: Path,
    weights: Weights,
    tp: int,
    pp: int = 1,
    **save_kwargs: Any,
) -> shardspec.Manifest:
    """Write ``weights`` at (tp, pp): shardspec.split for TP, assign_stages for PP."""
    layout = Layout(tp_size=tp, pp_size=pp)
    stages = assign_stages(weights, pp)
    states: dict[int, dict[str, torch.Tensor]] = {r: {} for r in range(layout.size)}
    sharding: dict[int, dict[str, Shard]] = {r: {} for r in range(layout.size)}
    for name, (tensor, dim) in weights.items():
        for tp_rank, (piece, shard) in enumerate(shardspec.split(tensor, dim, tp)):
            rank = layout.rank_of(tp_rank=tp_rank, pp_rank=stages[name], ep_rank=0)
            states[rank][name] = piece
            sharding[rank][name] = shard
    return shardspec.save(states, path, layout=layout, sharding=sharding, **save_kwargs)


def expected_rank(
    weights: Weights, layout: Layout, rank: int, aliases: dict[str, str] | None = None
) -> dict[str, torch.Tensor]:
    """What ``rank`` of ``layout`` must hold: the slices shardspec.split gives, on the stages
    assign_stages gives; an alias of the source and its target on the stages of both."""
    coords = layout.coordinates(rank)
    stages = {name: {stage} for name, stage in assign_stages(weights, layout.pp_size).items()}
    for alias, target in (aliases or {}).items():
        stages[alias] = stages[target] = stages[alias] | stages[target]
    return {
        name: shardspec.split(tensor, dim, layout.tp_size)[coords["tp_rank"]][0]
        for name, (tensor, dim) in weights.items()
        if coords["pp_rank"] in stages[name]
    }


def source_aliases(path: Path) -> dict[str, str]:
    return {name: record.alias_of for name, record in shardspec.open(path).manifest.tensors.items()
            if isinstance(record, shardspec.format.manifest.Alias)}


def assert_rank_matches(
    got: dict[str, torch.Tensor],
    weights: Weights,
    layout: Layout,
    rank: int,
    aliases: dict[str, str] | None = None,
) -> None:
    want = expected_rank(weights, layout, rank, aliases)
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert_same_tensor(got[name], tensor)


# --- resharding on load --------------------------------------------------------------------


@pytest.mark.parametrize(("source_tp", "target_tp"), [(4, 2), (2, 4), (3, 2), (2, 3), (1, 1)])
def test_load_with_another_tp_size_is_bit_exact(
    tmp_path: Path, source_tp: int, target_tp: int
) -> None:
    weights = mixed()
    save_sharded(tmp_path / "c", weights, source_tp)
    checkpoint = shardspec.open(tmp_path / "c")
    target = Layout(tp_size=target_tp, rank_order="tp-pp-ep" if source_tp == 1 else "pp-ep-tp")
    for rank in range(target_tp):
        got = checkpoint.load_rank(rank, "cpu", layout=target)
        assert_rank_matches(got, weights, target, rank)
        # the alias comes back as the very tensor of its target (SPEC 7.6 rule 3)
        assert got["lm_head.weight"] is got["model.embed_tokens.weight"]


def test_same_layout_takes_the_native_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    weights = mixed()
    save_sharded(tmp_path / "c", weights, 2)

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("resharding path taken for the checkpoint's own layout")

    monkeypatch.setattr(shardspec.reader, "load_resharded", fail)
    got = shardspec.load_rank(tmp_path / "c", 1, "cpu", layout=Layout(tp_size=2))
    assert_rank_matches(got, weights, Layout(tp_size=2), 1)


def test_f4_split_along_its_last_dimension_in_whole_bytes(tmp_path: Path) -> None:
    packed = torch.randint(0, 256, (4, 6), dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    weights: Weights = {"w.f4": (packed, 1), "col.f4": (packed, 0)}
    save_sharded(tmp_path / "c", weights, 2)
    for target_tp in (3, 4, 6):
        target = Layout(tp_size=target_tp)
        for rank in range(target_tp):
            got = shardspec.load_rank(tmp_path / "c", rank, "cpu", layout=target)
            for name in weights:
                want = expected_rank(weights, target, rank)[name]
                assert got[name].dtype == want.dtype and got[name].shape == want.shape
                assert raw_bytes(got[name].view(torch.uint8)) == raw_bytes(
                    want.view(torch.uint8))


def test_slice_of_divides_like_tensor_split() -> None:
    for size in range(12):
        for parts in range(1, 6):
            pieces = torch.tensor_split(torch.arange(size), parts)
            for index, piece in enumerate(pieces):
                start, length = slice_of(size, parts, index)
                assert piece.tolist() == list(range(start, start + length))


# --- partial reads -----------------------------------------------------------------------


def test_tp8_to_tp2_reads_at_most_1_1x_the_target_bytes(tmp_path: Path) -> None:
    weights = llama(vocab=256, hidden=64, kv=16, inter=176, layers=2)
    save_sharded(tmp_path / "c", weights, 8)
    checkpoint = shardspec.open(tmp_path / "c")
    target = Layout(tp_size=2)
    for rank in range(2):
        stats = ReadStats()
        got = load_resharded(checkpoint.path, checkpoint.manifest, rank, target, CPU,
                             stats=stats)
        assert_rank_matches(got, weights, target, rank)
        assert stats.target_bytes == sum(t.numel() * t.element_size() for t in got.values())
        assert stats.bytes_read <= 1.1 * stats.target_bytes, stats
        # every wanted byte is read once: rowwise pieces of TP=8 lie whole in a TP=2 piece
        assert stats.data_bytes == stats.target_bytes
        assert sorted(stats.files_opened) == [
            f"model-rank-{r}-part-0.safetensors" for r in range(4 * rank, 4 * rank + 4)]


def test_files_of_ranks_not_overlapping_are_not_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    weights = llama(vocab=16, hidden=8, kv=4, inter=12, layers=2)
    save_sharded(tmp_path / "c", weights, 4)
    opened: list[str] = []
    real = reshard_load.open_inside

    def recording(root: Path, relative: str) -> Any:
        opened.append(relative)
        return real(root, relative)

    monkeypatch.setattr(reshard_load, "open_inside", recording)
    shardspec.load_rank(tmp_path / "c", 1, "cpu", layout=Layout(tp_size=2))
    assert sorted(opened) == ["model-rank-2-part-0.safetensors",
                              "model-rank-3-part-0.safetensors"]
    # they may be gone altogether
    (tmp_path / "c" / "model-rank-0-part-0.safetensors").unlink()
    (tmp_path / "c" / "model-rank-1-part-0.safetensors").unlink()
    got = shardspec.load_rank(tmp_path / "c", 1, "cpu", layout=Layout(tp_size=2))
    assert_rank_matches(got, weights, Layout(tp_size=2), 1)


def test_gaps_over_the_coalescing_limit_are_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    weights: Weights = {"row": (torch.randn(8, 64), 1)}
    save_sharded(tmp_path / "c", weights, 2)
    checkpoint = shardspec.open(tmp_path / "c")
    target = Layout(tp_size=4)
    coalesced = ReadStats()
    got = load_resharded(checkpoint.path, checkpoint.manifest, 0, target, CPU, stats=coalesced)
    assert_rank_matches(got, weights, target, 0)
    assert COALESCE_GAP >= 64 * 4  # the 8 rows' gaps are read: one read of the span
    assert coalesced.reads == 1 and coalesced.data_bytes == 7 * 32 * 4 + 16 * 4
    monkeypatch.setattr(reshard_boxes, "COALESCE_GAP", 0)
    exact = ReadStats()
    got = load_resharded(checkpoint.path, checkpoint.manifest, 0, target, CPU, stats=exact)
    assert_rank_matches(got, weights, target, 0)
    assert exact.reads == 8 and exact.data_bytes == exact.target_bytes == 8 * 16 * 4


@pytest.mark.parametrize("budget", [0.0, 0.5, 10.0])
def test_a_local_gap_budget_bounds_the_bytes_read(tmp_path: Path, budget: float) -> None:
    """``local_gap_budget`` (the DCP reader's): gaps between wanted runs of a local file are
    read only while everything read beyond the wanted bytes, the header included, stays within
    the budget; the smallest gaps first, each remaining span one call."""
    weights: Weights = {"row": (torch.randn(8, 64), 1)}
    save_sharded(tmp_path / "c", weights, 2)
    checkpoint = shardspec.open(tmp_path / "c")
    target = Layout(tp_size=4)
    stats = ReadStats()
    plan = Resharder(checkpoint.manifest, target).plan(0)
    got = reshard_load.execute_reshard(checkpoint.path, checkpoint.manifest, plan, CPU,
                                       stats=stats, local_gap_budget=budget)
    assert_rank_matches(got, weights, target, 0)
    wanted = 8 * 16 * 4  # 8 rows of 16 floats, 64-byte gaps between them
    assert stats.target_bytes == wanted
    extra = stats.data_bytes - wanted
    bridged = max(0, int(budget * wanted - stats.header_bytes)) // 64
    assert extra == 64 * min(7, bridged)
    assert stats.reads == 8 - min(7, bridged)
    assert extra + stats.header_bytes <= max(budget * wanted, stats.header_bytes)


def test_reads_that_follow_each_other_are_gathered_into_one_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # TP=8 -> TP=2: in each source file the column-parallel slices and the norms lie back to
    # back and go straight into the target: one read call for each such run, not each tensor.
    weights = llama(vocab=256, hidden=64, kv=16, inter=176, layers=2)
    save_sharded(tmp_path / "c", weights, 8)
    checkpoint = shardspec.open(tmp_path / "c")
    counts = []
    for iov_max in (reshard_boxes._IOV_MAX, 1):  # 1: every buffer a call of its own
        monkeypatch.setattr(reshard_boxes, "_IOV_MAX", iov_max)
        stats = ReadStats()
        got = load_resharded(checkpoint.path, checkpoint.manifest, 0, Layout(tp_size=2), CPU,
                             stats=stats)
        assert_rank_matches(got, weights, Layout(tp_size=2), 0)
        counts.append(stats.reads)
    split = sum(1 for _, dim in weights.values() if dim is not None)
    # ungathered: 4 source pieces of every split tensor, one source of every norm
    assert counts[1] == 4 * split + (len(weights) - split)
    # gathered: entries lie in name order; a row-parallel o or down is a read of its own (into
    # scratch), each run of other wanted entries one read. File 0 (the norms' source): [lm_head
    # embed norm], down, [gate up norm k], o, [q v norm], down, [gate up norm k], o, [q v norm]
    # = 9 reads; files 1-3 skip the norms, which splits each [gate up norm k] into [gate up],
    # [k]: 11 each.
    assert counts[0] == 9 + 3 * 11, counts


def test_short_reads_are_continued_where_they_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The kernel may return fewer bytes than asked (a signal, a network file system): every
    # gathered buffer must still be filled, from the right offset.
    weights = llama(vocab=256, hidden=64, kv=16, inter=176, layers=2)
    save_sharded(tmp_path / "c", weights, 8)
    real = os.preadv

    def short(fd: int, buffers: list[memoryview], offset: int) -> int:
        first = buffers[0]
        return real(fd, [first[: max(1, min(len(first), 7))]], offset)

    monkeypatch.setattr(os, "preadv", short)
    stats = ReadStats()
    checkpoint = shardspec.open(tmp_path / "c")
    got = load_resharded(checkpoint.path, checkpoint.manifest, 1, Layout(tp_size=2), CPU,
                         stats=stats)
    assert_rank_matches(got, weights, Layout(tp_size=2), 1)
    assert stats.reads > stats.data_bytes // 7 and stats.data_bytes == stats.target_bytes


# --- refusals ------------------------------------------------------------------------------


def test_rank_local_tensors_are_refused_by_name(tiny: Tiny) -> None:
    with pytest.raises(RequestError) as info:
        shardspec.load_rank(tiny.path, 0, "cpu", layout=Layout(tp_size=1))
    assert info.value.code == "reshard-rank-local" and info.value.section == "11.3"
    assert "'layers.0.qkv.weight'" in str(info.value)
    assert info.value.finding.tensor == "layers.0.qkv.weight"


def test_cli_refuses_rank_local_tensors_without_traceback(tiny: Tiny, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["reshard", str(tiny.path), str(tmp_path / "out"),
                                      "--tp", "1"])
    assert result.exit_code == 2  # a request the checkpoint cannot meet (SPEC 11.3)
    assert "reshard-rank-local" in result.output and "layers.0.qkv.weight" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_a_two_dimensional_block_split_is_refused(tmp_path: Path) -> None:
    full = torch.randn(4, 6)
    states, sharding = {}, {}
    for rank in range(4):
        row, col = divmod(rank, 2)
        states[rank] = {"block": full[2 * row : 2 * row + 2, 3 * col : 3 * col + 3]}
        sharding[rank] = {"block": Shard((4, 6), (2 * row, 3 * col))}
    shardspec.save(states, tmp_path / "c", layout=Layout(tp_size=4), sharding=sharding)
    with pytest.raises(RequestError) as info:
        shardspec.load_rank(tmp_path / "c", 0, "cpu", layout=Layout(tp_size=2))
    assert info.value.code == "reshard-unsupported"
    assert info.value.finding.tensor == "block" and "dimensions [0, 1]" in str(info.value)


def test_another_ep_size_without_experts_and_out_of_range_ranks(tmp_path: Path) -> None:
    state = mixed()
    save_sharded(tmp_path / "c", state, 2)
    checkpoint = shardspec.open(tmp_path / "c")
    # no routed experts: every expert rank holds every tensor (SPEC 11.3 rule 10 (c))
    for rank in range(2):
        got = checkpoint.load_rank(rank, "cpu", layout=Layout(tp_size=1, ep_size=2))
        assert sorted(got) == sorted(state)
        assert all(torch.equal(got[n], t) for n, (t, _) in state.items())
    with pytest.raises(RequestError) as info:
        checkpoint.load_rank(4, "cpu", layout=Layout(tp_size=4))
    assert info.value.code == "rank-out-of-range"
    with pytest.raises(shardspec.QuantizationError):
        checkpoint.load_rank(0, "cpu", layout=Layout(tp_size=4), expect_quantization="fp8")


def test_a_split_that_would_break_bytes_is_refused(tmp_path: Path) -> None:
    root = write_handmade(tmp_path / "c", {"even": ("F4", [2, 6], bytes(6)),
                                           "odd": ("F4", [2, 3], bytes(3)),
                                           "narrow": ("F4", [2, 1], bytes(1))})
    manifest = shardspec.open(root).manifest
    # from a TP=1 checkpoint no split can be inferred: split_dims gives it
    # 6 F4 elements a row into 4 along the last dimension, in whole bytes: 2 + 2 + 2 + 0
    plan = plan_reshard(manifest, Layout(tp_size=4), 0, split_dims={"even": 1})
    assert plan.pieces["even"].shape == (2, 2) and plan.pieces["odd"].shape == (2, 3)
    for split_dims in ({"odd": 1}, {"narrow": 0}):  # 3 elements a row; 1 element a piece
        with pytest.raises(RequestError) as info:
            Resharder(manifest, Layout(tp_size=2), split_dims=split_dims)
        assert info.value.code == "reshard-unsupported" and "whole bytes" in str(info.value)
        assert info.value.finding.tensor in split_dims


def test_verify_hashes_the_source_files_it_reads(tmp_path: Path) -> None:
    weights = mixed()
    save_sharded(tmp_path / "c", weights, 2)
    name = tmp_path / "c" / "model-rank-1-part-0.safetensors"
    data = bytearray(name.read_bytes())
    data[-1] ^= 0x01  # the last byte of the data region: same size, sound structure
    name.write_bytes(bytes(data))
    target = Layout(tp_size=4)
    shardspec.load_rank(tmp_path / "c", 0, "cpu", layout=target, verify=True)  # ranks 0 only
    shardspec.load_rank(tmp_path / "c", 3, "cpu", layout=target)  # not verified: loads
    with pytest.raises(shardspec.IntegrityError) as info:
        shardspec.load_rank(tmp_path / "c", 3, "cpu", layout=target, verify=True)
    assert info.value.code == "checksum-mismatch"
    name.write_bytes(bytes(data[:-1]))
    with pytest.raises(shardspec.IntegrityError) as info:
        shardspec.load_rank(tmp_path / "c", 3, "cpu", layout=target)
    assert info.value.code == "file-size"


# --- writing a resharded checkpoint ------------------------------------------------------------


def cli_reshard(source: Path, destination: Path, *args: str) -> None:
    result = CliRunner().invoke(app, ["reshard", str(source), str(destination), *args])
    assert result.exit_code == 0, result.output
    assert "resharded" in result.output


@pytest.mark.parametrize(("source", "target"), [((2, 2), (3, 1)), ((2, 1), (1, 2)),
                                                ((1, 1), (2, 3))])
def test_cli_reshard_changes_tp_and_pp(
    tmp_path: Path, source: tuple[int, int], target: tuple[int, int]
) -> None:
    weights = llama(vocab=12, hidden=6, kv=2, inter=10, layers=3, tie=source[1] == 1, seed=3)
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "llama"}')
    quantization = Quantization(method="fp8", config={"a": "b"})
    save_sharded(tmp_path / "src", weights, *source, extra_files=[config],
                 metadata={"model": "tiny"}, quantization=quantization)
    args = ["--tp", str(target[0]), "--pp", str(target[1])]
    cli_reshard(tmp_path / "src", tmp_path / "dst", *args)
    aliases = source_aliases(tmp_path / "src")
    report = shardspec.validate(tmp_path / "dst", checksums=True)
    assert report.ok, report.findings
    checkpoint = shardspec.open(tmp_path / "dst")
    layout = Layout(tp_size=target[0], pp_size=target[1])
    assert checkpoint.layout == layout
    manifest = checkpoint.manifest
    assert manifest.metadata == {"model": "tiny"}
    assert manifest.quantization == quantization
    assert [f.path for f in manifest.extra_files] == ["config.json"]
    assert sha256_file(tmp_path / "dst" / "config.json") == sha256_file(config)
    for rank in range(layout.size):
        if source[0] == 1:  # nothing to infer a split from: every tensor is replicated
            got = checkpoint.load_rank(rank, "cpu")
            names = set(expected_rank(weights, layout, rank, aliases))
            assert set(got) == names
            for name, tensor in got.items():
                assert_same_tensor(tensor, weights[name][0])
            continue
        assert_rank_matches(checkpoint.load_rank(rank, "cpu"), weights, layout, rank, aliases)
    # the tied embedding stays an alias where both names live on the same ranks
    if source[1] == 1 and target[1] == 1:
        assert manifest.tensors["lm_head.weight"] == shardspec.format.manifest.Alias(
            alias_of="model.embed_tokens.weight")


def test_cli_reshard_refuses_a_non_empty_destination_and_its_source(tmp_path: Path) -> None:
    save_sharded(tmp_path / "src", mixed(), 2)
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "keep.txt").write_text("x")
    runner = CliRunner()
    result = runner.invoke(app, ["reshard", str(tmp_path / "src"), str(tmp_path / "dst"),
                                 "--tp", "4"])
    assert result.exit_code == 2 and "--overwrite" in result.output
    result = runner.invoke(app, ["reshard", str(tmp_path / "src"), str(tmp_path / "src"),
                                 "--tp", "4", "--overwrite"])
    assert result.exit_code == 2 and "source" in result.output
    assert shardspec.validate(tmp_path / "src").ok
    result = runner.invoke(app, ["reshard", str(tmp_path / "src"), str(tmp_path / "dst"),
                                 "--tp", "0"])
    assert result.exit_code == 2
    cli_reshard(tmp_path / "src", tmp_path / "dst", "--tp", "4", "--overwrite")
    assert shardspec.validate(tmp_path / "dst").ok


def test_reshard_function_reports_progress(tmp_path: Path) -> None:
    weights = mixed()
    save_sharded(tmp_path / "src", weights, 3)
    calls: list[tuple[int, int]] = []
    manifest = reshard(tmp_path / "src", tmp_path / "dst", Layout(tp_size=2),
                                    progress=lambda done, total: calls.append((done, total)))
    assert manifest.layout == Layout(tp_size=2)
    assert calls[0][0] == 0 and calls[-1][0] == calls[-1][1] > 0
    dones = [done for done, _ in calls]
    assert dones == sorted(dones)
    assert len(set(dones)) > 3  # it moves while a rank's pieces are read, too
    for rank in range(2):
        assert_rank_matches(shardspec.load_rank(tmp_path / "dst", rank, "cpu"), weights,
                            Layout(tp_size=2), rank)


def test_progress_moves_during_a_single_rank_write(tmp_path: Path) -> None:
    save_sharded(tmp_path / "src", mixed(), 3)
    calls: list[tuple[int, int]] = []
    reshard(tmp_path / "src", tmp_path / "dst", Layout(tp_size=1),
            progress=lambda done, total: calls.append((done, total)))
    total = calls[-1][1]
    assert any(0 < done < total for done, _ in calls)


# --- the property --------------------------------------------------------------------------


def _with_tempdir(test: Callable[[Path], None]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        test(Path(directory))


@given(
    source_tp=st.integers(2, 4), source_pp=st.integers(1, 2),
    target_tp=st.integers(1, 4), target_pp=st.integers(1, 3),
    vocab=st.integers(1, 12), hidden=st.integers(1, 8), kv=st.integers(1, 4),
    inter=st.integers(1, 10), layers=st.integers(1, 3),
    dtype=st.sampled_from([torch.bfloat16, torch.float32]), tie=st.booleans(),
    write=st.sampled_from([False, False, False, True]),
)
def test_property_reshard_gives_the_slices_of_the_originals(
    source_tp: int, source_pp: int, target_tp: int, target_pp: int, vocab: int, hidden: int,
    kv: int, inter: int, layers: int, dtype: torch.dtype, tie: bool, write: bool,
) -> None:
    weights = llama(vocab=vocab, hidden=hidden, kv=kv, inter=inter, layers=layers, dtype=dtype,
                    tie=tie)
    target = Layout(tp_size=target_tp, pp_size=target_pp)

    def run(root: Path) -> None:
        save_sharded(root / "src", weights, source_tp, source_pp)
        aliases = source_aliases(root / "src")
        # An empty piece shares no storage that shows it is the same tensor: with fewer
        # vocabulary rows than ranks, the tie is stored as two tensors.
        assert bool(aliases) == (tie and source_pp == 1 and vocab >= source_tp)
        checkpoint = shardspec.open(root / "src")
        resharder = Resharder(checkpoint.manifest, target)
        for rank in range(target.size):
            got = load_resharded(checkpoint.path, checkpoint.manifest, rank, target, CPU,
                                 resharder=resharder)
            assert_rank_matches(got, weights, target, rank, aliases)
        if write:  # the same through the writer
            reshard(root / "src", root / "dst", target)
            assert shardspec.validate(root / "dst").ok
            for rank in range(target.size):
                assert_rank_matches(shardspec.load_rank(root / "dst", rank, "cpu"), weights,
                                    target, rank, aliases)

    _with_tempdir(run)


# --- CUDA ----------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_resharded_load_onto_cuda(tmp_path: Path) -> None:
    weights = mixed()
    save_sharded(tmp_path / "c", weights, 4)
    target = Layout(tp_size=2)
    got = shardspec.load_rank(tmp_path / "c", 1, "cuda:0", layout=target)
    assert {t.device for t in got.values()} == {torch.device("cuda", 0)}
    assert_rank_matches({n: t.cpu() for n, t in got.items()}, weights, target, 1)
