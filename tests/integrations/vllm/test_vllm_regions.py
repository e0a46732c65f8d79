"""The vLLM plugin's pure parts, without an engine: boxes read by name, the box each worker
needs, the layout decisions and the options. (The engine itself:
tests/integrations/vllm/test_vllm_engine.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import shardspec
from shardspec import Layout, Shard
from shardspec.format.errors import QuantizationError, RequestError
from shardspec.format.manifest import Quantization
from shardspec.integrations.vllm.layouts import (
    EngineRank,
    check_quantization,
    own_rank,
    refuse_rank_local,
)
from shardspec.integrations.vllm.options import LoaderOptions, OptionsError
from shardspec.integrations.vllm.regions import Heads, plan_for, vllm_box
from shardspec.reshard.load import execute_reshard
from shardspec.reshard.regions import plan_boxes

LLAMA = {"model_type": "llama", "num_attention_heads": 8, "num_key_value_heads": 2,
         "head_dim": 32, "hidden_size": 256}


def _write(path: Path, tensor: torch.Tensor, tp: int, dim: int) -> shardspec.Checkpoint:
    states: dict[int, dict[str, torch.Tensor]] = {r: {} for r in range(tp)}
    sharding: dict[int, dict[str, Shard]] = {r: {} for r in range(tp)}
    for rank, (piece, shard) in enumerate(shardspec.split(tensor, dim, tp)):
        states[rank]["w"] = piece
        sharding[rank]["w"] = shard
    shardspec.save(states, path, layout=Layout(tp_size=tp), sharding=sharding)
    return shardspec.open(path)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), tp=st.sampled_from([1, 2, 3, 4]), dim=st.sampled_from([0, 1]))
def test_any_box_reads_the_same_elements_as_slicing_the_whole_tensor(
        tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, tp: int, dim: int) -> None:
    tensor = torch.arange(12 * 10, dtype=torch.int32).reshape(12, 10)
    ckpt = _write(tmp_path_factory.mktemp("ckpt"), tensor, tp, dim)
    offset, shape = [], []
    for size in tensor.shape:
        start = data.draw(st.integers(0, size))
        offset.append(start)
        shape.append(data.draw(st.integers(0, size - start)))
    box = (tuple(offset), tuple(shape))
    plan = plan_boxes(ckpt.manifest, {"w": box})
    got = execute_reshard(ckpt.path, ckpt.manifest, plan, torch.device("cpu"))["w"]
    want = tensor[offset[0]:offset[0] + shape[0], offset[1]:offset[1] + shape[1]]
    assert torch.equal(got, want)
    files = {s.file for s in plan.pieces["w"].sources}
    assert len(files) <= tp  # only the pieces that overlap the box


def test_a_box_outside_the_tensor_is_refused(tmp_path: Path) -> None:
    ckpt = _write(tmp_path / "c", torch.zeros(4, 4), 2, 0)
    with pytest.raises(RequestError, match="not inside"):
        plan_boxes(ckpt.manifest, {"w": ((2, 0), (3, 4))})


def _box(name: str, shape: tuple[int, ...], tp: int, rank: int) -> tuple[tuple[int, ...], ...]:
    return vllm_box(name, shape, EngineRank(tp_size=tp, tp_rank=rank), plan=plan_for(LLAMA),
                    heads=Heads.from_config(LLAMA))


def test_boxes_follow_vllms_column_and_row_splits() -> None:
    q = "model.layers.0.self_attn.q_proj.weight"
    assert _box(q, (256, 256), 2, 1) == ((128, 0), (128, 256))
    o = "model.layers.0.self_attn.o_proj.weight"
    assert _box(o, (256, 256), 4, 3) == ((0, 192), (256, 64))
    norm = "model.layers.0.input_layernorm.weight"
    assert _box(norm, (256,), 4, 3) == ((0,), (256,))


def test_quantized_weights_are_cut_in_their_grid_input_major_where_stored_so() -> None:
    """AWQ ``qweight`` [in, out/8] and GPTQ ``qweight`` [in/8, out]: a column-parallel layer's
    share is their last dim, a row-parallel one's their first, in whole packs; key/value
    heads in grid rows; compressed-tensors' ``weight_packed`` [out, in/8] is output-major."""
    rank = EngineRank(tp_size=2, tp_rank=1)

    def box(name: str, shape: tuple[int, ...], pack: tuple[int, ...], input_major: bool
            ) -> tuple[tuple[int, ...], ...]:
        return vllm_box(name, shape, rank, plan=plan_for(LLAMA), heads=Heads.from_config(LLAMA),
                        pack=pack, input_major=input_major)

    layer = "model.layers.0"
    assert box(f"{layer}.self_attn.q_proj.qweight", (256, 32), (1, 8), True) == \
        ((0, 16), (256, 16))  # AWQ, column-parallel: output packs 16..31
    assert box(f"{layer}.self_attn.k_proj.qweight", (32, 64), (8, 1), True) == \
        ((0, 32), (32, 32))  # GPTQ: the second key/value head's 32 output columns
    assert box(f"{layer}.self_attn.o_proj.qweight", (32, 256), (8, 1), True) == \
        ((16, 0), (16, 256))  # GPTQ, row-parallel: input rows 128..255 are packed rows 16..31
    assert box(f"{layer}.mlp.down_proj.weight_packed", (256, 64), (1, 8), False) == \
        ((0, 32), (256, 32))  # compressed-tensors, row-parallel: its input packs
    assert box(f"{layer}.self_attn.o_proj.qweight", (32, 256), (8, 1), False) != \
        ((16, 0), (16, 256))  # the same shape read output-major is another box


