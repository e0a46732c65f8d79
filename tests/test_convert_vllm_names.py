"""``convert(names="vllm")``: vLLM's fused ``qkv_proj`` / ``gate_up_proj`` names, per rank.

The expected state dict of each rank is built here from vLLM's naming (not from the manifest)
and compared bit for bit with what each rank's files hold. That vLLM's own ``sharded_state``
loader accepts the output, and serves the same tokens as the Hugging Face original, is tested
against a real engine in test_vllm_engine.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from hf_helpers import expected_split_dim, llama_tensors, write_hf_dir
from shardspec import load_rank, validate
from shardspec.cli import app
from shardspec.convert import convert
from shardspec.convert.tp_plan import PlanError
from shardspec.format.manifest import TensorRecord

FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
         "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}


def _hf(tmp_path: Path, *, heads: int, kv_heads: int, hidden: int, tie: bool = False,
        bias: bool = False) -> tuple[Path, dict[str, torch.Tensor]]:
    tensors = llama_tensors(layers=2, hidden=hidden, heads=heads, kv_heads=kv_heads,
                            tie=tie, bias=bias, dtype=torch.bfloat16)
    config: dict[str, object] = {"num_attention_heads": heads, "num_key_value_heads": kv_heads,
                                 "hidden_size": hidden}
    return write_hf_dir(tmp_path / "hf", tensors, tie=tie, config=config), tensors


def _vllm_name(name: str) -> str:
    module, _, leaf = name.rpartition(".")
    head, _, last = module.rpartition(".")
    return f"{head}.{FUSED[last]}.{leaf}" if last in FUSED else name


def _expected(tensors: dict[str, torch.Tensor], tp: int, rank: int, heads: int,
              kv_heads: int, head_dim: int, tie: bool) -> dict[str, torch.Tensor]:
    """vLLM's parameters of ``rank``: fused by heads, the rest sliced as the plan does."""
    full = dict(tensors)
    if tie:
        full["lm_head.weight"] = full.pop("model.embed_tokens.weight")  # vLLM keeps this name
    heads_of = {"q_proj": heads // tp, "k_proj": kv_heads // tp, "v_proj": kv_heads // tp}
    out: dict[str, list[torch.Tensor]] = {}
    for name, tensor in full.items():
        last = name.rpartition(".")[0].rpartition(".")[2]
        if last in heads_of:
            rows = heads_of[last] * head_dim
            piece = tensor[rank * rows:(rank + 1) * rows]
        elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
            # vLLM's vocabulary: padded to a multiple of 64, an equal run of rows a rank,
            # zero rows where the run passes the vocabulary's end
            per_rank = -(-tensor.shape[0] // 64) * 64 // tp
            padded = torch.zeros(per_rank * tp, *tensor.shape[1:], dtype=tensor.dtype)
            padded[:tensor.shape[0]] = tensor
            piece = padded[rank * per_rank:(rank + 1) * per_rank]
        else:
            dim = expected_split_dim(name)
            piece = tensor if dim is None else torch.chunk(tensor, tp, dim=dim)[rank]
        out.setdefault(_vllm_name(name), []).append(piece)
    fused = {n: torch.cat(p, 0) if len(p) > 1 else p[0] for n, p in out.items()}
    for name in list(fused):  # vLLM's Attention buffers, as its default loader leaves them
        if name.endswith("self_attn.qkv_proj.weight"):
            for buffer in ("_k_scale", "_v_scale", "_q_scale", "_prob_scale"):
                fused[name.replace("qkv_proj.weight", "attn." + buffer)] = torch.tensor(1.0)
    return fused


@pytest.mark.parametrize(("heads", "kv_heads", "hidden", "tp", "bias", "tie"), [
    (4, 2, 16, 2, False, False),
    (4, 2, 16, 2, True, True),
    (8, 4, 32, 4, True, False),
    (4, 4, 16, 2, False, True),
    (4, 2, 16, 1, True, False),
])
def test_vllm_names_rank_state_is_vllms_state_dict(
        tmp_path: Path, heads: int, kv_heads: int, hidden: int, tp: int, bias: bool,
        tie: bool) -> None:
    src, tensors = _hf(tmp_path, heads=heads, kv_heads=kv_heads, hidden=hidden, tie=tie,
                       bias=bias)
    dst = tmp_path / "ckpt"
    manifest = convert(src, dst, tp_size=tp, names="vllm")
    assert validate(dst, checksums=True).ok
    for name, record in manifest.tensors.items():
        if isinstance(record, TensorRecord):
            fused = ("qkv_proj", "gate_up_proj", "embed_tokens", "lm_head")
            assert record.rank_local == any(f in name for f in fused), name
    assert not any(n.endswith(("q_proj.weight", "up_proj.weight", "gate_proj.weight"))
                   and "gate_up" not in n for n in manifest.tensors)
    for rank in range(tp):
        want = _expected(tensors, tp, rank, heads, kv_heads, hidden // heads, tie)
        assert any("qkv_proj" in n for n in want) and any("gate_up_proj" in n for n in want)
        assert ("model.layers.0.self_attn.qkv_proj.bias" in want) == bias
        assert [f.path for f in manifest.ranks[rank].files] == \
            [f"model-rank-{rank}-part-0.safetensors"]  # vLLM's sharded_state file names
        loaded = {name: tensor for name, tensor in load_rank(dst, rank, device="cpu").items()
                   if isinstance(manifest.tensors[name], TensorRecord)}  # the data, not aliases
        assert loaded.keys() == want.keys()
        for name, tensor in want.items():
            assert loaded[name].dtype == tensor.dtype, name
            assert torch.equal(loaded[name], tensor), name


def test_vllm_names_qkv_is_rank_slices_by_heads(tmp_path: Path) -> None:
    src, tensors = _hf(tmp_path, heads=4, kv_heads=2, hidden=16)
    dst = tmp_path / "ckpt"
    convert(src, dst, tp_size=2, names="vllm")
    p = "model.layers.1."
    q, k, v = (tensors[f"{p}self_attn.{x}_proj.weight"] for x in "qkv")
    gate, up = tensors[f"{p}mlp.gate_proj.weight"], tensors[f"{p}mlp.up_proj.weight"]
    for rank in range(2):
        state = load_rank(dst, rank, device="cpu")
        qkv = state[f"{p}self_attn.qkv_proj.weight"]
        want = torch.cat([q[rank * 8:(rank + 1) * 8], k[rank * 4:(rank + 1) * 4],
                          v[rank * 4:(rank + 1) * 4]], 0)
        assert qkv.shape == (16, 16)
        assert torch.equal(qkv.view(torch.int16), want.view(torch.int16))
        gate_up = state[f"{p}mlp.gate_up_proj.weight"]
        want = torch.cat([gate[rank * 16:(rank + 1) * 16], up[rank * 16:(rank + 1) * 16]], 0)
        assert torch.equal(gate_up.view(torch.int16), want.view(torch.int16))


def test_vllm_names_refused_for_pp(tmp_path: Path) -> None:
    src, _ = _hf(tmp_path, heads=4, kv_heads=2, hidden=16)
    with pytest.raises(PlanError, match="pp_size = 1"):
        convert(src, tmp_path / "pp", tp_size=2, pp_size=2, names="vllm")
    with pytest.raises(ValueError, match="names must be one of"):
        convert(src, tmp_path / "bad", tp_size=2, names="megatron")
    assert not (tmp_path / "pp").exists()


def test_vllm_names_refused_when_kv_heads_fewer_than_ranks(tmp_path: Path) -> None:
    src, _ = _hf(tmp_path, heads=4, kv_heads=1, hidden=16)
    with pytest.raises(PlanError, match="replicates key/value heads"):
        convert(src, tmp_path / "ckpt", tp_size=2, names="vllm")
    assert not (tmp_path / "ckpt").exists()


def test_vllm_names_need_head_counts(tmp_path: Path) -> None:
    src = write_hf_dir(tmp_path / "hf", llama_tensors(layers=1), heads=None)
    with pytest.raises(PlanError, match="num_attention_heads"):
        convert(src, tmp_path / "ckpt", tp_size=2, names="vllm")


def test_cli_convert_names_vllm(tmp_path: Path) -> None:
    src, _ = _hf(tmp_path, heads=4, kv_heads=2, hidden=16)
    runner = CliRunner()
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "ckpt"), "--tp", "2",
                                 "--names", "vllm"])
    assert result.exit_code == 0, result.output
    from shardspec import open as open_checkpoint

    tensors = open_checkpoint(tmp_path / "ckpt").manifest.tensors
    assert "model.layers.0.self_attn.qkv_proj.weight" in tensors
    assert "model.layers.0.mlp.gate_up_proj.weight" in tensors
    assert "model.layers.0.self_attn.q_proj.weight" not in tensors
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "pp"), "--tp", "2",
                                 "--pp", "2", "--names", "vllm"])
    assert result.exit_code == 2
    assert "pp_size = 1" in result.output
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "x"), "--tp", "2",
                                 "--names", "nope"])
    assert result.exit_code == 2
