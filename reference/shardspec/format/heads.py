"""Which attention heads a tensor-parallel rank holds: vLLM's rule, in one place.

vLLM (``QKVParallelLinear``, ``RowParallelLinear``) and Megatron shard attention by whole heads:

- the query heads are dealt in ``tp_size`` contiguous runs; ``tp_size`` must divide them;
- with at least as many key/value heads as ranks, the key/value heads are dealt the same way
  (``tp_size`` must divide them);
- with fewer (grouped-query attention at a large TP size), each key/value head is held by
  ``tp_size / num_kv_heads`` consecutive ranks (``num_kv_heads`` must divide ``tp_size``): rank
  ``r`` holds key/value head ``r // (tp_size // num_kv_heads)``. A checkpoint records those
  copies as replicas (SPEC 7.4), numbered in rank order.

``convert`` cuts every head-structured tensor with :func:`heads_of_rank`; a loader that must
agree with vLLM (the vLLM integration, ``convert.vllm_names``) can import it from here: it
depends on nothing else of the package.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HeadsError", "RankHeads", "heads_of_rank", "kv_head_replicas"]


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
