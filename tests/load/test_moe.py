"""Mixture-of-experts and pre-quantized checkpoints end to end, on tiny models built with
transformers' own config classes (random weights, save_pretrained, no hub access):
convert at TP x EP (x PP) -> validate -> every rank bit-exact against slices computed here ->
merge back to the original bytes -> the same logits."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import shardspec
from shardspec import Layout, RequestError
from shardspec.convert import convert, merge
from shardspec.convert.tp_plan import PlanError
from shardspec.reshard import reshard

transformers = pytest.importorskip("transformers")

BLOCK = 128


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


# --- the tests' own model of the layout (not shardspec's code) --------------------------------

#: module suffix -> tensor-parallel split dim of its weight (None: replicated), as vLLM shards
#: these models
SPLIT = [
    (r"embed_tokens\.weight$", 0), (r"lm_head\.weight$", 0),
    (r"(q_proj|k_proj|v_proj|q_b_proj|kv_b_proj)\.(weight|bias)$", 0), (r"o_proj\.weight$", 1),
    (r"(gate_proj|up_proj|w1|w3)\.weight$", 0), (r"(down_proj|w2)\.weight$", 1),
    (r"block_sparse_moe\.gate\.", None), (r"shared_expert_gate\.", None),
    (r"(q_a_proj|kv_a_proj_with_mqa)\.weight$", None), (r"mlp\.gate\.", None),
    (r"norm\.weight$", None), (r"layernorm\.weight$", None),
]


def split_dim(name: str) -> int | None:
    """The split dim of a tensor; a block scale is split like its weight."""
    for pattern, dim in SPLIT:
        if re.search(pattern, name.removesuffix("_scale_inv")):
            return dim
    raise KeyError(name)


def stage_of(name: str, layers: int, pp: int) -> int:
    match = re.search(r"layers\.(\d+)\.", name)
    if match:
        return int(match[1]) * pp // layers
    return 0 if "embed_tokens" in name else pp - 1


def expected_rank(state: dict[str, torch.Tensor], rank: int, *, tp: int, pp: int, ep: int,
                  layers: int, experts: int) -> dict[str, torch.Tensor]:
    """What rank ``rank`` of pp-ep-tp holds, sliced from the full tensors with torch."""
    tp_rank, ep_rank, pp_rank = rank % tp, (rank // tp) % ep, rank // (tp * ep)
    out = {}
    for name, tensor in state.items():
        if stage_of(name, layers, pp) != pp_rank:
            continue
        expert = re.search(r"\.experts\.(\d+)\.", name)
        if expert and int(expert[1]) // (experts // ep) != ep_rank:
            continue
        dim = split_dim(name)
        if dim is None or (tensor.dim() == 1 and dim == 1):
            out[name] = tensor
            continue
        out[name] = tensor.chunk(tp, dim=dim)[tp_rank]
    return out


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def assert_ranks(path: Path, state: dict[str, torch.Tensor], **layout: int) -> None:
    manifest = shardspec.open(path).manifest
    assert (manifest.layout.tp_size, manifest.layout.pp_size, manifest.layout.ep_size) == (
        layout["tp"], layout["pp"], layout["ep"])
    for rank in range(manifest.layout.size):
        got = shardspec.load_rank(path, rank)
        want = expected_rank(state, rank, **layout)
        assert sorted(got) == sorted(want), rank
        for name, tensor in want.items():
            assert same_bytes(got[name], tensor), (rank, name)


def original(path: Path) -> dict[str, torch.Tensor]:
    return load_file(path / "model.safetensors")


def assert_merged_bytes(merged: Path, state: dict[str, torch.Tensor]) -> None:
    back: dict[str, torch.Tensor] = {}
    for file in sorted(merged.glob("*.safetensors")):
        back.update(load_file(file))
    assert sorted(back) == sorted(state)
    for name, tensor in state.items():
        assert same_bytes(back[name], tensor), name


# --- models --------------------------------------------------------------------------------


def qwen3_moe(root: Path) -> tuple[Any, dict[str, Any]]:
    config = transformers.Qwen3MoeConfig(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128,
        num_experts=4, num_experts_per_tok=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(config).eval()
    model.save_pretrained(root, safe_serialization=True)
    return model, {"layers": 2, "experts": 4}


def _quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The tests' own 128 x 128 block FP8 quantizer (DeepSeek-V3's weight_scale_inv)."""
    rows, cols = weight.shape
    scale = torch.empty(-(-rows // BLOCK), -(-cols // BLOCK))
    out = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            tile = weight[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK].float()
            s = tile.abs().max() / 448 if tile.abs().max() > 0 else torch.tensor(1.0)
            scale[i, j] = s
            out[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = (tile / s).to(
                torch.float8_e4m3fn)
    return out, scale


def _quantize_projections(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with each 2-D projection weight block-quantized, its scales beside it."""
    out = {}
    for name, tensor in state.items():
        if name.endswith("_proj.weight") and tensor.dim() == 2:
            out[name], out[name + "_scale_inv"] = _quantize(tensor)
        else:
            out[name] = tensor
    return out


def deepseek_v3(root: Path, *, fp8: bool) -> dict[str, Any]:
    """A DeepSeek-V3-shaped model (MLA, a dense first layer, routed and shared experts); with
    ``fp8`` its projections stored as DeepSeek ships them: F8_E4M3 with 128 x 128 block scales."""
    config = transformers.DeepseekV3Config(
        hidden_size=256, intermediate_size=512, moe_intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=8, vocab_size=256, n_routed_experts=4,
        n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1, q_lora_rank=128,
        kv_lora_rank=128, qk_rope_head_dim=32, qk_nope_head_dim=32, v_head_dim=32, n_group=2,
        topk_group=1, max_position_embeddings=64, torch_dtype="bfloat16")
    torch.manual_seed(1)
    model = transformers.DeepseekV3ForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(root, safe_serialization=True)
    if fp8:
        save_file(_quantize_projections(original(root)), root / "model.safetensors",
                  metadata={"format": "pt"})
        data = json.loads((root / "config.json").read_text())
        data["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                       "activation_scheme": "dynamic",
                                       "weight_block_size": [BLOCK, BLOCK]}
        (root / "config.json").write_text(json.dumps(data))
    return {"layers": 2, "experts": 4}


# --- tests ---------------------------------------------------------------------------------


def test_qwen3_moe_tp2_ep2_pp2_ranks_merge_and_logits(tmp_path: Path) -> None:
    model, shape = qwen3_moe(tmp_path / "hf")
    state = original(tmp_path / "hf")
    manifest = convert(tmp_path / "hf", tmp_path / "ckpt", tp_size=2, ep_size=2, pp_size=2)
    assert manifest.layout.world_size == 8
    assert shardspec.validate(tmp_path / "ckpt", checksums=True).ok
    assert_ranks(tmp_path / "ckpt", state, tp=2, pp=2, ep=2, **shape)
    # an expert's tensors live on the two tp ranks of one expert rank only
    pieces = manifest.tensors["model.layers.1.mlp.experts.3.down_proj.weight"].pieces
    assert {p.rank for p in pieces} == {6, 7}

    # reshard to one stage, four expert ranks, no tensor parallelism; then back to the bytes
    reshard(tmp_path / "ckpt", tmp_path / "ep4", Layout(tp_size=1, ep_size=4))
    assert shardspec.validate(tmp_path / "ep4", checksums=True).ok
    assert_ranks(tmp_path / "ep4", state, tp=1, pp=1, ep=4, **shape)
    merge(tmp_path / "ep4", tmp_path / "merged-ep4")
    assert_merged_bytes(tmp_path / "merged-ep4", state)

    merge(tmp_path / "ckpt", tmp_path / "merged")
    assert_merged_bytes(tmp_path / "merged", state)
    merged = transformers.Qwen3MoeForCausalLM.from_pretrained(tmp_path / "merged").eval()
    ids = torch.tensor([[1, 5, 9, 17, 33, 65, 127, 0]])
    with torch.no_grad():
        assert torch.equal(merged(ids).logits, model(ids).logits)


def test_deepseek_v3_fp8_tp2_ep2_ranks_scales_and_merge(tmp_path: Path) -> None:
    shape = deepseek_v3(tmp_path / "hf", fp8=True)
    state = original(tmp_path / "hf")
    manifest = convert(tmp_path / "hf", tmp_path / "ckpt", tp_size=2, ep_size=2)
    assert manifest.quantization.method == "fp8"
    assert shardspec.validate(tmp_path / "ckpt", checksums=True).ok
    weight = "model.layers.1.mlp.experts.2.gate_proj.weight"
    record = manifest.tensors[weight + "_scale_inv"]
    assert record.tied_to == shardspec.Tie(tensor=weight, block=(BLOCK, BLOCK))
    assert manifest.tensors[weight].logical == shardspec.Logical(dtype="BF16", shape=(256, 256))
    # MLA: the low-rank down projections are replicated, the head projections split
    assert {p.shape for p in manifest.tensors[
        "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"].pieces} == {(160, 256)}
    assert {p.shape for p in manifest.tensors[
        "model.layers.0.self_attn.kv_b_proj.weight"].pieces} == {(256, 128)}
    assert_ranks(tmp_path / "ckpt", state, tp=2, pp=1, ep=2, **shape)
    merge(tmp_path / "ckpt", tmp_path / "merged")
    assert_merged_bytes(tmp_path / "merged", state)

    # another TP and EP: every scale still follows its weight's blocks
    reshard(tmp_path / "ckpt", tmp_path / "tp1-ep4", Layout(tp_size=1, ep_size=4))
    assert shardspec.validate(tmp_path / "tp1-ep4", checksums=True).ok
    assert_ranks(tmp_path / "tp1-ep4", state, tp=1, pp=1, ep=4, **shape)
    assert shardspec.open(tmp_path / "tp1-ep4").manifest.tensors[
        weight + "_scale_inv"].tied_to == record.tied_to
    merge(tmp_path / "tp1-ep4", tmp_path / "merged-tp1-ep4")
    assert_merged_bytes(tmp_path / "merged-tp1-ep4", state)
    # TP=4 would cut o_proj's 256 input features at 64, inside a 128-wide scale block
    with pytest.raises(RequestError, match="inside a block of 128") as info:
        shardspec.load_rank(tmp_path / "ckpt", 0, layout=Layout(tp_size=4, ep_size=2))
    assert info.value.code == "reshard-unsupported"
    assert info.value.finding.tensor.endswith("_scale_inv")


def test_a_split_through_a_scale_block_is_refused_before_writing(tmp_path: Path) -> None:
    deepseek_v3(tmp_path / "hf", fp8=True)
    with pytest.raises(PlanError, match=r"inside a block .*of 128"):
        convert(tmp_path / "hf", tmp_path / "ckpt", tp_size=4)
    assert not (tmp_path / "ckpt").exists()


def test_quantize_fp8_on_convert_matches_block_quantization(tmp_path: Path) -> None:
    shape = deepseek_v3(tmp_path / "hf", fp8=False)
    state = original(tmp_path / "hf")
    manifest = convert(tmp_path / "hf", tmp_path / "ckpt", tp_size=2, ep_size=2,
                       quantize="fp8")
    assert manifest.quantization.config["weight_block_size"] == [BLOCK, BLOCK]
    assert shardspec.validate(tmp_path / "ckpt", checksums=True).ok
    quantized = _quantize_projections(state)
    assert_ranks(tmp_path / "ckpt", quantized, tp=2, pp=1, ep=2, **shape)
    merge(tmp_path / "ckpt", tmp_path / "merged")
    assert_merged_bytes(tmp_path / "merged", quantized)
    config = json.loads((tmp_path / "merged" / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "fp8"


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_mixtral_and_qwen2_moe_tp2_ep2(tmp_path: Path, kind: str) -> None:
    if kind == "mixtral":
        config = transformers.MixtralConfig(
            hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, num_local_experts=4,
            max_position_embeddings=64)
        model_class = transformers.MixtralForCausalLM
    else:  # a shared expert with its sigmoid gate, and q/k/v biases
        config = transformers.Qwen2MoeConfig(
            hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
            shared_expert_intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, num_experts=4, num_experts_per_tok=2,
            max_position_embeddings=64)
        model_class = transformers.Qwen2MoeForCausalLM
    torch.manual_seed(2)
    model = model_class(config).eval()
    model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    state = original(tmp_path / "hf")
    convert(tmp_path / "hf", tmp_path / "ckpt", tp_size=2, ep_size=2)
    assert shardspec.validate(tmp_path / "ckpt", checksums=True).ok
    assert_ranks(tmp_path / "ckpt", state, tp=2, pp=1, ep=2, layers=2, experts=4)
    merge(tmp_path / "ckpt", tmp_path / "merged")
    assert_merged_bytes(tmp_path / "merged", state)


def test_stacked_experts_over_expert_ranks_and_back(tmp_path: Path) -> None:
    """Experts stored stacked (transformers' ``mlp.experts.gate_up_proj``, a leading expert
    dim): cut along dim 0 by expert rank, along their own dims by tensor rank."""
    gen = torch.Generator().manual_seed(3)
    experts, hidden, inter = 4, 32, 16
    state = {
        "model.layers.0.mlp.experts.gate_up_proj": torch.randn(experts, 2 * inter, hidden,
                                                               generator=gen),
        "model.layers.0.mlp.experts.down_proj": torch.randn(experts, hidden, inter,
                                                            generator=gen),
        "model.layers.0.mlp.gate.weight": torch.randn(experts, hidden, generator=gen),
    }
    (tmp_path / "hf").mkdir()
    save_file(state, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"model_type": "custom_moe"}))
    plan = {"layers.*.mlp.experts.gate_up_proj": "replicate",  # fused gate/up: kept whole
            "layers.*.mlp.experts.down_proj": "rowwise", "layers.*.mlp.gate": "replicate"}
    convert(tmp_path / "hf", tmp_path / "ckpt", tp_size=2, ep_size=2, plan=plan)
    assert shardspec.validate(tmp_path / "ckpt", checksums=True).ok
    for rank in range(4):
        ep_rank, tp_rank = divmod(rank, 2)
        got = shardspec.load_rank(tmp_path / "ckpt", rank)
        mine = {n: t.chunk(2, 0)[ep_rank] for n, t in state.items() if ".experts." in n}
        assert torch.equal(got["model.layers.0.mlp.experts.gate_up_proj"],
                           mine["model.layers.0.mlp.experts.gate_up_proj"])
        assert torch.equal(got["model.layers.0.mlp.experts.down_proj"],
                           mine["model.layers.0.mlp.experts.down_proj"].chunk(2, 2)[tp_rank])
        assert torch.equal(got["model.layers.0.mlp.gate.weight"],
                           state["model.layers.0.mlp.gate.weight"])
    reshard(tmp_path / "ckpt", tmp_path / "ep4", Layout(tp_size=1, ep_size=4))
    got = shardspec.load_rank(tmp_path / "ep4", 3)
    assert torch.equal(got["model.layers.0.mlp.experts.down_proj"],
                       state["model.layers.0.mlp.experts.down_proj"][3:4])
    merge(tmp_path / "ep4", tmp_path / "merged")
    assert_merged_bytes(tmp_path / "merged", state)


def test_experts_that_expert_ranks_cannot_divide_are_refused(tmp_path: Path) -> None:
    qwen3_moe(tmp_path / "hf")
    with pytest.raises(PlanError, match="4 experts, which 3 expert ranks"):
        convert(tmp_path / "hf", tmp_path / "ckpt", tp_size=1, ep_size=3)
    assert not (tmp_path / "ckpt").exists()
