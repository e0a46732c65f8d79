"""Tiny random Llama-shaped Hugging Face directories for the convert/merge tests (no hub)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

#: name suffix -> (split dim under the built-in plan, or None: replicated)
LLAMA_SPLIT = {
    "embed_tokens.weight": 0,
    "self_attn.q_proj.weight": 0,
    "self_attn.k_proj.weight": 0,
    "self_attn.v_proj.weight": 0,
    "self_attn.q_proj.bias": 0,
    "self_attn.k_proj.bias": 0,
    "self_attn.v_proj.bias": 0,
    "self_attn.o_proj.weight": 1,
    "mlp.gate_proj.weight": 0,
    "mlp.up_proj.weight": 0,
    "mlp.down_proj.weight": 1,
    "input_layernorm.weight": None,
    "post_attention_layernorm.weight": None,
    "norm.weight": None,
    "lm_head.weight": 0,
}


def expected_split_dim(name: str) -> int | None:
    """The dim the built-in plan splits ``name`` along (tests' own table, not tp_plan's)."""
    for suffix, dim in LLAMA_SPLIT.items():
        if name.endswith(suffix):
            return dim
    raise KeyError(name)


def llama_tensors(
    *,
    layers: int = 2,
    hidden: int = 16,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 32,
    vocab: int = 64,
    dtype: torch.dtype = torch.float32,
    tie: bool = False,
    bias: bool = False,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """A Llama-shaped state dict with random values, as save_pretrained stores it."""
    gen = torch.Generator().manual_seed(seed)
    head_dim = hidden // heads

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    out = {"model.embed_tokens.weight": rand(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = rand(hidden)
        out[p + "self_attn.q_proj.weight"] = rand(heads * head_dim, hidden)
        out[p + "self_attn.k_proj.weight"] = rand(kv_heads * head_dim, hidden)
        out[p + "self_attn.v_proj.weight"] = rand(kv_heads * head_dim, hidden)
        if bias:
            out[p + "self_attn.q_proj.bias"] = rand(heads * head_dim)
            out[p + "self_attn.k_proj.bias"] = rand(kv_heads * head_dim)
            out[p + "self_attn.v_proj.bias"] = rand(kv_heads * head_dim)
        out[p + "self_attn.o_proj.weight"] = rand(hidden, heads * head_dim)
        out[p + "post_attention_layernorm.weight"] = rand(hidden)
        out[p + "mlp.gate_proj.weight"] = rand(intermediate, hidden)
        out[p + "mlp.up_proj.weight"] = rand(intermediate, hidden)
        out[p + "mlp.down_proj.weight"] = rand(hidden, intermediate)
    out["model.norm.weight"] = rand(hidden)
    if not tie:
        out["lm_head.weight"] = rand(vocab, hidden)
    return out


def write_hf_dir(
    root: Path,
    tensors: dict[str, torch.Tensor],
    *,
    shards: int = 1,
    config: dict[str, object] | None = None,
    tie: bool = False,
    model_type: str = "llama",
    heads: int | None = 4,
    kv_heads: int = 2,
) -> Path:
    """Write ``tensors`` as save_pretrained does: model.safetensors, or ``shards`` shards and
    model.safetensors.index.json; plus config.json (with the head counts ``llama_tensors``
    was given: convert cuts attention on head boundaries) and tokenizer files."""
    root.mkdir(parents=True, exist_ok=True)
    names = list(tensors)
    if shards == 1:
        save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
    else:
        per = -(-len(names) // shards)
        groups = [names[i:i + per] for i in range(0, len(names), per)]
        weight_map = {}
        for i, group in enumerate(groups, 1):
            file = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
            save_file({n: tensors[n] for n in group}, str(root / file),
                      metadata={"format": "pt"})
            weight_map.update({n: file for n in group})
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        (root / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2,
            sort_keys=True) + "\n")
    cfg: dict[str, object] = {"model_type": model_type, "tie_word_embeddings": tie,
                              "architectures": ["LlamaForCausalLM"]}
    if heads is not None:  # None: a config without head counts
        cfg.update(num_attention_heads=heads, num_key_value_heads=kv_heads)
    cfg.update(config or {})
    (root / "config.json").write_text(json.dumps(cfg, indent=2))
    (root / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE"}}')
    (root / "tokenizer_config.json").write_text('{"model_max_length": 2048}')
    return root


def load_hf_dir(root: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face directory (single file or index + shards)."""
    from safetensors.torch import load_file

    index = root / "model.safetensors.index.json"
    if (root / "model.safetensors").exists():
        return load_file(str(root / "model.safetensors"))
    weight_map = json.loads(index.read_text())["weight_map"]
    out: dict[str, torch.Tensor] = {}
    for file in sorted(set(weight_map.values())):
        out.update(load_file(str(root / file)))
    return out
