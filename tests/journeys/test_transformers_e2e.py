"""End to end with a real transformers model built locally (random weights, no hub access):
save_pretrained -> convert -> merge -> from_pretrained gives the same logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import shardspec
from shardspec.convert import convert, merge

transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.mark.parametrize(("tp", "pp", "tie"), [(2, 1, False), (2, 2, True)])
def test_llama_convert_merge_same_logits(tmp_path: Path, tp: int, pp: int, tie: bool) -> None:
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, max_position_embeddings=64,
        tie_word_embeddings=tie)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(tmp_path / "hf", safe_serialization=True)

    convert(tmp_path / "hf", tmp_path / "ckpt", tp_size=tp, pp_size=pp)
    assert shardspec.validate(tmp_path / "ckpt", checksums=True).ok
    merge(tmp_path / "ckpt", tmp_path / "merged")

    merged = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "merged").eval()
    ids = torch.tensor([[1, 5, 9, 17, 33, 65, 127, 0]])
    with torch.no_grad():
        expected = model(ids).logits
        got = merged(ids).logits
    assert torch.equal(got, expected)
    original = dict(model.state_dict())
    for name, tensor in merged.state_dict().items():
        assert torch.equal(tensor, original[name]), name
