"""Pre-quantized packed layouts through convert: AWQ and GPTQ int4, MXFP4 stacked experts.

Each source is written here with safetensors; each rank's tensors are compared bit for bit with
slices the test computes with torch, along the dims the format's ties imply (SPEC 8.4)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

import shardspec
from shardspec.convert import convert, fp8, merge
from shardspec.convert.tp_plan import PlanError

GEN = torch.Generator().manual_seed(7)


def ints(*shape: int) -> torch.Tensor:
    return torch.randint(-2**31, 2**31 - 1, shape, generator=GEN, dtype=torch.int32)


def halves(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=GEN).to(torch.float16)


def write_hf(root: Path, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> None:
    root.mkdir(parents=True)
    save_file(tensors, root / "model.safetensors", metadata={"format": "pt"})
    (root / "config.json").write_text(json.dumps(config))


def assert_rank_slices(path: Path, expected: dict[int, dict[str, torch.Tensor]]) -> None:
    for rank, want in expected.items():
        got = shardspec.load_rank(path, rank)
        assert sorted(got) == sorted(want), rank
        for name, tensor in want.items():
            assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape and \
                torch.equal(got[name].reshape(-1).view(torch.uint8),
                            tensor.reshape(-1).view(torch.uint8)), (rank, name)


def int4_model(method: str, *, i: int = 64, o: int = 64, g: int = 16) -> dict[str, torch.Tensor]:
    """One Llama layer whose q_proj (column-parallel) and o_proj (row-parallel) are int4."""
    out: dict[str, torch.Tensor] = {"model.norm.weight": halves(o)}
    for module in ("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.o_proj"):
        if method == "awq":
            out[f"{module}.qweight"] = ints(i, o // 8)
        else:
            out[f"{module}.qweight"] = ints(i // 8, o)
            out[f"{module}.g_idx"] = torch.arange(i, dtype=torch.int32) // g
        out[f"{module}.qzeros"] = ints(i // g, o // 8)
        out[f"{module}.scales"] = halves(i // g, o)
    return out


def int4_config(method: str, **extra: Any) -> dict[str, Any]:
    return {"model_type": "llama", "torch_dtype": "float16", "num_attention_heads": 4,
            "quantization_config": {"quant_method": method, "bits": 4, "group_size": 16,
                                    **extra}}


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_int4_splits_whole_packs_and_groups_with_their_scales(tmp_path: Path, method: str
                                                              ) -> None:
    state = int4_model(method)
    write_hf(tmp_path / "hf", state, int4_config(method))
    manifest = convert(tmp_path / "hf", tmp_path / "ckpt", tp_size=2)
    assert shardspec.validate(tmp_path / "ckpt", checksums=True).ok
    qweight = manifest.tensors["model.layers.0.self_attn.q_proj.qweight"]
    assert qweight.logical == shardspec.Logical(dtype="F16", shape=(64, 64))
    assert manifest.tensors["model.layers.0.self_attn.q_proj.qzeros"].tied_to == shardspec.Tie(
        tensor="model.layers.0.self_attn.q_proj.qweight", block=(16, 8))
    # the grid is [in, out]: column-parallel q_proj cuts dim 1, row-parallel o_proj dim 0
    expected: dict[int, dict[str, torch.Tensor]] = {}
    for rank in range(2):
        want = {"model.norm.weight": state["model.norm.weight"]}
        for name, tensor in state.items():
            if ".q_proj." in name:
                want[name] = tensor if name.endswith("g_idx") else tensor.chunk(2, 1)[rank]
            elif ".o_proj." in name:
                want[name] = tensor.chunk(2, 0)[rank]
        expected[rank] = want
    assert_rank_slices(tmp_path / "ckpt", expected)
    merge(tmp_path / "ckpt", tmp_path / "merged")
    assert shardspec.validate(tmp_path / "ckpt").ok


def test_an_int4_split_through_a_pack_is_refused(tmp_path: Path) -> None:
    write_hf(tmp_path / "hf", int4_model("awq", o=48), int4_config("awq"))
    with pytest.raises(PlanError, match=r"q_proj\.qweight.*boundary at element 12.*of 8"):
        convert(tmp_path / "hf", tmp_path / "ckpt", tp_size=4)
    assert not (tmp_path / "ckpt").exists()


def test_gptq_act_order_is_not_split_along_its_input(tmp_path: Path) -> None:
    write_hf(tmp_path / "hf", int4_model("gptq"), int4_config("gptq", desc_act=True))
    with pytest.raises(PlanError, match=r"o_proj\.qweight.*desc_act"):
        convert(tmp_path / "hf", tmp_path / "ckpt", tp_size=2)


def test_mxfp4_stacked_experts_over_expert_and_tensor_ranks(tmp_path: Path) -> None:
    experts, hidden, inter = 4, 64, 64
    prefix = "model.layers.0.mlp.experts."
    state = {
        prefix + "gate_up_proj_blocks": torch.randint(0, 255, (experts, 2 * inter, hidden // 32,
                                                               16), generator=GEN,
                                                      dtype=torch.uint8),
        prefix + "gate_up_proj_scales": torch.randint(100, 140, (experts, 2 * inter,
                                                                 hidden // 32), generator=GEN,
                                                      dtype=torch.uint8),
        prefix + "down_proj_blocks": torch.randint(0, 255, (experts, hidden, inter // 32, 16),
                                                   generator=GEN, dtype=torch.uint8),
        prefix + "down_proj_scales": torch.randint(100, 140, (experts, hidden, inter // 32),
                                                   generator=GEN, dtype=torch.uint8),
        "model.layers.0.mlp.router.weight": halves(experts, hidden),
    }
    write_hf(tmp_path / "hf", state, {"model_type": "gpt_oss", "torch_dtype": "bfloat16",
                                      "quantization_config": {"quant_method": "mxfp4"}})
    plan = {"layers.*.mlp.experts.gate_up_proj_blocks": "colwise",
            "layers.*.mlp.experts.down_proj_blocks": "rowwise",
            "layers.*.mlp.router": "replicate"}
    manifest = convert(tmp_path / "hf", tmp_path / "ckpt", tp_size=2, ep_size=2, plan=plan)
    assert shardspec.validate(tmp_path / "ckpt", checksums=True).ok
    assert manifest.tensors[prefix + "down_proj_blocks"].logical == shardspec.Logical(
        dtype="BF16", shape=(experts, hidden, inter))
    assert manifest.tensors[prefix + "down_proj_scales"].tied_to == shardspec.Tie(
        tensor=prefix + "down_proj_blocks", block=(1, 1, 32))
    expected = {}
    for rank in range(4):
        ep_rank, tp_rank = divmod(rank, 2)
        mine = {n: t.chunk(2, 0)[ep_rank] for n, t in state.items() if ".experts." in n}
        expected[rank] = {
            "model.layers.0.mlp.router.weight": state["model.layers.0.mlp.router.weight"],
            prefix + "gate_up_proj_blocks": mine[prefix + "gate_up_proj_blocks"].chunk(2, 1)[
                tp_rank],
            prefix + "gate_up_proj_scales": mine[prefix + "gate_up_proj_scales"].chunk(2, 1)[
                tp_rank],
            prefix + "down_proj_blocks": mine[prefix + "down_proj_blocks"].chunk(2, 2)[tp_rank],
            prefix + "down_proj_scales": mine[prefix + "down_proj_scales"].chunk(2, 2)[tp_rank],
        }
    assert_rank_slices(tmp_path / "ckpt", expected)


def test_fp8_channel_and_tensor_scales_follow_column_and_row_splits(tmp_path: Path) -> None:
    """vLLM / compressed-tensors FP8: a per-channel ``weight_scale`` [o, 1] is split with a
    column-parallel weight and whole on every rank of a row-parallel one; per-tensor scales are
    whole everywhere."""
    o, i = 32, 64
    state: dict[str, torch.Tensor] = {}
    for module in ("model.layers.0.mlp.up_proj", "model.layers.0.mlp.down_proj"):
        state[f"{module}.weight"] = torch.randn(o, i, generator=GEN).to(torch.float8_e4m3fn)
        state[f"{module}.weight_scale"] = torch.rand(o, 1, generator=GEN)
        state[f"{module}.input_scale"] = torch.rand((), generator=GEN)
    write_hf(tmp_path / "hf", state, {"model_type": "llama", "torch_dtype": "bfloat16",
                                      "quantization_config": {"quant_method": "fp8"}})
    manifest = convert(tmp_path / "hf", tmp_path / "ckpt", tp_size=2)
    assert shardspec.validate(tmp_path / "ckpt").ok
    assert manifest.tensors["model.layers.0.mlp.down_proj.weight_scale"].tied_to == \
        shardspec.Tie(tensor="model.layers.0.mlp.down_proj.weight", block=(1,), axes=(0,))
    expected = {}
    for rank in range(2):
        want = {}
        for name, tensor in state.items():
            if name.endswith("input_scale") or (".down_proj." in name and "scale" in name):
                want[name] = tensor
            elif ".up_proj." in name:
                want[name] = tensor.chunk(2, 0)[rank]
            else:
                want[name] = tensor.chunk(2, 1)[rank]
        expected[rank] = want
    assert_rank_slices(tmp_path / "ckpt", expected)
    scale = manifest.tensors["model.layers.0.mlp.down_proj.weight_scale"]
    assert sorted(p.replica for p in scale.pieces) == [0, 1]


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 3), cols=st.integers(1, 3), tail_r=st.integers(0, 127),
       tail_c=st.integers(0, 127), parts=st.integers(1, 3), dim=st.integers(0, 1),
       seed=st.integers(0, 2**16))
def test_fp8_blocks_of_a_piece_are_the_blocks_of_the_whole(
        rows: int, cols: int, tail_r: int, tail_c: int, parts: int, dim: int, seed: int) -> None:
    """Quantizing a block-aligned piece gives the same FP8 bytes and scales as slicing the
    whole tensor's: what lets convert --quantize stream piece by piece."""
    shape = (rows * 128 + tail_r, cols * 128 + tail_c)
    weight = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(
        torch.bfloat16)
    data, scales = fp8.quantize_block(weight.view(torch.uint8).numpy().tobytes(), "BF16", shape)
    whole = torch.frombuffer(bytearray(data), dtype=torch.uint8).reshape(shape)
    whole_scale = torch.frombuffer(bytearray(scales), dtype=torch.float32).reshape(
        -(-shape[0] // 128), -(-shape[1] // 128))
    # dequantizing gives the weight back to FP8's precision, every block scaled to its max
    # (E4M3: 3 mantissa bits, so half an ulp is 1/16 relative; subnormals below 2^-6 step 2^-9)
    scale = whole_scale.repeat_interleave(128, 0)[:shape[0]].repeat_interleave(128, 1)[
        :, :shape[1]]
    back = whole.view(torch.float8_e4m3fn).float() * scale
    error = (back - weight.float()).abs()
    assert bool((error <= weight.float().abs() / 16 + scale * 2**-10 + 1e-12).all())
    blocks = -(-shape[dim] // 128)
    edges = [min(shape[dim], round(blocks * k / parts) * 128) for k in range(parts + 1)]
    for start, stop in zip(edges, edges[1:], strict=False):
        if start == stop:
            continue
        piece = weight.narrow(dim, start, stop - start).contiguous()
        got, got_scale = fp8.quantize_block(piece.view(torch.uint8).numpy().tobytes(), "BF16",
                                            tuple(piece.shape))
        assert got == whole.narrow(dim, start, stop - start).contiguous().numpy().tobytes()
        lo, hi = start // 128, -(-stop // 128)
        assert got_scale == whole_scale.narrow(dim, lo, hi - lo).contiguous().numpy().tobytes()


def fp8_source(root: Path, scale_name: str, scale: torch.Tensor, shape: tuple[int, int],
               quant: dict[str, Any]) -> None:
    module = "model.layers.0.mlp.up_proj"
    write_hf(root, {f"{module}.weight": torch.zeros(*shape).to(torch.float8_e4m3fn),
                    f"{module}.{scale_name}": scale},
             {"model_type": "llama", "quantization_config": {"quant_method": "fp8", **quant}})


def test_a_block_size_the_shapes_do_not_fix_is_taken_from_the_config_or_refused(
        tmp_path: Path) -> None:
    # [200, 128] with 2 x 1 scales: blocks of 100..199 rows all give 2; never guessed
    fp8_source(tmp_path / "a", "weight_scale_inv", torch.ones(2, 1), (200, 128), {})
    with pytest.raises(PlanError, match="weight_block_size"):
        convert(tmp_path / "a", tmp_path / "a-out", tp_size=2)
    # the config's block applies whatever the scale's name (compressed-tensors' weight_scale)
    fp8_source(tmp_path / "b", "weight_scale", torch.ones(2, 1), (200, 128),
               {"weight_block_size": [128, 128]})
    with pytest.raises(PlanError, match="inside a block or pack of 128"):
        convert(tmp_path / "b", tmp_path / "b-out", tp_size=2)
    manifest = convert(tmp_path / "b", tmp_path / "b-out", tp_size=1)
    assert manifest.tensors["model.layers.0.mlp.up_proj.weight_scale"].tied_to == shardspec.Tie(
        tensor="model.layers.0.mlp.up_proj.weight", block=(128, 128))


def test_an_activation_scale_of_many_values_is_refused(tmp_path: Path) -> None:
    module = "model.layers.0.mlp.up_proj"
    write_hf(tmp_path / "hf", {f"{module}.weight": torch.zeros(8, 8).to(torch.float8_e4m3fn),
                               f"{module}.weight_scale": torch.ones(()),
                               f"{module}.input_scale": torch.ones(8)},
             {"model_type": "llama", "quantization_config": {"quant_method": "fp8"}})
    with pytest.raises(PlanError, match="input_scale.*activation scale"):
        convert(tmp_path / "hf", tmp_path / "out", tp_size=2)


def test_gptq_act_order_keeps_its_scales_untied_and_is_not_split(tmp_path: Path) -> None:
    write_hf(tmp_path / "hf", int4_model("gptq"), int4_config("gptq", desc_act=True))
    manifest = convert(tmp_path / "hf", tmp_path / "tp1", tp_size=1)
    tensors = manifest.tensors
    assert tensors["model.layers.0.self_attn.o_proj.scales"].tied_to is None
    assert tensors["model.layers.0.self_attn.o_proj.g_idx"].tied_to is not None
    with pytest.raises(PlanError, match="desc_act"):
        convert(tmp_path / "hf", tmp_path / "tp2", tp_size=2)


def test_int4_packings_convert_does_not_know_are_refused(tmp_path: Path) -> None:
    write_hf(tmp_path / "hf", int4_model("awq"), {**int4_config("awq"), "quantization_config": {
        "quant_method": "awq", "bits": 3, "group_size": 16}})
    with pytest.raises(PlanError, match="3-bit"):
        convert(tmp_path / "hf", tmp_path / "out", tp_size=1)


def test_uneven_splits_of_a_block_quantized_weight_deal_whole_blocks(tmp_path: Path) -> None:
    module = "model.layers.0.mlp.up_proj"
    weight = torch.randn(384, 64, generator=GEN).to(torch.float8_e4m3fn)
    scale = torch.rand(3, 1, generator=GEN)
    write_hf(tmp_path / "hf", {f"{module}.weight": weight, f"{module}.weight_scale_inv": scale},
             {"model_type": "llama", "quantization_config": {
                 "quant_method": "fp8", "weight_block_size": [128, 128]}})
    with pytest.raises(PlanError, match="boundary at element 192, inside a block"):
        convert(tmp_path / "hf", tmp_path / "even", tp_size=2)
    convert(tmp_path / "hf", tmp_path / "ckpt", tp_size=2, allow_uneven=True)
    assert shardspec.validate(tmp_path / "ckpt").ok
    assert_rank_slices(tmp_path / "ckpt", {
        0: {f"{module}.weight": weight[:256], f"{module}.weight_scale_inv": scale[:2]},
        1: {f"{module}.weight": weight[256:], f"{module}.weight_scale_inv": scale[2:]}})
