"""vLLM's fused parameters (``names="vllm"``): each TP rank's ``qkv_proj`` and ``gate_up_proj``.

Each TP rank's ``...self_attn.qkv_proj.weight`` (and ``.bias``) is its q rows, then its k rows,
then its v rows (``num_attention_heads / tp`` query heads, and its key/value heads:
``num_key_value_heads / tp`` of them, or, with fewer key/value heads than ranks, the one head
that ``tp / num_key_value_heads`` consecutive ranks share, as vLLM deals them), and its
``...mlp.gate_up_proj.weight`` its gate rows then its up rows.

Such a tensor is recorded as a *global* tensor cut per part (:class:`Fused`, format 1.3): its
global shape is the members' stacked along dim 0 (q, k, v; gate, up), and each rank holds one
piece of each member, at that member's rows of the global tensor, in a file of its own; the
rank's value, their join (SPEC 7.2 rules 6 and 7), is vLLM's parameter byte for byte. Key/value
heads held by several ranks are replicas (SPEC 7.4), numbered in rank order. Where a rank's
pieces are adjacent (at TP 1) and none is replicated, they are one piece. Such a checkpoint
validates as slices, reshards and reads at any layout. vLLM's own ``sharded_state`` loader
takes each name once per rank, though, so at TP 2 and more it cannot read a tensor held in
several pieces: for it, ``rank_local`` writes each rank's fused tensor as one rank-local tensor
(SPEC 7.5) instead, of the same bytes.

vLLM's ``sharded_state`` loader fills the model's whole ``state_dict()``, buffers included, and
refuses a directory that lacks one. vLLM's ``Attention`` layer (at ``...self_attn.attn``)
registers four float32 scalars, ``_k_scale``, ``_v_scale``, ``_q_scale`` and ``_prob_scale``
(vLLM 0.32/0.33), which its default loader leaves at 1.0 for a checkpoint without KV-cache
scales; each attention layer gets them here with that value, replicated on every rank.

vLLM pads the vocabulary of the embedding and the LM head to a multiple of 64 rows and gives
each rank an equal run of the padded rows (:func:`vocab_rows`); each rank's tensor is that run,
zero rows included (rank-local, :class:`PaddedVocab`: the zero rows are in no global tensor).
Where no run holds padding (a vocabulary that is a multiple of 64, cut evenly), the runs are
slices of the vocabulary, and the tensor stays the global split it was.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..format.dtypes import byte_size
from ..format.heads import HeadsError, kv_head_replicas
from ..format.ties import Box
from .hf import iter_slice
from .plan import Split, Tied
from .tp_plan import PlanError

__all__ = ["ATTENTION_SCALES", "VOCAB_PADDING", "Constant", "Fused", "PaddedVocab",
           "fuse_for_vllm", "vllm_name", "vocab_rows"]


#: vLLM's fusions: (module suffix of the fused parameter, the Hugging Face modules it joins).
_VLLM_FUSIONS = (
    ("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    ("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj")),
)


#: The buffers of vLLM's ``Attention`` layer, and the value its default loader leaves in them.
ATTENTION_SCALES = {"_k_scale": 1.0, "_v_scale": 1.0, "_q_scale": 1.0, "_prob_scale": 1.0}


@dataclass(frozen=True)
class Constant:
    """A float32 scalar with a known value, held alike by every rank of its stage."""

    value: float
    stage: int
    dtype = "F32"
    shape: tuple[int, ...] = ()

    def box(self, ep_rank: int, tp_rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (), ()

    def data(self) -> bytes:
        return struct.pack("<f", self.value)


@dataclass(frozen=True)
class Fused:
    """vLLM's ``qkv_proj`` or ``gate_up_proj``: ``members``, each split along dim 0, stacked
    along dim 0 (see the module docstring). Global, each rank holding one piece per member
    (:meth:`parts`), unless ``rank_local``."""

    members: tuple[Split, ...]
    stage: int
    rank_local: bool = False

    @property
    def dtype(self) -> Any:
        return self.members[0].source.dtype

    @property
    def global_shape(self) -> tuple[int, ...]:
        rows = sum(m.source.shape[0] for m in self.members)
        return (rows, *self.members[0].source.shape[1:])

    def shape(self, tp_rank: int) -> tuple[int, ...]:
        """The rank's value: vLLM's parameter on that rank."""
        rows = sum(m.sizes[tp_rank] for m in self.members)
        return (rows, *self.members[0].source.shape[1:])

    def _boxes(self, tp_rank: int) -> Iterator[tuple[int, Split, int, int]]:
        """Per member, in order: its first row in the global tensor, the member, the rank's
        first row of the member and how many rows of it the rank holds."""
        at = 0
        for member in self.members:
            box = member.box(0, tp_rank)  # vLLM's layouts have ep_size 1
            assert box is not None
            yield at, member, box[0][0], box[1][0]
            at += member.source.shape[0]

    def parts(self, tp_rank: int) -> list[Box]:
        """The rank's pieces of the global tensor, in join order: one per member (its rows of
        that member, at the member's place), or one in all where they are adjacent (at TP 1)
        and no member is replicated (a replica must be some primary piece's copy, SPEC 7.4)."""
        rest = self.members[0].source.shape[1:]
        runs = [(at + first, rows) for at, _, first, rows in self._boxes(tp_rank)]
        replicated = any(len(set(m.starts)) < len(m.starts) for m in self.members)
        if not replicated and all(a + n == b for (a, n), (b, _)
                                  in zip(runs, runs[1:], strict=False)):
            runs = [(runs[0][0], sum(n for _, n in runs))]
        return [((start, *(0,) * len(rest)), (rows, *rest)) for start, rows in runs]

    def chunks(self, tp_rank: int, start: int = 0, stop: int | None = None
               ) -> Iterator[bytes | bytearray]:
        """The bytes of rows ``start``..``stop`` of the rank's value (all of it by default):
        the rank's rows of each member, one member after the other."""
        done = 0  # rows of the value before this member's
        for _, member, first, rows in self._boxes(tp_rank):
            low = max(start, done)
            high = done + rows if stop is None else min(done + rows, stop)
            if low < high:
                yield from iter_slice(member.source, 0, first + low - done, first + high - done)
            done += rows


#: vLLM pads the vocabulary of its embedding and LM head to a multiple of this
#: (DEFAULT_VOCAB_PADDING_SIZE) and gives each tensor-parallel rank an equal run of the padded rows.
VOCAB_PADDING = 64
_VOCAB_TENSORS = ("embed_tokens.weight", "lm_head.weight")


def vocab_rows(vocab: int, tp_size: int, tp_rank: int, padding: int = VOCAB_PADDING
               ) -> tuple[int, int, int]:
    """(first row, rows of the vocabulary, rows in all) of rank ``tp_rank``'s run of a
    vocabulary of ``vocab`` rows padded as vLLM pads it; the rest of its run is padding."""
    per_rank = -(-vocab // padding) * padding // tp_size
    start = min(tp_rank * per_rank, vocab)
    return start, min(start + per_rank, vocab) - start, per_rank


@dataclass(frozen=True)
class PaddedVocab(Fused):
    """vLLM's shard of an embedding or LM head: the rank's run of the padded vocabulary, its
    rows of the tensor followed by zero rows (what vLLM's default loader leaves there)."""

    rank_local: bool = True
    tp_size: int = 1

    def shape(self, tp_rank: int) -> tuple[int, ...]:
        source = self.members[0].source
        return (vocab_rows(source.shape[0], self.tp_size, tp_rank)[2], *source.shape[1:])

    def parts(self, tp_rank: int) -> list[Box]:
        raise TypeError("a padded vocabulary is rank-local: it has no pieces of a global tensor")

    def chunks(self, tp_rank: int, start: int = 0, stop: int | None = None
               ) -> Iterator[bytes | bytearray]:
        assert start == 0 and stop is None, "a rank-local tensor is written whole"
        source = self.members[0].source
        first, rows, per_rank = vocab_rows(source.shape[0], self.tp_size, tp_rank)
        yield from iter_slice(source, 0, first, first + rows)
        padding = byte_size(source.dtype, (per_rank - rows, *source.shape[1:]))
        if padding:
            yield bytes(padding)


def _is_slice(vocab: PaddedVocab, tp_size: int) -> bool:
    """Whether every rank's run of the padded vocabulary is its piece of the split: no run
    holds padding, and each starts where the split's piece does."""
    split = vocab.members[0]
    for tp_rank in range(tp_size):
        first, rows, per_rank = vocab_rows(split.shape[0], tp_size, tp_rank)
        box = split.box(0, tp_rank)
        if rows != per_rank or box is None or (box[0][0], box[1][0]) != (first, rows):
            return False
    return True


def _config_int(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"names='vllm' needs a positive integer {key} in config.json, got "
                        f"{value!r}")
    return value


def _fusion_of(name: str) -> tuple[str, list[str]] | None:
    """The fused tensor a Hugging Face projection goes into, and all the projections it joins;
    None for a tensor vLLM does not fuse."""
    module, _, leaf = name.rpartition(".")
    for fused, joined in _VLLM_FUSIONS:
        for part in joined:
            if module == part or module.endswith("." + part):
                prefix = module[:len(module) - len(part)]
                return f"{prefix}{fused}.{leaf}", [f"{prefix}{m}.{leaf}" for m in joined]
    return None


def vllm_name(name: str) -> str:
    """The name ``names="vllm"`` writes ``name`` under: its fused tensor's, or its own."""
    fusion = _fusion_of(name)
    return name if fusion is None else fusion[0]


def fuse_for_vllm(splits: dict[str, Split | Tied], config: Mapping[str, Any] | None,
                  tp_size: int, *, rank_local: bool = False
                  ) -> dict[str, Split | Tied | Fused | Constant]:
    """``splits`` with vLLM's fused tensors in place of the projections they join (each at
    the position of its first member; global, or ``rank_local``), vLLM's padded vocabulary,
    and each attention layer's scale buffers (:data:`ATTENTION_SCALES`); PlanError where
    vLLM's layout cannot be written."""
    config = config or {}
    heads = _config_int(config, "num_attention_heads")
    kv_heads = _config_int(config, "num_key_value_heads") \
        if config.get("num_key_value_heads") is not None else heads
    if config.get("head_dim") is not None:
        head_dim = _config_int(config, "head_dim")
    else:
        head_dim = _config_int(config, "hidden_size") // heads
    if heads % tp_size:
        raise PlanError(f"names='vllm': num_attention_heads ({heads}) is not a multiple of the "
                        f"TP size ({tp_size})")
    try:  # fewer key/value heads than ranks: each held by tp / kv ranks, as replicas
        kv_head_replicas(tp_size, kv_heads)
    except HeadsError as exc:
        raise PlanError(f"names='vllm': {exc} (num_key_value_heads in config.json)") from None
    rows_of = {"self_attn.q_proj": heads * head_dim, "self_attn.k_proj": kv_heads * head_dim,
               "self_attn.v_proj": kv_heads * head_dim}
    fused_at: dict[str, str] = {}       # member name -> fused name
    groups: dict[str, list[str]] = {}   # fused name -> member names
    for name in splits:
        fusion = _fusion_of(name)
        if fusion is None:
            continue
        fused_name, wanted = fusion
        missing = [w for w in wanted if w not in splits]
        if missing:
            raise PlanError(f"names='vllm': {name!r} is fused with {missing} into "
                            f"{fused_name!r}, but the checkpoint lacks them")
        if fused_name in splits:
            raise PlanError(f"names='vllm': the checkpoint already holds {fused_name!r}")
        fused_at[name] = fused_name
        groups[fused_name] = wanted
    if not groups:
        raise PlanError("names='vllm' found no q/k/v or gate/up projections to fuse; use "
                        "names='hf'")
    tied = [n for n, s in splits.items() if not isinstance(s, Split)]
    if tied:
        raise PlanError(f"names='vllm' cannot fuse quantized projections: {tied[0]!r} is tied "
                        "to a weight (SPEC 8.4); use names='hf'")
    plain = {n: s for n, s in splits.items() if isinstance(s, Split)}
    out: dict[str, Split | Tied | Fused | Constant] = {}
    for name, split in plain.items():
        target = fused_at.get(name)
        if target is None and name.endswith(_VOCAB_TENSORS) and split.dim == 0:
            padded = PaddedVocab((split,), split.stage, tp_size=tp_size)
            out[name] = split if _is_slice(padded, tp_size) else padded
            continue
        if target is None:
            out[name] = split
            continue
        if target in out:
            continue
        members = tuple(plain[m] for m in groups[target])
        for member_name, member in zip(groups[target], members, strict=True):
            module = member_name.rpartition(".")[0]
            if member.dim != 0:
                raise PlanError(f"names='vllm': {member_name!r} must be split along dim 0 "
                                f"(colwise) to be fused into {target!r}; the plan gives style "
                                f"{member.style!r}")
            kind = next((k for k in rows_of if module == k or module.endswith("." + k)), None)
            if kind is not None and member.source.shape[0] != rows_of[kind]:
                raise PlanError(f"names='vllm': {member_name!r} has {member.source.shape[0]} "
                                f"rows, but config.json gives {rows_of[kind]} (heads x "
                                f"head_dim {head_dim})")
            if len(set(member.sizes)) != 1:
                raise PlanError(f"names='vllm': {member_name!r} (dim 0 of size "
                                f"{member.source.shape[0]}) does not split evenly over "
                                f"{tp_size} ranks")
        if len({m.source.dtype.name for m in members}) != 1 or \
                len({m.source.shape[1:] for m in members}) != 1:
            raise PlanError(f"names='vllm': the tensors fused into {target!r} ({groups[target]}) "
                            "differ in dtype or in their dims after the first")
        if len({m.stage for m in members}) != 1:
            raise PlanError(f"names='vllm': the tensors fused into {target!r} are on different "
                            "pipeline stages")
        out[target] = Fused(members, members[0].stage, rank_local)
        if target.endswith("self_attn.qkv_proj.weight"):
            attention = target[: -len("qkv_proj.weight")] + "attn."
            for buffer, value in ATTENTION_SCALES.items():
                if attention + buffer in splits:
                    raise PlanError(f"names='vllm': the checkpoint already holds "
                                    f"{attention + buffer!r}")
                out[attention + buffer] = Constant(value, members[0].stage)
    return out
