"""Which part of each global tensor a vLLM worker needs: its box, by vLLM's rules.

vLLM's weight loaders are handed whole tensors under Hugging Face names and narrow them to the
worker's slice themselves. The plugin hands them tensors of the global shape in which only the
box computed here has been read, so a worker reads its own bytes and vLLM's own code still
decides the slice (if a box here were too small, the loaded model would hold unread memory; the
tests fill that memory with NaN to prove it never is). The rules, as vLLM 0.3x applies them:

- a column-parallel weight (its dim 0 split) or a row-parallel one (its last dim split): the
  ``tp_rank``-th of ``tp_size`` equal runs (vLLM requires them equal);
- key and value projections: the rows of the rank's key/value heads
  (:func:`shardspec.format.heads.heads_of_rank`: when ``tp_size`` exceeds the key/value heads,
  vLLM replicates each on ``tp_size / num_key_value_heads`` consecutive ranks);
- the embedding and the LM head: the vocabulary is padded to a multiple of ``vocab_padding``
  and cut into equal runs, so a rank needs its run less the padding;
- routed experts under expert parallelism: whole (vLLM picks the worker's experts);
- tensors that are already fused (``gate_up_proj``, ``qkv_proj``: vLLM cuts each member
  separately): whole; the boxes of each part a rank holds are :func:`fused_parts`;
- a quantized weight: the same cut of its grid (SPEC 8.4), in whole packs; AWQ and GPTQ grids
  are ``[in, out]``, so a column-parallel one is cut along its last dim;
- a scale, zero point or group index tied to its weight (SPEC 8.4): the blocks of the weight's
  box (:func:`shardspec.format.ties.tied_box`); per-tensor scales and compressed-tensors'
  ``weight_shape``: whole;
- anything the tensor-parallel plan replicates, or that no plan describes: whole.

Which dimension a tensor is split along comes from the tensor-parallel plan
(:mod:`shardspec.convert.tp_plan`), the same plan ``convert`` follows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...convert.quantized import Quantized, find_quantized
from ...convert.tp_plan import PlanError, TPPlan, resolve_plan, split_dim
from ...convert.vllm_names import VOCAB_PADDING, vocab_rows
from ...format.dtypes import DTYPES, DType
from ...format.heads import HeadsError, heads_of_rank
from ...format.manifest import TensorRecord
from ...reshard.plan import Box, slice_of
from .layouts import EngineRank

__all__ = ["FUSED_MODULES", "Heads", "fused_parts", "plan_for", "quantized_of", "vllm_box"]

_VOCAB_TENSORS = ("embed_tokens.weight", "lm_head.weight")
_KV_MODULES = ("k_proj", "v_proj")
_FUSED_MODULES = ("gate_up_proj", "qkv_proj", "w13")
#: The fused tensors whose parts :func:`fused_parts` knows.
FUSED_MODULES = ("qkv_proj", "gate_up_proj")


@dataclass(frozen=True)
class Heads:
    """Attention heads from config.json: query heads, key/value heads, head dimension."""

    attention: int
    kv: int
    head_dim: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Heads | None:
        """The counts, or None where config.json lacks them or gives them as other than
        positive integers (a string ``hidden_size``: then vLLM's rules are not applied)."""
        heads = _count(config.get("num_attention_heads"))
        kv = _count(config.get("num_key_value_heads") or heads)
        head_dim = _count(config.get("head_dim"))
        hidden = _count(config.get("hidden_size"))
        if head_dim is None and config.get("head_dim") is None and hidden and heads:
            head_dim = _count(hidden // heads)
        if heads is None or kv is None or head_dim is None:
            return None
        return cls(heads, kv, head_dim)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else None


def plan_for(config: Mapping[str, Any] | None) -> TPPlan | None:
    """The tensor-parallel plan of the model, or None where there is none (read whole)."""
    try:
        return resolve_plan(config, None)
    except PlanError:
        return None


@dataclass(frozen=True)
class _Stored:
    shape: tuple[int, ...]
    dtype: DType


def quantized_of(records: Mapping[str, TensorRecord], config: Mapping[str, Any] | None
                 ) -> Quantized:
    """The quantized weights as ``convert`` reads them from these records and config.json
    (which grids are ``[in, out]``, which quantizer outputs are whole on every rank); none
    where convert would refuse the checkpoint."""
    try:
        return find_quantized({n: _Stored(r.shape, DTYPES[r.dtype])
                               for n, r in records.items() if r.shape is not None}, config)
    except PlanError:
        return Quantized()


def vllm_box(
    name: str,
    shape: tuple[int, ...],
    rank: EngineRank,
    *,
    plan: TPPlan | None,
    heads: Heads | None,
    expert: bool = False,
    pack: tuple[int, ...] | None = None,
    input_major: bool = False,
    vocab_padding: int = VOCAB_PADDING,
) -> Box:
    """The box of global tensor ``name`` (of ``shape``) that ``rank`` needs.

    A quantized weight is cut in its grid (SPEC 8.4): ``pack`` grid elements to a stored one
    along each dim, the grid ``[in, out]`` where ``input_major`` (AWQ, GPTQ), so that a
    column-parallel split cuts its last dim; a cut inside a pack is not vLLM's and the box is
    then whole (the agreement check refuses what vLLM would take of it)."""
    whole: Box = ((0,) * len(shape), shape)
    style = plan.style_of(name) if plan is not None else None
    fused = _module_leaf(name) in _FUSED_MODULES or name.rpartition(".")[2] in _FUSED_MODULES
    if style is None or rank.tp_size == 1 or fused or (expert and rank.expert_parallel):
        return whole
    pack = pack or (1,) * len(shape)
    # the grid's dims (a pack's inner dims, as MXFP4's 16 bytes a block, are read whole)
    grid = tuple(n * p for n, p in zip(shape, pack, strict=False))
    try:
        dim = split_dim(style, grid, name)
    except PlanError:
        return whole
    if dim is None:
        return whole
    output = 0
    if input_major and len(grid) >= 2 and dim >= len(grid) - 2:
        dim = (2 * len(grid) - 3) - dim  # the grid is [in, out]: swap the last two dims
        output = len(grid) - 1
    size = grid[dim]
    if name.endswith(_VOCAB_TENSORS) and dim == 0:
        start, length, _ = vocab_rows(size, rank.tp_size, rank.tp_rank, vocab_padding)
    elif _is_kv(name) and dim == output and heads is not None and \
            size == heads.kv * heads.head_dim:
        try:  # the same rule convert and resharding cut heads by
            held = heads_of_rank(rank.tp_rank, rank.tp_size, heads.attention, heads.kv).kv
        except HeadsError:
            return whole  # vLLM refuses these counts itself
        start, length = held.start * heads.head_dim, len(held) * heads.head_dim
    else:
        start, length = slice_of(size, rank.tp_size, rank.tp_rank)
    step = pack[dim] if dim < len(pack) else 1
    if start % step or (length % step and start + length != size):
        return whole
    start, length = start // step, -(-length // step)
    offset = tuple(start if d == dim else 0 for d in range(len(shape)))
    return offset, tuple(length if d == dim else s for d, s in enumerate(shape))


def fused_parts(name: str, shape: tuple[int, ...], rank: EngineRank, heads: Heads | None
                ) -> list[Box] | None:
    """The boxes of a fused ``qkv_proj`` or ``gate_up_proj`` (global ``shape``, its parts
    stacked along dim 0) whose rows ``rank`` holds, in the order vLLM's parameter holds them:
    its query rows, then its key/value heads' rows of k and of v; its run of the gate, then of
    the up projection (one box where they are all adjacent and no key/value head is
    replicated, as at TP 1, as ``convert --names vllm`` writes them). None where ``name`` is
    neither, or its shape is not vLLM's parts (key/value heads as :func:`vllm_box` deals
    them)."""
    module = _module_leaf(name)
    if not shape or module not in FUSED_MODULES:
        return None
    runs: list[tuple[int, int]] = []  # (first row, rows)
    if module == "qkv_proj":
        if heads is None:
            return None
        q_rows, kv_rows = heads.attention * heads.head_dim, heads.kv * heads.head_dim
        if shape[0] != q_rows + 2 * kv_rows:
            return None
        try:
            held = heads_of_rank(rank.tp_rank, rank.tp_size, heads.attention, heads.kv)
        except HeadsError:
            return None
        kv_start, kv_length = held.kv.start * heads.head_dim, len(held.kv) * heads.head_dim
        runs = [(held.query.start * heads.head_dim, len(held.query) * heads.head_dim),
                (q_rows + kv_start, kv_length), (q_rows + kv_rows + kv_start, kv_length)]
    else:
        if shape[0] % 2:
            return None
        start, length = slice_of(shape[0] // 2, rank.tp_size, rank.tp_rank)
        runs = [(start, length), (shape[0] // 2 + start, length)]
    replicated = module == "qkv_proj" and heads is not None and heads.kv < rank.tp_size
    if not replicated and all(a + n == b for (a, n), (b, _)
                              in zip(runs, runs[1:], strict=False)):
        runs = [(runs[0][0], sum(n for _, n in runs))]  # one piece, as convert writes it
    rest = shape[1:]
    return [((start, *(0,) * len(rest)), (length, *rest)) for start, length in runs]


def _module_leaf(name: str) -> str:
    return name.rpartition(".")[0].rpartition(".")[2]


def _is_kv(name: str) -> bool:
    return _module_leaf(name) in _KV_MODULES
