"""Which tensors belong to a routed expert, by name (SPEC 11.3 rule 10, informative).

The manifest does not record experts; serving frameworks find them by name, and so do
``convert --ep`` and resharding across ``ep_size``:

- one tensor per expert: a segment ``experts.{e}`` (Mixtral's ``block_sparse_moe.experts.3.w1``,
  Qwen-MoE's and DeepSeek-V3's ``mlp.experts.17.gate_proj``);
- stacked experts: a segment ``experts`` followed by a parameter name, dimension 0 counting the
  layer's experts (transformers' ``mlp.experts.gate_up_proj``, gpt-oss's
  ``mlp.experts.down_proj_blocks``).

Where a name says nothing (GraniteMoE's ``block_sparse_moe.input_linear.weight``), structure
does: with the config's count of routed experts E, a tensor of three or more dims whose dim 0
is E stacks experts (``expert_count``); in a checkpoint, a tensor of three or more dims that
its expert ranks hold in different runs of dim 0 does (:func:`stacked_by_pieces`).

Shared experts (``shared_experts``, ``shared_expert``) and routers (``mlp.gate``) do not match.
A layer's experts are dealt to expert ranks in contiguous blocks, as vLLM and Megatron do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from .manifest import Layout, TensorRecord

__all__ = ["EXPERT_COUNT_KEYS", "ExpertTensor", "expert_count", "expert_rank", "experts_held",
           "find_experts", "stacked_by_pieces"]

#: Config keys that hold the routed experts per layer, by architecture (Mixtral and GraniteMoE,
#: Qwen-MoE and OLMoE, DeepSeek).
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")

_ONE = re.compile(r"^(?P<group>(?:.*\.)?experts)\.(?P<index>0|[1-9][0-9]*)\.[^.]")
_STACKED = re.compile(r"^(?P<group>(?:.*\.)?experts)\.[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_]\w*)?$")


@dataclass(frozen=True)
class ExpertTensor:
    """A routed expert's tensor: its layer's ``...experts`` prefix, the layer's expert count,
    and the expert index (None for a stacked tensor, whose dim 0 counts the experts)."""

    group: str
    experts: int
    index: int | None


def find_experts(shapes: Mapping[str, tuple[int, ...] | None], *,
                 expert_count: int | None = None) -> dict[str, ExpertTensor]:
    """name -> its expert record, for the names of ``shapes`` that are routed experts' tensors
    (``shapes``: name -> global shape; None for tensors without one, never stacked).
    ``expert_count``: the config's routed experts per layer, to find stacked experts by
    structure where their names do not say."""
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
        elif expert_count and shape and len(shape) >= 3 and shape[0] == expert_count:
            stacked[name] = name.rpartition(".")[0]  # its module
    # Experts are numbered 0..E-1; a checkpoint that lacks some still deals them by number.
    out = {name: ExpertTensor(group, max(counts[group]) + 1, index)
           for name, (group, index) in ones.items()}
    for name, group in stacked.items():
        shape = shapes[name]
        assert shape
        out[name] = ExpertTensor(group, shape[0], None)
    return out


def stacked_by_pieces(name: str, shape: tuple[int, ...] | None,
                      runs: Mapping[int, set[tuple[int, int]]]) -> ExpertTensor | None:
    """A tensor of three or more dims stacks experts if its expert ranks hold different,
    equal runs of dim 0 that deal it in contiguous blocks (``runs``: ep_rank -> the (start,
    length) runs of dim 0 its pieces there cover; a checkpoint written with expert
    parallelism says so itself, whatever the tensor's name)."""
    if shape is None or len(shape) < 3 or len(runs) < 2:
        return None
    size = shape[0] // len(runs)
    if size * len(runs) != shape[0]:
        return None
    for ep_rank, held in runs.items():
        if held != {(ep_rank * size, size)}:
            return None
    return ExpertTensor(name.rpartition(".")[0], shape[0], None)


def expert_count(config: Mapping[str, object] | None) -> int | None:
    """The routed experts per layer a model config gives, or None."""
    for key in EXPERT_COUNT_KEYS:
        value = (config or {}).get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            return value
    return None


def expert_rank(index: int, experts: int, ep_size: int) -> int:
    """The expert rank of expert ``index`` of ``experts``, dealt in contiguous blocks."""
    return index // (experts // ep_size)


def experts_held(records: Mapping[str, TensorRecord], layout: Layout
                ) -> dict[str, ExpertTensor]:
    """Routed experts' tensors of a checkpoint of ``layout``: by name, and by how its expert
    ranks hold the others (:func:`stacked_by_pieces`)."""
    experts = find_experts({n: r.shape for n, r in records.items()})
    if layout.ep_size < 2:
        return experts
    for name, record in records.items():
        if name in experts or record.shape is None or len(record.shape) < 3:
            continue
        runs: dict[int, set[tuple[int, int]]] = {}
        for piece in record.pieces:
            if piece.offset is None:
                break
            ep_rank = layout.coordinates(piece.rank)["ep_rank"]
            runs.setdefault(ep_rank, set()).add((piece.offset[0], piece.shape[0]))
        else:
            found = stacked_by_pieces(name, record.shape, runs)
            if found is not None:
                experts[name] = found
    return experts
