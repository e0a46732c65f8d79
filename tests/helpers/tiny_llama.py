"""The tiny Llama the round-trip properties draw: every TP size of 1, 2 and 4 splits it evenly."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from hf_helpers import llama_tensors

#: What the round-trip properties draw of a tiny Llama (``tiny_llama``'s arguments and the
#: number of files it is written to), as ``@given(**TINY_LLAMA_DRAWS)`` keywords.
TINY_LLAMA_DRAWS = {
    "layers": st.integers(1, 3),
    "tie": st.booleans(),
    "bias": st.booleans(),
    "shards": st.integers(1, 3),
    "dtype": st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    "seed": st.integers(0, 2**16),
}


def tiny_llama(layers: int, dtype: torch.dtype, tie: bool, bias: bool, seed: int
               ) -> dict[str, torch.Tensor]:
    """A Llama whose every split dim (heads * head_dim = kv_heads * head_dim = 8, intermediate
    12, vocab 16) is divisible by 1, 2 and 4, so that every TP size of those is an even split;
    written with ``kv_heads=4``."""
    return llama_tensors(layers=layers, hidden=8, heads=4, kv_heads=4, intermediate=12,
                         vocab=16, dtype=dtype, tie=tie, bias=bias, seed=seed)
