"""A checkpoint rank that is a vLLM worker's own state: whether it is, and what it holds.

A checkpoint under vLLM's names at the engine's layout (``convert --names vllm``,
``import-vllm``, ``save_to``) is read whole, each tensor into the ``state_dict()`` entry of its
name. A rank's value of a tensor is its piece, or the join of its pieces where it holds several
(SPEC 7.2 rules 6 and 7): ``convert --names vllm`` records a fused ``qkv_proj`` or
``gate_up_proj`` as a global tensor of which each rank holds one piece per part, whose join is
vLLM's parameter. Pure Python (no vLLM import).
"""

from __future__ import annotations

from collections.abc import Mapping

from ...format.dtypes import DTYPES, torch_layout
from ...format.joins import Join, join_of
from ...format.manifest import Manifest, Piece, TensorRecord
from ...load.plan import RankPlan
from .layouts import EngineRank
from .regions import FUSED_MODULES, Heads, fused_parts

__all__ = ["is_own_state", "rank_values"]


def rank_values(plan: RankPlan) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Name -> (dtype, shape) of each tensor's value on the rank: its piece's, or its join's."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for file in plan.files:
        for name, (dtype, shape) in file.expected.items():
            join = plan.joins.get(name)
            out[name] = (dtype, shape if join is None else join.shape)
    return out


def is_own_state(manifest: Manifest, rank: int, engine: EngineRank,
                 state: Mapping[str, tuple[int, ...]], heads: Heads | None) -> bool:
    """Whether checkpoint rank ``rank`` is the worker's own state (``state``: the shape of
    each entry of the model's ``state_dict()``): every tensor is in the state dict under its
    name, the rank's value of each has its entry's shape, and a fused ``qkv_proj`` or
    ``gate_up_proj`` recorded as a global tensor is held as the parts vLLM gives the worker
    (:func:`.regions.fused_parts`); a slice of the same shape cut otherwise (a reshard that
    cut it as one matrix) is not. Names alone do not say it: Phi-3's Hugging Face names
    (``qkv_proj``, ``gate_up_proj``) are vLLM's too."""
    if not all(name in state for name in manifest.tensors):
        return False
    for name, record in manifest.tensors.items():
        if not isinstance(record, TensorRecord):
            continue
        pieces = [p for p in record.pieces if p.rank == rank]
        if not pieces:
            continue
        join = join_of(pieces, DTYPES[record.dtype].bits) if len(pieces) > 1 else None
        if isinstance(join, str):
            return False  # a checked manifest has none
        shape = pieces[0].shape if join is None else join.shape
        if tuple(state[name]) != tuple(torch_layout(DTYPES[record.dtype], shape)[1]):
            return False
        if record.shape is not None and not _vllm_parts(name, record.shape, pieces, join,
                                                          engine, heads):
            return False
    return True


def _vllm_parts(name: str, shape: tuple[int, ...], pieces: list[Piece], join: Join | None,
                engine: EngineRank, heads: Heads | None) -> bool:
    """Whether a global tensor's pieces on the rank are vLLM's parts of it where it is fused
    (where it is not, its shape has said it)."""
    if name.rpartition(".")[0].rpartition(".")[2] not in FUSED_MODULES:
        return True
    parts = fused_parts(name, shape, engine, heads)
    held = [(p.offset, p.shape) for p in (join.pieces if join is not None else pieces)]
    return parts is not None and held == parts
