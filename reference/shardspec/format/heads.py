"""Which attention heads a tensor-parallel rank holds: vLLM's rule, in one place.

vLLM (``QKVParallelLinear``, ``RowParallelLinear``) and Megatron shard attention by whole heads:

- the query heads are dealt in ``tp_size`` contiguous runs; ``tp_size`` must divide them;
- with at least as many key/value heads as ranks, the key/value heads are dealt the same way
  (``tp_size`` must divide them);
- with fewer (grouped-query attention at a large TP size), each key/value head is held by
  ``tp_size / num_kv_heads`` consecutive ranks (``num_kv_heads`` must divide ``tp_size``): rank
  ``r`` holds key/value head ``r // (tp_size // num_kv_heads)``. A checkpoint records those
  copies as replicas (SPEC 7.4), numbered in rank order.

Which tensors hold heads is known by name, as experts are (:mod:`shardspec.format.experts`):
:func:`head_kind` (the output dim of ``q_proj``, ``k_proj``, ``v_proj`` and their biases, of
MLA's ``q_b_proj`` and ``kv_b_proj``, of per-head norms; the input dim of ``o_proj``; fused
``qkv`` tensors), with the counts of ``config.json`` (:func:`head_counts`). :func:`head_runs`
gives every rank's run of a head-structured dim. ``convert`` and resharding cut every such
tensor with them; a loader that must agree with vLLM (the vLLM integration,
``convert.vllm_names``) can import :func:`heads_of_rank` from here: this module depends on
nothing else of the package.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "HeadCounts",
    "HeadsError",
    "Kind",
    "RankHeads",
    "head_counts",
    "head_kind",
    "head_runs",
    "head_slices",
    "heads_of_rank",
    "is_query_tensor",
    "kv_head_replicas",
]

_QUERY = frozenset({"q_proj", "q_b_proj", "kv_b_proj", "q_norm"})
_KV = frozenset({"k_proj", "v_proj", "k_norm"})
_OUTPUT = frozenset({"o_proj"})
_FUSED = frozenset({"qkv_proj", "query_key_value", "c_attn", "Wqkv", "W_pack", "qkv"})

#: What a split through a tensor's head dim cuts: query heads, key/value heads, or fused q/k/v.
Kind = Literal["query", "kv", "fused"]


class HeadsError(ValueError):
    """Head counts that tensor parallelism of this size cannot deal in whole heads."""


@dataclass(frozen=True)
class RankHeads:
    """The heads one tensor-parallel rank holds.

    ``query`` and ``kv`` are ranges of head indices; ``kv_replica`` numbers this rank's copy of
    its key/value heads among the ``kv_replicas`` ranks that hold the same ones (0 is the
    first, in rank order; ``kv_replicas`` is 1 when no key/value head is replicated)."""

    query: range
    kv: range
    kv_replica: int
    kv_replicas: int


def kv_head_replicas(tp_size: int, num_kv_heads: int) -> int:
    """How many ranks hold each key/value head: ``tp_size // num_kv_heads`` when there are
    fewer key/value heads than ranks, else 1. HeadsError where vLLM would refuse the counts."""
    _positive(tp_size=tp_size, num_kv_heads=num_kv_heads)
    if num_kv_heads >= tp_size:
        if num_kv_heads % tp_size:
            raise HeadsError(f"{num_kv_heads} key/value heads cannot be dealt evenly to "
                             f"{tp_size} tensor-parallel ranks (the TP size must divide "
                             "them)")
        return 1
    if tp_size % num_kv_heads:
        raise HeadsError(f"{num_kv_heads} key/value heads cannot be replicated evenly over "
                         f"{tp_size} tensor-parallel ranks (with fewer key/value heads than "
                         "ranks, their number must divide the TP size)")
    return tp_size // num_kv_heads


def heads_of_rank(tp_rank: int, tp_size: int, num_heads: int,
                  num_kv_heads: int | None = None) -> RankHeads:
    """The query and key/value heads tensor-parallel rank ``tp_rank`` of ``tp_size`` holds,
    by vLLM's rule (the module docstring). ``num_kv_heads`` defaults to ``num_heads`` (no
    grouped-query attention). HeadsError where the counts cannot be dealt in whole heads."""
    kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    _positive(tp_size=tp_size, num_heads=num_heads, num_kv_heads=kv_heads)
    if not 0 <= tp_rank < tp_size:
        raise HeadsError(f"tp_rank {tp_rank} is not in 0..{tp_size - 1}")
    if num_heads % tp_size:
        raise HeadsError(f"{num_heads} query heads cannot be dealt evenly to {tp_size} "
                         "tensor-parallel ranks (the TP size must divide them)")
    per_rank = num_heads // tp_size
    query = range(tp_rank * per_rank, (tp_rank + 1) * per_rank)
    replicas = kv_head_replicas(tp_size, kv_heads)
    if replicas > 1:
        head = tp_rank // replicas
        return RankHeads(query, range(head, head + 1), tp_rank % replicas, replicas)
    kv_per_rank = kv_heads // tp_size
    kv = range(tp_rank * kv_per_rank, (tp_rank + 1) * kv_per_rank)
    return RankHeads(query, kv, 0, 1)


def _positive(**counts: int) -> None:
    for label, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise HeadsError(f"{label} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class HeadCounts:
    """A model's attention head counts (``num_kv_heads`` < ``num_heads``: grouped-query)."""

    num_heads: int
    num_kv_heads: int


