"""Convert, attention: head-structured tensors are cut on head boundaries, as vLLM cuts them.

The rule and which tensors it applies to are :mod:`shardspec.format.heads` (shared with
resharding); this module words its refusals for ``convert``: the tensor, the counts, the flag.
Fused query/key/value tensors (``qkv_proj``, ``query_key_value``, ``c_attn``, ``W_pack``...)
cannot be cut into whole heads of each by one slice, so splitting them is refused.
"""

from __future__ import annotations

from ..format.heads import HeadCounts, HeadsError, Kind, head_runs, is_query_tensor
from .tp_plan import PlanError

__all__ = ["cut_heads", "query_first"]


def query_first(names: list[str]) -> list[str]:
    """``names`` with the query projections first (in their order), so that a TP size the
    query heads refuse is reported on a query tensor rather than on a key/value one."""
    return [n for n in names if is_query_tensor(n)] + [n for n in names if not is_query_tensor(n)]


def cut_heads(name: str, kind: Kind, length: int, tp_size: int, counts: HeadCounts | None
              ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """:func:`~shardspec.format.heads.head_runs`, PlanError naming the tensor and the fix."""
    try:
        return head_runs(kind, length, tp_size, counts)
    except HeadsError as exc:
        if kind == "fused":
            fix = ("give it style 'replicate', or convert a checkpoint with separate q_proj, "
                   "k_proj and v_proj")
        elif counts is None:
            fix = "add them to config.json"
        else:
            fix = (f"num_attention_heads {counts.num_heads}, num_key_value_heads "
                   f"{counts.num_kv_heads}, tp_size (--tp) {tp_size}; choose a TP size that "
                   "deals whole heads")
        raise PlanError(f"tensor {name!r}: {exc} ({fix})") from None
