"""Convert, attention: head-structured tensors are cut on head boundaries, as vLLM cuts them.

A tensor is head-structured along the dimension that counts attention heads:

- the output dim (dim 0 of ``[out, in]``, or of a bias) of ``q_proj``, ``k_proj``, ``v_proj``,
  MLA's ``q_b_proj`` and ``kv_b_proj`` (one slice per query head), and of per-head norms
  (``q_norm``, ``k_norm``) stored for all heads;
- the input dim of ``o_proj``.

When the plan's style splits a tensor along that dim, each rank's piece is its heads of
:func:`shardspec.format.heads.heads_of_rank` (vLLM's rule): the TP size must divide the query
heads; key/value heads are dealt the same way, or, when there are fewer of them than ranks,
each is held by ``tp_size / num_kv_heads`` consecutive ranks, which the manifest records as
replicas (SPEC 7.4). Head counts come from ``config.json`` (``num_attention_heads``,
``num_key_value_heads``; ``text_config`` for multimodal configs). Fused query/key/value tensors
(``qkv_proj``, ``query_key_value``, ``c_attn``, ``W_pack``...) cannot be cut into whole heads
of each by one slice, so splitting them is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..format.heads import HeadsError, heads_of_rank
from .tp_plan import PlanError

__all__ = ["HeadCounts", "Kind", "head_counts", "head_kind", "head_runs", "query_first"]

_QUERY = frozenset({"q_proj", "q_b_proj", "kv_b_proj", "q_norm"})
_KV = frozenset({"k_proj", "v_proj", "k_norm"})
_OUTPUT = frozenset({"o_proj"})
_FUSED = frozenset({"qkv_proj", "query_key_value", "c_attn", "Wqkv", "W_pack", "qkv"})

Kind = Literal["query", "kv", "fused"]


@dataclass(frozen=True)
class HeadCounts:
    """A model's attention head counts (``num_key_value_heads`` < ``num_heads``: GQA)."""

    num_heads: int
    num_kv_heads: int


def _count(config: Mapping[str, Any], key: str) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"config.json: {key} must be a positive integer, got {value!r}")
    return value


def head_counts(config: Mapping[str, Any] | None) -> HeadCounts | None:
    """The head counts of ``config`` (or of its ``text_config``); None where it has none."""
    for where in (config or {}, (config or {}).get("text_config")):
        if not isinstance(where, Mapping):
            continue
        heads = _count(where, "num_attention_heads")
        if heads is not None:
            kv = _count(where, "num_key_value_heads")
            return HeadCounts(heads, heads if kv is None else kv)
    return None


def head_kind(name: str, style_dim: int, ndim: int) -> Kind | None:
    """Whether splitting tensor ``name`` (of ``ndim`` dims, ``[out, in]`` order) along
    ``style_dim`` cuts through query heads, key/value heads or fused q/k/v; None: neither."""
    module = name.rpartition(".")[0].rpartition(".")[2]
    out_dim = ndim - 2 if ndim >= 2 else 0
    if module in _FUSED:
        return "fused"
    if module in _QUERY and style_dim == out_dim:
        return "query"
    if module in _KV and style_dim == out_dim:
        return "kv"
    if module in _OUTPUT and ndim >= 2 and style_dim == ndim - 1:
        return "query"
    return None


def query_first(names: list[str]) -> list[str]:
    """``names`` with the query projections first (in their order), so that a TP size the
    query heads refuse is reported on a query tensor rather than on a key/value one."""
    def is_query(name: str) -> bool:
        return name.rpartition(".")[0].rpartition(".")[2] in _QUERY | _OUTPUT
    return [n for n in names if is_query(n)] + [n for n in names if not is_query(n)]


def head_runs(name: str, kind: Kind, length: int, tp_size: int, counts: HeadCounts | None
              ) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """Per TP rank, the start and size (in elements of the split dim of ``length``) of its
    heads, and how many ranks hold each key/value head (1: none replicated)."""
    if kind == "fused":
        raise PlanError(f"tensor {name!r} fuses query, key and value heads: one slice of it per "
                        "rank is not whole heads of each, so it cannot be split by tensor "
                        "parallelism; give it style 'replicate', or convert a checkpoint with "
                        "separate q_proj, k_proj and v_proj")
    if counts is None:
        raise PlanError(f"tensor {name!r} holds attention heads, but config.json gives no "
                        "num_attention_heads (and num_key_value_heads), so convert cannot tell "
                        "where its heads begin; add them to config.json")
    heads = counts.num_heads if kind == "query" else counts.num_kv_heads
    what = "num_attention_heads" if kind == "query" else "num_key_value_heads"
    if length % heads:
        raise PlanError(f"tensor {name!r}: its head dim has {length} elements, not a multiple "
                        f"of its {heads} heads ({what} in config.json)")
    unit = length // heads
    starts, sizes = [], []
    replicas = 1
    for rank in range(tp_size):
        try:
            held = heads_of_rank(rank, tp_size, counts.num_heads, counts.num_kv_heads)
        except HeadsError as exc:
            raise PlanError(f"tensor {name!r}: {exc} (num_attention_heads "
                            f"{counts.num_heads}, num_key_value_heads {counts.num_kv_heads}, "
                            f"TP size {tp_size}); choose a TP size that does") from None
        run = held.query if kind == "query" else held.kv
        starts.append(run.start * unit)
        sizes.append(len(run) * unit)
        if kind == "kv":
            replicas = held.kv_replicas
    return tuple(starts), tuple(sizes), replicas