def _count(config: Mapping[str, Any], key: str) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise HeadsError(f"config.json: {key} must be a positive integer, got {value!r}")
    return value


def head_counts(config: Mapping[str, Any] | None) -> HeadCounts | None:
    """The head counts of a ``config.json`` (or of its ``text_config``); None without any."""
    for where in (config or {}, (config or {}).get("text_config")):
        if not isinstance(where, Mapping):
            continue
        heads = _count(where, "num_attention_heads")
        if heads is not None:
            kv = _count(where, "num_key_value_heads")
            return HeadCounts(heads, heads if kv is None else kv)
    return None


def _module(name: str) -> str:
    return name.rpartition(".")[0].rpartition(".")[2]


def head_kind(name: str, split_dim: int, ndim: int) -> Kind | None:
    """Whether splitting tensor ``name`` (``ndim`` dims, ``[out, in]`` order) along
    ``split_dim`` cuts through query heads, key/value heads or fused q/k/v; None: neither."""
    module = _module(name)
    out_dim = ndim - 2 if ndim >= 2 else 0
    if module in _FUSED:
        return "fused"
    if module in _QUERY and split_dim == out_dim:
        return "query"
    if module in _KV and split_dim == out_dim:
        return "kv"
    if module in _OUTPUT and ndim >= 2 and split_dim == ndim - 1:
        return "query"
    return None


def is_query_tensor(name: str) -> bool:
    """Whether ``name`` belongs to a module that holds query heads (``q_proj``, ``o_proj``...)."""
    return _module(name) in _QUERY | _OUTPUT


def head_runs(kind: Kind, length: int, tp_size: int, counts: HeadCounts | None
              ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per tensor-parallel rank, the start and size (in elements of a head-structured dim of
    ``length``) of the heads :func:`heads_of_rank` gives it. HeadsError where that cannot be
    done: fused q/k/v, no counts, a length that is not whole heads, counts the TP size does
    not deal."""
    if kind == "fused":
        raise HeadsError("it fuses query, key and value heads: one slice of it per rank is not "
                         "whole heads of each")
    if counts is None:
        raise HeadsError("it holds attention heads, but config.json gives no "
                         "num_attention_heads (and num_key_value_heads), so where its heads "
                         "begin is unknown")
    heads = counts.num_heads if kind == "query" else counts.num_kv_heads
    what = "num_attention_heads" if kind == "query" else "num_key_value_heads"
    if length % heads:
        raise HeadsError(f"its head dim has {length} elements, not a multiple of its {heads} "
                         f"heads ({what} in config.json)")
    unit = length // heads
    starts, sizes = [], []
    for rank in range(tp_size):
        held = heads_of_rank(rank, tp_size, counts.num_heads, counts.num_kv_heads)
        run = held.query if kind == "query" else held.kv
        starts.append(run.start * unit)
        sizes.append(len(run) * unit)
    return tuple(starts), tuple(sizes)


def head_slices(name: str, shape: tuple[int, ...], dim: int, tp_size: int,
                counts: HeadCounts | None) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """:func:`head_runs` of tensor ``name`` split along ``dim`` where it holds heads along it
    and the counts are known; None where the rule does not apply (resharding's rule 11)."""
    if counts is None or tp_size == 1:
        return None
    kind = head_kind(name, dim, len(shape))
    return None if kind is None else head_runs(kind, shape[dim], tp_size, counts)