def test_key_value_heads_are_replicated_when_tp_exceeds_them() -> None:
    k = "model.layers.0.self_attn.k_proj.weight"  # 2 heads of 32 rows
    assert [_box(k, (64, 256), 4, r)[0][0] for r in range(4)] == [0, 0, 32, 32]
    assert {_box(k, (64, 256), 4, r)[1] for r in range(4)} == {(32, 256)}
    assert _box(k, (64, 256), 2, 1) == ((32, 0), (32, 256))


def test_vocabulary_is_cut_after_padding() -> None:
    embed = "model.embed_tokens.weight"  # 1000 rows, padded to 1024: 512 a rank at TP 2
    assert _box(embed, (1000, 256), 2, 0) == ((0, 0), (512, 256))
    assert _box(embed, (1000, 256), 2, 1) == ((512, 0), (488, 256))
    assert _box("lm_head.weight", (1000, 256), 4, 3) == ((768, 0), (232, 256))


def test_fused_and_unplanned_tensors_are_read_whole() -> None:
    fused = "model.layers.0.mlp.experts.gate_up_proj"
    assert _box(fused, (4, 128, 64), 2, 1) == ((0, 0, 0), (4, 128, 64))
    unknown = vllm_box("x.weight", (8, 8), EngineRank(tp_size=2, tp_rank=1), plan=None,
                       heads=None)
    assert unknown == ((0, 0), (8, 8))


def _manifest(tmp_path: Path, *, tp: int = 2, rank_local: bool = False,
              method: str = "none") -> shardspec.Checkpoint:
    states = {r: {"w": torch.zeros(2, 2)} for r in range(tp)}
    sharding = None if rank_local else {r: {"w": Shard((2 * tp, 2), (2 * r, 0))}
                                        for r in range(tp)}
    shardspec.save(states, tmp_path / "m", layout=Layout(tp_size=tp), sharding=sharding,
                   quantization=Quantization(method=method))
    return shardspec.open(tmp_path / "m")


def test_own_rank_only_where_the_layouts_agree(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path).manifest
    assert own_rank(manifest, EngineRank(tp_size=2, tp_rank=1)) == 1
    assert own_rank(manifest, EngineRank(tp_size=1, tp_rank=0)) is None


def test_rank_local_tensors_refuse_another_layout_naming_both(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path, rank_local=True).manifest
    with pytest.raises(RequestError) as refused:
        refuse_rank_local(manifest, EngineRank(tp_size=4, tp_rank=0))
    text = str(refused.value)
    assert "tp_size=2" in text and "tensor_parallel_size=4" in text and "'w'" in text
    refuse_rank_local(_manifest(tmp_path / "g").manifest, EngineRank(tp_size=4, tp_rank=0))


