"""convert cuts attention on head boundaries, as vLLM does (format.heads, convert.heads)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import shardspec
from checkpoints import raw_bytes
from hf_helpers import llama_tensors, load_hf_dir, write_hf_dir
from shardspec.convert import convert, merge
from shardspec.convert.tp_plan import PlanError, PlanWarning
from shardspec.format.heads import HeadsError, heads_of_rank, kv_head_replicas
from shardspec.format.manifest import Layout, TensorRecord
from shardspec.reshard import reshard

# --- the rule, against cases worked out by hand from vLLM's QKVParallelLinear ---------------


@pytest.mark.parametrize(("tp", "heads", "kv", "want"), [
    # (query heads, kv heads, kv replica) per rank
    (1, 4, 2, [((0, 4), (0, 2), 0)]),
    (2, 4, 2, [((0, 2), (0, 1), 0), ((2, 4), (1, 2), 0)]),
    (4, 4, 2, [((0, 1), (0, 1), 0), ((1, 2), (0, 1), 1), ((2, 3), (1, 2), 0),
               ((3, 4), (1, 2), 1)]),
    (4, 8, 1, [((0, 2), (0, 1), 0), ((2, 4), (0, 1), 1), ((4, 6), (0, 1), 2),
               ((6, 8), (0, 1), 3)]),
    (2, 32, 8, [((0, 16), (0, 4), 0), ((16, 32), (4, 8), 0)]),
])
def test_heads_of_rank_is_vllms_rule(tp: int, heads: int, kv: int,
                                     want: list[tuple[tuple[int, int], tuple[int, int], int]]
                                     ) -> None:
    got = [heads_of_rank(r, tp, heads, kv) for r in range(tp)]
    assert [((h.query.start, h.query.stop), (h.kv.start, h.kv.stop), h.kv_replica)
            for h in got] == want
    assert {h.kv_replicas for h in got} == {max(1, tp // kv)}


@pytest.mark.parametrize(("tp", "heads", "kv", "match"), [
    (8, 4, 2, "4 query heads cannot be dealt evenly to 8"),
    (3, 6, 4, "4 key/value heads cannot be dealt evenly to 3"),
    (4, 12, 3, "3 key/value heads cannot be replicated evenly over 4"),
    (4, 8, 6, "6 key/value heads cannot be dealt evenly to 4"),
])
def test_heads_of_rank_refuses_what_vllm_refuses(tp: int, heads: int, kv: int, match: str
                                                 ) -> None:
    with pytest.raises(HeadsError, match=match):
        [heads_of_rank(r, tp, heads, kv) for r in range(tp)]


def test_kv_head_replicas() -> None:
    assert kv_head_replicas(8, 2) == 4 and kv_head_replicas(2, 8) == 1
    assert kv_head_replicas(4, 4) == 1


# --- convert ----------------------------------------------------------------------------------


def _gqa(tmp_path: Path, **config: object) -> tuple[Path, dict[str, torch.Tensor]]:
    """The issue's model: 4 query heads, 2 KV heads, head_dim 16 (hidden 64), with biases."""
    tensors = llama_tensors(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=64,
                            bias=True, dtype=torch.bfloat16)
    return write_hf_dir(tmp_path / "hf", tensors, heads=4, kv_heads=2, config=config), tensors


def test_tp4_replicates_whole_kv_heads_and_says_so(tmp_path: Path) -> None:
    src, tensors = _gqa(tmp_path)
    with pytest.warns(PlanWarning, match=r"2 key/value heads and tp_size \(--tp\) is 4.*held "
                      r"by 2 consecutive.*replicas \(SPEC 7.4\)"):
        manifest = convert(src, tmp_path / "ckpt", tp_size=4)
    k = manifest.tensors["model.layers.0.self_attn.k_proj.weight"]
    assert isinstance(k, TensorRecord)
    assert [(p.rank, p.offset, p.shape, p.replica) for p in k.pieces] == [
        (0, (0, 0), (16, 64), 0), (1, (0, 0), (16, 64), 1),
        (2, (16, 0), (16, 64), 0), (3, (16, 0), (16, 64), 1)]
    assert shardspec.validate(tmp_path / "ckpt", checksums=True).ok
    for rank in range(4):
        got = shardspec.load_rank(tmp_path / "ckpt", rank, device="cpu")
        for module in ("k_proj", "v_proj"):
            for leaf in ("weight", "bias"):
                name = f"model.layers.1.self_attn.{module}.{leaf}"
                head = rank // 2  # two ranks per KV head
                assert raw_bytes(got[name]) == raw_bytes(tensors[name][head * 16:(head + 1) * 16])
        q = got["model.layers.1.self_attn.q_proj.weight"]
        assert raw_bytes(q) == raw_bytes(tensors["model.layers.1.self_attn.q_proj.weight"]
                                         [rank * 16:(rank + 1) * 16])
        o = got["model.layers.1.self_attn.o_proj.weight"]
        assert raw_bytes(o) == raw_bytes(tensors["model.layers.1.self_attn.o_proj.weight"]
                                         [:, rank * 16:(rank + 1) * 16].contiguous())
    merge(tmp_path / "ckpt", tmp_path / "merged")
    merged = load_hf_dir(tmp_path / "merged")
    assert all(raw_bytes(merged[n]) == raw_bytes(t) for n, t in tensors.items())


