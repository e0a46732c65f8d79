"""The `make demo` job: write a small Llama-shaped TP=4 checkpoint, inspect it, reload it.

Builds a seeded bf16 state dict (tied embeddings), splits it Megatron/vLLM style with
``shardspec.split``, saves it to ./demo-checkpoint, runs ``shardspec inspect`` and
``shardspec validate --checksums`` on it, then loads every rank and checks every tensor
bit-exact, the tied-weight alias, and the reassembled global tensors.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import shardspec
from shardspec import Layout, Shard

OUT = Path("demo-checkpoint")
TP = 4
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 1024,
    "hidden_size": 256,
    "intermediate_size": 704,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}

# How each weight is split across TP ranks: 0 = colwise, 1 = rowwise, None = replicated.
SPLIT_DIM = {
    "self_attn.q_proj.weight": 0,
    "self_attn.k_proj.weight": 0,
    "self_attn.v_proj.weight": 0,
    "self_attn.o_proj.weight": 1,
    "mlp.gate_proj.weight": 0,
    "mlp.up_proj.weight": 0,
    "mlp.down_proj.weight": 1,
    "input_layernorm.weight": None,
    "post_attention_layernorm.weight": None,
}


def build_model(seed: int = 0) -> dict[str, torch.Tensor]:
    """A seeded random Llama state dict in bf16; lm_head.weight is embed_tokens.weight."""
    gen = torch.Generator().manual_seed(seed)
    c = CONFIG
    hidden, inter, vocab = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    head_dim = hidden // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * head_dim

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    sd: dict[str, torch.Tensor] = {"model.embed_tokens.weight": rand(vocab, hidden)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd[p + "self_attn.q_proj.weight"] = rand(hidden, hidden)
        sd[p + "self_attn.k_proj.weight"] = rand(kv, hidden)
        sd[p + "self_attn.v_proj.weight"] = rand(kv, hidden)
        sd[p + "self_attn.o_proj.weight"] = rand(hidden, hidden)
        sd[p + "mlp.gate_proj.weight"] = rand(inter, hidden)
        sd[p + "mlp.up_proj.weight"] = rand(inter, hidden)
        sd[p + "mlp.down_proj.weight"] = rand(hidden, inter)
        sd[p + "input_layernorm.weight"] = 1 + rand(hidden)
        sd[p + "post_attention_layernorm.weight"] = 1 + rand(hidden)
    sd["model.norm.weight"] = 1 + rand(hidden)
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]  # tied: the same tensor
    return sd


def split_dim(name: str) -> int | None:
    """The TP split dimension of a weight (embed_tokens: vocab parallel; norms: replicated)."""
    if name == "model.embed_tokens.weight":
        return 0
    if name == "model.norm.weight":
        return None
    suffix = name.split(".", 3)[3]  # drop "model.layers.{i}."
    return SPLIT_DIM[suffix]


def shard_model(
    sd: dict[str, torch.Tensor],
) -> tuple[dict[int, dict[str, torch.Tensor]], dict[int, dict[str, Shard]]]:
    """Split every tensor into TP pieces; the tied lm_head is the embed piece itself."""
    states: dict[int, dict[str, torch.Tensor]] = {r: {} for r in range(TP)}
    sharding: dict[int, dict[str, Shard]] = {r: {} for r in range(TP)}
    for name, tensor in sd.items():
        if name == "lm_head.weight":
            continue
        for rank, (piece, shard) in enumerate(shardspec.split(tensor, split_dim(name), TP)):
            states[rank][name] = piece
            sharding[rank][name] = shard
    for rank in range(TP):
        states[rank]["lm_head.weight"] = states[rank]["model.embed_tokens.weight"]
    return states, sharding


def cli(*args: str) -> None:
    """Run the `shardspec` console script (installed next to this interpreter)."""
    exe = Path(sys.executable).with_name("shardspec")
    cmd = [str(exe)] if exe.exists() else [shutil.which("shardspec") or "shardspec"]
    print(f"\n$ shardspec {' '.join(args)}", flush=True)
    subprocess.run([*cmd, *args], check=True)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a tensor, for bit-exact comparison."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-exact equality of dtype, shape and bytes."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def verify(
    sd: dict[str, torch.Tensor],
    states: dict[int, dict[str, torch.Tensor]],
    sharding: dict[int, dict[str, Shard]],
) -> list[str]:
    """Reload every rank and compare it with the source; returns the problems found."""
    problems: list[str] = []
    ckpt = shardspec.open(OUT)
    loaded = {rank: ckpt.load_rank(rank, device="cpu") for rank in range(ckpt.world_size)}
    for rank, expected in states.items():
        got = loaded[rank]
        if set(got) != set(expected):
            problems.append(f"rank {rank}: names differ: {sorted(set(got) ^ set(expected))}")
        problems += [
            f"rank {rank}: {name} differs"
            for name, piece in expected.items()
            if name in got and not same(got[name], piece)
        ]
        lm, emb = got.get("lm_head.weight"), got.get("model.embed_tokens.weight")
        ptrs = [t.untyped_storage().data_ptr() for t in (lm, emb) if t is not None]
        if len(ptrs) != 2 or ptrs[0] != ptrs[1]:
            problems.append(f"rank {rank}: lm_head.weight does not share embed_tokens' storage")
    for name, original in sd.items():
        if name == "lm_head.weight":
            continue
        whole = torch.empty_like(original)
        for rank, tensors in loaded.items():
            shard, piece = sharding[rank][name], tensors[name]
            if shard.replica == 0:
                at = zip(shard.offset, piece.shape, strict=True)
                whole[tuple(slice(o, o + n) for o, n in at)] = piece
        if not same(whole, original):
            problems.append(f"{name}: reassembled global tensor differs from the original")
    return problems


def main() -> None:
    """Write, inspect, validate and reload the demo checkpoint; exit 1 on any mismatch."""
    torch.manual_seed(0)
    sd = build_model()
    states, sharding = shard_model(sd)
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.json"
        config.write_text(json.dumps(CONFIG, indent=2) + "\n")
        shardspec.save(
            states,
            OUT,
            layout=Layout(tp_size=TP),
            sharding=sharding,
            extra_files=[config],
            overwrite=True,
            metadata={"model": "demo-tiny-llama"},
        )
    print(f"wrote {OUT}/ (TP={TP}, {len(sd)} tensors incl. the tied lm_head)")
    cli("inspect", str(OUT))
    cli("validate", str(OUT), "--checksums")
    problems = verify(sd, states, sharding)
    if problems:
        print("\nFAILED:", *problems, sep="\n  ", file=sys.stderr)
        sys.exit(1)
    print(
        f"\nOK: all {TP} ranks reload bit-exact, lm_head.weight aliases "
        "model.embed_tokens.weight on every rank, and every global tensor reassembles."
    )


if __name__ == "__main__":
    main()