def test_quantization_must_be_the_engines(tmp_path: Path) -> None:
    fp8 = _manifest(tmp_path, method="fp8").manifest
    check_quantization(fp8, "fp8")
    with pytest.raises(QuantizationError, match="'fp8'.*'none'"):
        check_quantization(fp8, None)
    awq = _manifest(tmp_path / "awq", method="awq").manifest
    check_quantization(awq, "awq_marlin")  # vLLM's kernel variant of the method
    with pytest.raises(QuantizationError):
        check_quantization(awq, "gptq")
    check_quantization(_manifest(tmp_path / "none").manifest, "fp8")  # online quantization


@pytest.mark.parametrize(("method", "engine"), [
    ("gptq", "auto_gptq"), ("gptq", "gptq_marlin"), ("gptq", "gptq_bitblas"),
    ("awq", "auto_awq"), ("awq", "awq_marlin"), ("compressed-tensors", "compressed-tensors")])
def test_the_engines_kernel_variants_serve_their_method(tmp_path: Path, method: str,
                                                        engine: str) -> None:
    check_quantization(_manifest(tmp_path, method=method).manifest, engine, method)
    check_quantization(_manifest(tmp_path / "b", method=method).manifest, engine, None)


def test_a_kernel_vllm_chose_for_the_declared_method_serves_it(tmp_path: Path) -> None:
    """vLLM runs GPTQ mixtures of experts as ``moe_wna16``: no word of the method in it."""
    gptq = _manifest(tmp_path, method="gptq").manifest
    check_quantization(gptq, "moe_wna16", "gptq")
    with pytest.raises(QuantizationError, match="'gptq'.*'moe_wna16'"):
        check_quantization(gptq, "moe_wna16", None)


@pytest.mark.parametrize(("engine", "declared", "hint"), [
    ("fp8", None, "leave quantization unset"),  # online fp8 on a config.json without it
    (None, None, "lacks the checkpoint's quantization_config"),  # config.json stripped
    ("awq", "awq", "config.json declares quantization 'awq'")])  # another model's config
def test_a_real_mismatch_refuses_with_a_hint_that_works(tmp_path: Path, engine: str | None,
                                                        declared: str | None,
                                                        hint: str) -> None:
    gptq = _manifest(tmp_path, method="gptq").manifest
    with pytest.raises(QuantizationError) as refused:
        check_quantization(gptq, engine, declared)
    assert refused.value.code == "quantization-mismatch" and hint in str(refused.value)
    assert "quantization='gptq'" not in str(refused.value)  # vLLM would map it to auto_gptq


def test_options() -> None:
    assert LoaderOptions.parse(None) == LoaderOptions()
    assert LoaderOptions.parse({"verify": True, "save_to": "/x"}).save_to == "/x"
    with pytest.raises(OptionsError, match="unknown keys \\['pattern'\\]"):
        LoaderOptions.parse({"pattern": "x"})
    with pytest.raises(OptionsError, match="'verify' must be true or false"):
        LoaderOptions.parse({"verify": "yes"})
    assert LoaderOptions.parse({"ignore_extensions": ["x.y"]}).ignore_extensions == ("x.y",)


@pytest.mark.parametrize(("extra", "message"), [
    ({"ignore_extensions": 5}, "'ignore_extensions' must be a list"),
    ({"ignore_extensions": {"x.y": 1}}, "'ignore_extensions' must be a list"),
    ({"ignore_extensions": None}, "'ignore_extensions' must be a list"),
    ({"ignore_extensions": [""]}, "'ignore_extensions' must be a list"),
    ({"save_to": ""}, "'save_to' must be a directory path"),
    ({"plan_cache": ""}, "'plan_cache' must be a directory path"),
])
def test_options_of_the_wrong_type_are_refused_by_name(extra: dict[str, object],
                                                       message: str) -> None:
    """Issue 41 item 14: a number or null raised TypeError, a dict passed as its keys, and an
    empty path named the working directory."""
    with pytest.raises(OptionsError, match=message):
        LoaderOptions.parse(extra)


def test_plan_cache_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDSPEC_CACHE_DIR", str(tmp_path))
    assert LoaderOptions.parse(None).plan_cache_dir() == tmp_path / "vllm-plans"
    assert LoaderOptions.parse({"plan_cache": False}).plan_cache_dir() is None
    assert LoaderOptions.parse({"plan_cache": "/p"}).plan_cache_dir() == Path("/p")
    with pytest.raises(OptionsError, match="'plan_cache' must be a directory path or false"):
        LoaderOptions.parse({"plan_cache": 3})