@pytest.mark.parametrize("tp", [1, 2])
def test_tp_up_to_the_kv_heads_splits_without_a_notice(tmp_path: Path, tp: int) -> None:
    src, _ = _gqa(tmp_path)
    manifest = convert(src, tmp_path / "ckpt", tp_size=tp)  # a warning would fail the test
    k = manifest.tensors["model.layers.0.self_attn.k_proj.weight"]
    assert isinstance(k, TensorRecord)
    assert [p.shape for p in k.pieces] == [(32 // tp, 64)] * tp
    assert {p.replica for p in k.pieces} == {0}


@pytest.mark.parametrize(("tp", "match"), [
    (8, r"'model\.layers\.0\.self_attn\.(q|o)_proj\.(weight|bias)': 4 query heads cannot be "
        r"dealt evenly to 8.*num_attention_heads 4, num_key_value_heads 2"),
    (3, r"(q|o)_proj.*4 query heads cannot be dealt evenly to 3"),
])
def test_tp_the_query_heads_refuse_is_refused_before_writing(tmp_path: Path, tp: int,
                                                             match: str) -> None:
    src, _ = _gqa(tmp_path)
    with pytest.raises(PlanError, match=match):
        convert(src, tmp_path / "ckpt", tp_size=tp, allow_uneven=True)
    assert not (tmp_path / "ckpt").exists()


def test_head_counts_are_needed_to_split_attention(tmp_path: Path) -> None:
    src = write_hf_dir(tmp_path / "hf", llama_tensors(layers=1), heads=None)
    with pytest.raises(PlanError, match="config.json gives no num_attention_heads"):
        convert(src, tmp_path / "ckpt", tp_size=2)
    convert(src, tmp_path / "tp1", tp_size=1)  # nothing is split: nothing to know


def test_text_config_head_counts_are_used(tmp_path: Path) -> None:
    tensors = llama_tensors(layers=1, hidden=64, heads=4, kv_heads=2)
    src = write_hf_dir(tmp_path / "hf", tensors, heads=None,
                       config={"text_config": {"num_attention_heads": 4,
                                               "num_key_value_heads": 2}})
    with pytest.raises(PlanError, match="4 query heads cannot be dealt evenly to 8"):
        convert(src, tmp_path / "ckpt", tp_size=8)


def test_fused_qkv_is_not_split(tmp_path: Path) -> None:
    tensors = llama_tensors(layers=1, hidden=64)
    prefix = "model.layers.0.self_attn."
    tensors[prefix + "qkv_proj.weight"] = torch.cat(
        [tensors.pop(prefix + m + ".weight") for m in ("q_proj", "k_proj", "v_proj")])
    src = write_hf_dir(tmp_path / "hf", tensors, model_type="custom", config={
        "base_model_tp_plan": {"layers.*.self_attn.qkv_proj": "colwise",
                               "layers.*.self_attn.o_proj": "rowwise",
                               "layers.*.mlp.*": "replicate"}})
    with pytest.raises(PlanError, match=r"qkv_proj\.weight': it fuses query, key and value"):
        convert(src, tmp_path / "ckpt", tp_size=2)


def test_mla_kv_b_proj_splits_by_query_heads(tmp_path: Path) -> None:
    heads, per_head = 4, 24  # qk_nope 16 + v 8 per head
    tensors = {
        "model.embed_tokens.weight": torch.randn(32, 64),
        "model.layers.0.self_attn.kv_b_proj.weight": torch.randn(heads * per_head, 16),
        "model.layers.0.self_attn.o_proj.weight": torch.randn(64, heads * 8),
        "model.norm.weight": torch.randn(64),
        "lm_head.weight": torch.randn(32, 64),
    }
    src = write_hf_dir(tmp_path / "hf", tensors, model_type="deepseek_v3", heads=heads,
                       kv_heads=heads)
    manifest = convert(src, tmp_path / "ckpt", tp_size=2)
    kv_b = manifest.tensors["model.layers.0.self_attn.kv_b_proj.weight"]
    assert isinstance(kv_b, TensorRecord)
    assert [p.shape for p in kv_b.pieces] == [(48, 16), (48, 16)]
    with pytest.raises(PlanError, match=r"kv_b_proj.*4 query heads cannot be dealt evenly to 8"
                       r"|o_proj.*4 query heads cannot be dealt evenly to 8"):
        convert(src, tmp_path / "tp8", tp_size=8)


# --- resharding keeps heads whole -----------------------------------------------------------


# (a TP=1 source has no split to infer: resharding it replicates, see the reshard guide)
@pytest.mark.parametrize(("source_tp", "target_tp"), [(2, 4), (4, 2), (4, 1), (2, 1)])
def test_reshard_cuts_heads_as_convert_does(tmp_path: Path, source_tp: int, target_tp: int
                                            ) -> None:
    src, tensors = _gqa(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        convert(src, tmp_path / "source", tp_size=source_tp)
        direct = convert(src, tmp_path / "direct", tp_size=target_tp)
    resharded = reshard(tmp_path / "source", tmp_path / "out", Layout(tp_size=target_tp))
    assert shardspec.validate(tmp_path / "out", checksums=True).ok
    for name in ("model.layers.0.self_attn.k_proj.weight",
                 "model.layers.1.self_attn.v_proj.bias",
                 "model.layers.0.self_attn.q_proj.weight",
                 "model.layers.1.self_attn.o_proj.weight"):
        got, want = resharded.tensors[name], direct.tensors[name]
        assert isinstance(got, TensorRecord) and isinstance(want, TensorRecord)
        assert [(p.rank, p.offset, p.shape, p.replica) for p in got.pieces] == \
            [(p.rank, p.offset, p.shape, p.replica) for p in want.pieces], name
    for rank in range(target_tp):
        got = shardspec.load_rank(tmp_path / "out", rank, device="cpu")
        on_load = shardspec.load_rank(tmp_path / "source", rank, device="cpu",
                                      layout=Layout(tp_size=target_tp))
        want = shardspec.load_rank(tmp_path / "direct", rank, device="cpu")
        for name, tensor in want.items():
            assert raw_bytes(got[name]) == raw_bytes(tensor), (rank, name)
            assert raw_bytes(on_load[name]) == raw_bytes(tensor), (rank, name)


def test_reshard_refuses_a_tp_size_the_query_heads_refuse(tmp_path: Path) -> None:
    src, _ = _gqa(tmp_path)
    convert(src, tmp_path / "source", tp_size=2)
    with pytest.raises(shardspec.RequestError, match=r"4 query heads cannot be dealt evenly to "
                       r"8.*num_attention_heads 4, num_key_value_heads 2") as info:
        reshard(tmp_path / "source", tmp_path / "out", Layout(tp_size=8))
    assert info.value.code == "reshard-unsupported"
    assert not (tmp_path / "out" / "shardspec.json").exists()


# --- experts and stages -------------------------------------------------------------------------


def test_ep_without_experts_is_refused(tmp_path: Path) -> None:
    src, _ = _gqa(tmp_path)
    with pytest.raises(PlanError, match=r"ep_size \(--ep\) is 2, but the checkpoint has no "
                       "routed experts"):
        convert(src, tmp_path / "ckpt", tp_size=1, ep_size=2)
    assert not (tmp_path / "ckpt").exists()


def test_a_stage_without_layers_is_announced(tmp_path: Path) -> None:
    src, _ = _gqa(tmp_path)
    with pytest.warns(PlanWarning, match=r"pipeline stage 2 of pp_size \(--pp\) 3 holds no "
                      r"transformer layer \(the model has 2 layers\)"):
        convert(src, tmp_path / "ckpt", tp_size=1, pp_size=3)
    convert(src, tmp_path / "pp2", tp_size=1, pp_size=2)  # no warning: it would fail the test
