"""Which tensors belong to a routed expert, by name (SPEC 11.3 rule 10, informative).

The manifest does not record experts; serving frameworks find them by name, and so do
``convert --ep`` and resharding across ``ep_size``:

- one tensor per expert: a segment ``experts.{e}`` (Mixtral's ``block_sparse_moe.experts.3.w1``,
  Qwen-MoE's and DeepSeek-V3's ``mlp.experts.17.gate_proj``);
- stacked experts: a segment ``experts`` followed by a parameter name, dimension 0 counting the
  layer's experts (transformers' ``mlp.experts.gate_up_proj``, gpt-oss's
  ``mlp.experts.down_proj_blocks``).

Shared experts (``shared_experts``, ``shared_expert``) and routers (``mlp.gate``) do not match.
A layer's experts are dealt to expert ranks in contiguous blocks, as vLLM and Megatron do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ExpertTensor", "expert_rank", "find_experts"]

_ONE = re.compile(r"^(?P<group>(?:.*\.)?experts)\.(?P<index>0|[1-9][0-9]*)\.[^.]")
_STACKED = re.compile(r"^(?P<group>(?:.*\.)?experts)\.[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_]\w*)?$")


@dataclass(frozen=True)
class ExpertTensor:
    """A routed expert's tensor: its layer's ``...experts`` prefix, the layer's expert count,
    and the expert index (None for a stacked tensor, whose dim 0 counts the experts)."""

    group: str
    experts: int
    index: int | None


def find_experts(shapes: Mapping[str, tuple[int, ...] | None]) -> dict[str, ExpertTensor]:
    """name -> its expert record, for the names of ``shapes`` that are routed experts' tensors
    (``shapes``: name -> global shape; None for tensors without one, never stacked)."""
    ones: dict[str, tuple[str, int]] = {}
    counts: dict[str, set[int]] = {}
    stacked: dict[str, str] = {}
    for name, shape in shapes.items():
        match = _ONE.match(name)
        if match:
            ones[name] = (match["group"], int(match["index"]))
            counts.setdefault(match["group"], set()).add(int(match["index"]))
            continue
        match = _STACKED.match(name)
        if match and shape:
            stacked[name] = match["group"]
    # Experts are numbered 0..E-1; a checkpoint that lacks some still deals them by number.
    out = {name: ExpertTensor(group, max(counts[group]) + 1, index)
           for name, (group, index) in ones.items()}
    for name, group in stacked.items():
        shape = shapes[name]
        assert shape
        out[name] = ExpertTensor(group, shape[0], None)
    return out


def expert_rank(index: int, experts: int, ep_size: int) -> int:
    """The expert rank of expert ``index`` of ``experts``, dealt in contiguous blocks."""
    return index // (experts // ep_size)

