"""The architectures ``convert`` must take with no plan: tiny random models built from
transformers' own config classes and saved with ``save_pretrained`` (no hub).

One table, read by the tests (``tests/convert/test_architectures.py``) and by the docs' table of
supported architectures (``docs/gen_architectures.py``), so the two cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Sizes every tiny model shares: 4 query heads and 2 key/value heads of 32 (vLLM's CPU
#: attention needs a head_dim of 32 or more), so TP 2 and TP 4 deal whole heads.
COMMON: dict[str, Any] = {
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 1000,
    "max_position_embeddings": 128,
}


@dataclass(frozen=True)
class Architecture:
    """One ``model_type`` of the matrix."""

    model_type: str
    #: config keys beside :data:`COMMON` (or replacing it; None leaves one out)
    config: dict[str, Any] = field(default_factory=dict)
    #: served by the real vLLM engine in the tests (a representative subset: engines are slow)
    served: bool = False
    #: convert --ep 2 as well (a mixture of experts)
    experts: bool = False
    #: a plan names its attention and MLP (False: none does, and they are kept whole)
    split: bool = True
    #: what is special about it, for the docs
    note: str = ""


ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture("gemma", note="tied embedding"),
    Architecture("gemma2", served=True, note="tied embedding, no LM head module in vLLM"),
    Architecture("gemma3_text", note="q/k norms, sliding window"),
    Architecture("phi3", served=True, config={"pad_token_id": 0},
                 note="fused qkv_proj and gate_up_proj: kept whole"),
    Architecture("olmo2"),
    Architecture("granite"),
    Architecture("starcoder2", note="MLP c_fc/c_proj with biases"),
    Architecture("cohere"),
    Architecture("glm4", config={"pad_token_id": 0}, note="fused gate_up_proj: kept whole"),
    Architecture("ernie4_5"),
    Architecture("nemotron", note="no gate projection"),
    Architecture("stablelm", note="no plan in transformers: the Llama-shaped one"),
    Architecture("gpt_neox", config={"rotary_pct": 1.0},
                 note="base model gpt_neox., fused query_key_value: kept whole"),
    Architecture("qwen2", config={"tie_word_embeddings": True}),
    Architecture("mistral"),
    Architecture("gpt2", split=False, note="no plan anywhere: kept whole, with a warning"),
    Architecture("falcon", config={"new_decoder_architecture": True, "num_kv_heads": 2,
                                   "head_dim": None},
                 split=False, note="no plan anywhere: kept whole, with a warning"),
    Architecture("granitemoe", config={"num_local_experts": 4, "num_experts_per_tok": 2},
                 experts=True, note="experts stacked as block_sparse_moe.input_linear: found "
                 "by structure for --ep"),
)


def save_tiny(arch: Architecture, path: Path, seed: int = 0) -> Any:
    """Build ``arch``'s tiny random model in bf16, ``save_pretrained`` it to ``path``, and
    return the model."""
    import torch
    import transformers

    settings = {k: v for k, v in {**COMMON, **arch.config}.items() if v is not None}
    config = transformers.AutoConfig.for_model(arch.model_type, **settings)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).eval()
    model.save_pretrained(path)
    return model
