"""Convert, the plan: which box of every source tensor each rank holds.

Pure computation over the source's names, shapes and config; :mod:`shardspec.convert.from_hf` reads
and writes the bytes. For each tensor:

- its *pipeline stage* (:func:`shardspec.format.stages.assign_stages`);
- its *expert ranks*: a routed expert's tensor (:mod:`shardspec.format.experts`) is held only by the
  expert rank its expert is dealt to (contiguous blocks), a stacked expert tensor is cut along
  dim 0 into one run of experts per expert rank, anything else is held by every expert rank;
- its *tensor-parallel split*, from the plan's style (:mod:`shardspec.convert.tp_plan`), computed on
  the weight's grid (its logical shape, SPEC 8.4) and refused where a boundary would fall inside
  a pack of the weight or a block of a tensor tied to it;
- a tensor tied to a weight (a scale, a zero point) is not split by a style at all: each rank
  holds the block-aligned piece its piece of the weight fixes
  (:func:`shardspec.format.ties.tied_box`).

With ``quantize="fp8"``, linear weights are written as F8_E4M3 and each gets a computed
``weight_scale_inv`` tied to it (:mod:`shardspec.convert.fp8`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..format.experts import expert_count, expert_rank, find_experts
from ..format.heads import HeadCounts, HeadsError, Kind, head_counts, head_kind
from ..format.manifest import Layout, Logical, TensorRecord, Tie
from ..format.stages import assign_stages, layer_index
from ..format.ties import Box, packing, tied_box
from . import fp8
from .heads import cut_heads, query_first
from .hf import HFSource, SourceTensor
from .patterns import PatternIndex
from .quantized import Base, Quantized, find_quantized
from .tp_plan import (
    MAX_PATTERN_CHARS,
    MAX_PLAN_PATTERNS,
    PlanError,
    TPPlan,
    best_matches,
    resolve_plan,
    split_dim,
    split_sizes,
)

__all__ = ["LM_HEAD", "EMBEDDING_NAMES", "FUSED_MLP", "Plan", "Split", "Tied", "plan_splits"]

LM_HEAD = "lm_head.weight"
#: Names of the input embedding that ``tie_word_embeddings`` ties the LM head to, in the order
#: they are looked for.
EMBEDDING_NAMES = ("model.embed_tokens.weight", "embed_tokens.weight", "transformer.wte.weight",
                   "model.embed_in.weight", "gpt_neox.embed_in.weight")

#: Modules that hold an MLP's gate and up projections in one matrix, gate rows first (Phi-3,
#: GLM-4).
FUSED_MLP = frozenset({"gate_up_proj"})


@dataclass(frozen=True)
class Split:
    """A tensor cut by its style over tensor-parallel ranks and placed on expert ranks."""

    source: SourceTensor
    style: str
    dim: int | None            # the tensor-parallel split dim (None: replicated)
    sizes: tuple[int, ...]     # per tp rank along ``dim``, in stored elements
    stage: int
    expert_rank: int | None = None      # one expert's tensor: only this expert rank holds it
    expert_sizes: tuple[int, ...] = ()  # stacked experts: per expert rank along dim 0
    quantize: bool = False              # written as F8_E4M3 (``convert --quantize fp8``)
    #: per tp rank, where its piece starts along ``dim`` (stored elements); empty: the runs of
    #: ``sizes`` one after the other. Replicated key/value heads start where another rank's do.
    starts: tuple[int, ...] = ()

    @property
    def dtype(self) -> str:
        return "F8_E4M3" if self.quantize else self.source.dtype.name

    @property
    def shape(self) -> tuple[int, ...]:
        return self.source.shape

    def box(self, ep_rank: int, tp_rank: int) -> Box | None:
        """The stored box the rank at (``ep_rank``, ``tp_rank``) holds; None: nothing."""
        if self.expert_rank is not None and ep_rank != self.expert_rank:
            return None
        offset = [0] * len(self.shape)
        shape = list(self.shape)
        if self.expert_sizes:
            offset[0], shape[0] = sum(self.expert_sizes[:ep_rank]), self.expert_sizes[ep_rank]
        if self.dim is not None:
            offset[self.dim] += self.starts[tp_rank] if self.starts \
                else sum(self.sizes[:tp_rank])
            shape[self.dim] = self.sizes[tp_rank]
        return tuple(offset), tuple(shape)


@dataclass(frozen=True)
class Tied:
    """A scale, zero point or group index: held where its base is, in the matching blocks."""

    source: SourceTensor | None  # None: computed from the base (``--quantize fp8``'s scales)
    base_name: str
    base: Split
    base_record: TensorRecord    # what :func:`tied_box` needs of the base
    tie: Tie
    dtype: str
    shape: tuple[int, ...]

    @property
    def stage(self) -> int:
        return self.base.stage

    def box(self, ep_rank: int, tp_rank: int) -> Box | None:
        base_box = self.base.box(ep_rank, tp_rank)
        if base_box is None:
            return None
        box = tied_box(self.base_record, base_box, self.tie, self.shape)
        assert not isinstance(box, str), "checked by plan_splits"
        return box


@dataclass(frozen=True)
class Plan:
    """Every tensor's split, the embedding the LM head is tied to, logical records and ties."""

    splits: dict[str, Split | Tied]
    tied_embedding: str | None
    logical: dict[str, Logical]
    ties: dict[str, Tie]
    #: what the user should know about the layout (replicated key/value heads, a pipeline
    #: stage without layers): ``convert`` issues each as a :class:`PlanWarning`
    notices: tuple[str, ...] = ()


def _tied_embedding(source: HFSource) -> str | None:
    """The embedding the LM head is tied to, where the config ties them and the file lacks it."""
    config = source.config or {}
    if not config.get("tie_word_embeddings") or LM_HEAD in source.tensors:
        return None
    return next((n for n in EMBEDDING_NAMES if n in source.tensors), None)


def _expand_stages(names: list[str], stages: Mapping[str, int] | None) -> dict[str, int]:
    """Stage overrides given by pattern (as in plans) -> by tensor name."""
    stages = dict(stages or {})
    if len(stages) > MAX_PLAN_PATTERNS:
        raise PlanError(f"{len(stages)} stage overrides, more than {MAX_PLAN_PATTERNS}")
    for pattern, stage in stages.items():
        if isinstance(stage, bool) or not isinstance(stage, int):
            raise PlanError(f"stage override {pattern!r}: the stage must be an integer")
        if not isinstance(pattern, str) or len(pattern) > MAX_PATTERN_CHARS:
            raise PlanError(f"stage override {str(pattern)[:60]!r}: a pattern is a string of "
                            f"at most {MAX_PATTERN_CHARS} characters")
    index = PatternIndex(stages)
    out: dict[str, int] = {}
    used: set[int] = set()
    for name in names:
        matched = best_matches(index, name, ("model.",))
        if matched:  # the last override that names it, as each replaced the ones before
            last = max(matched)
            out[name] = stages[index.patterns[last]]
        used.update(matched)
    unused = [p for i, p in enumerate(index.patterns) if i not in used]
    if unused:
        raise PlanError(f"stage override {unused[0]!r} matches no tensor")
    return out


def _quantize_fp8(sources: Mapping[str, SourceTensor], found: Quantized) -> Quantized:
    """The bases and scales ``--quantize fp8`` makes of a checkpoint that is not quantized."""
    if found.bases:
        raise PlanError(f"the checkpoint is already quantized ({len(found.bases)} quantized "
                        f"weights, e.g. {next(iter(found.bases))!r}); convert it without "
                        "--quantize")
    out = Quantized()
    for name, src in sources.items():
        if fp8.quantizable(name, src.dtype.name, src.shape):
            out.bases[name] = Base(Logical(dtype=src.dtype.name, shape=src.shape))
            scale = name[: -len("weight")] + fp8.SCALE_SUFFIX
            if scale in sources:
                raise PlanError(f"tensor {scale!r} already exists; cannot add the FP8 scale of "
                                f"{name!r}")
            out.ties[scale] = Tie(tensor=name, block=(fp8.BLOCK, fp8.BLOCK))
    if not out.bases:
        raise PlanError("--quantize fp8 found no linear weight (BF16, F16 or F32 '*_proj', "
                        "'w1/w2/w3'...) to quantize")
    return out


def _units(grid: tuple[int, ...], pack: tuple[int, ...], ties: list[Tie]) -> list[int]:
    """Per grid dim, the step every split boundary must be a multiple of: the base's pack and
    each tied tensor's block along that dim."""
    units = list(pack) + [1] * (len(grid) - len(pack))
    for tie in ties:
        if tie.block is None:
            continue
        axes = tie.axes if tie.axes is not None else tuple(range(len(tie.block)))
        for axis, block in zip(axes, tie.block, strict=True):
            units[axis] = math.lcm(units[axis], block)
    return units


def _aligned_sizes(name: str, length: int, parts: int, unit: int, what: str,
                   allow_uneven: bool, dim: int) -> list[int]:
    """``split_sizes`` of ``length`` over ``parts``, each boundary a multiple of ``unit``.

    Uneven splits (``allow_uneven``) deal whole units, the first ranks one more, and the last
    piece holding anything ends at ``length``; even ones must land on units by themselves."""
    if allow_uneven and unit > 1:
        units = split_sizes(-(-length // unit), parts, allow_uneven=True, name=name, dim=dim)
        sizes = [n * unit for n in units]
        last = max(i for i, n in enumerate(sizes) if n) if any(sizes) else 0
        sizes[last] -= sum(sizes) - length
        return sizes
    sizes = split_sizes(length, parts, allow_uneven=allow_uneven, name=name, dim=dim)
    edge = 0
    for size in sizes[:-1]:
        edge += size
        if edge % unit and edge != length:
            raise PlanError(
                f"tensor {name!r}: splitting dim {dim} ({length} elements) over {parts} {what} "
                f"puts a boundary at element {edge}, inside a block or pack of {unit} (its "
                "packing, or the blocks of a scale or zero point tied to it, SPEC 8.4); choose "
                f"a size whose pieces are whole blocks of {unit}{_sizes_that_work(length, unit)}")
    return sizes


def _sizes_that_work(length: int, unit: int) -> str:
    """The even split sizes (up to 64) that keep every piece of ``length`` whole ``unit``s."""
    sizes = [n for n in range(1, 65) if length % n == 0 and (length // n) % unit == 0]
    return f" ({', '.join(map(str, sizes))} split this dim so)" if sizes else ""


def plan_splits(
    source: HFSource,
    layout: Layout,
    plan: TPPlan | Mapping[str, str] | None,
    stages: Mapping[str, int] | None,
    allow_uneven: bool,
    quantize: str | None = None,
) -> Plan:
    """The split of every tensor of ``source`` under ``layout``; PlanError before anything is
    written when the plan, the experts or a quantized tensor's blocks forbid it."""
    tied_lm = _tied_embedding(source)
    sources = dict(source.tensors)
    if tied_lm is not None:
        sources[LM_HEAD] = source.tensors[tied_lm]
    found = find_quantized(sources, source.config)
    if quantize == "fp8":
        found = _quantize_fp8(sources, found)
    elif quantize is not None:
        raise ValueError(f"quantize must be None or 'fp8', got {quantize!r}")
    ties = found.ties
    computed = {n for n in ties if n not in sources}       # scales made by --quantize
    own = [n for n in sources if n not in ties]            # split by their own style
    tp_plan = resolve_plan(source.config, plan)
    styles = tp_plan.styles(own)
    styles.update({name: "replicate" for name in found.replicated if name in styles})
    notices = _fused_kept_whole(styles, sources, tp_plan, layout) \
        + _unnamed_notice(own, sources, tp_plan)
    experts = find_experts({n: sources[n].shape for n in own},
                           expert_count=expert_count(source.config)) \
        if layout.ep_size > 1 else {}
    if layout.ep_size > 1 and not experts:
        raise PlanError(f"ep_size (--ep) is {layout.ep_size}, but the checkpoint has no routed "
                        "experts (no tensor named like '...experts.<e>...' or a stacked "
                        "'...experts.<param>', and config.json gives no expert count that "
                        "a stacked tensor's dim 0 has); use ep_size 1")
    for record in experts.values():
        if record.experts % layout.ep_size:
            raise PlanError(f"{record.group} has {record.experts} experts, which "
                            f"{layout.ep_size} expert ranks cannot split evenly (ep_size must "
                            "divide the number of experts)")
    stage_of = assign_stages(list(sources) + sorted(computed), layout.pp_size,
                             _expand_stages(list(sources), stages))
    try:
        counts = head_counts(source.config)
    except HeadsError as exc:
        raise PlanError(str(exc)) from None
    ties_of: dict[str, list[Tie]] = {}
    for tie in ties.values():
        ties_of.setdefault(tie.tensor, []).append(tie)
    splits: dict[str, Split | Tied] = {}
    for name in query_first(own):
        splits[name] = _split(name, sources[name], styles[name], found.bases.get(name),
                              experts.get(name), layout, stage_of[name],
                              ties_of.get(name, []), allow_uneven,
                              quantize is not None and name in found.bases, counts)
    splits = {name: splits[name] for name in own}  # the source's order
    for name, tie in ties.items():
        base = splits.get(tie.tensor)
        if not isinstance(base, Split):
            raise PlanError(f"tensor {name!r} is tied to {tie.tensor!r}, which is not a weight "
                            "of the checkpoint")
        base_record = TensorRecord(dtype=base.dtype, shape=base.shape, pieces=(),
                                   logical=found.bases[tie.tensor].logical)
        src = sources.get(name)
        if src is None:  # an FP8 scale computed from its weight, one value per block
            assert tie.block is not None
            shape = tuple(-(-n // b) for n, b in zip(base.shape, tie.block, strict=True))
            tied = Tied(None, tie.tensor, base, base_record, tie, "F32", shape)
        else:
            tied = Tied(src, tie.tensor, base, base_record, tie, src.dtype.name, src.shape)
        _check_tied(name, tied, layout)
        splits[name] = tied
    logical = {n: b.logical for n, b in found.bases.items()}
    notices += _kv_notice(splits, counts, layout) + _stage_notices(stage_of, layout)
    return Plan(splits, tied_lm, logical, dict(ties), notices)


def _fused_kept_whole(styles: dict[str, str], sources: Mapping[str, SourceTensor],
                      tp_plan: TPPlan, layout: Layout) -> tuple[str, ...]:
    """Fused projections (q/k/v in one tensor, gate and up in one) that the plan would cut as
    one matrix: no single slice is a rank's share of each part. A plan from transformers
    (which gathers their outputs) has them kept whole on every rank, noticed; a plan the user
    gave is refused. Changes ``styles`` in place."""
    if layout.tp_size == 1:
        return ()
    fused = []
    for name, style in styles.items():
        shape = sources[name].shape
        dim = split_dim(style, shape, name)
        if dim is None or len(shape) < 1:
            continue
        if head_kind(name, dim, len(shape)) == "fused" or _module_leaf(name) in FUSED_MLP:
            fused.append(name)
    if not fused:
        return ()
    if tp_plan.unnamed is None:
        name = fused[0]
        if _module_leaf(name) in FUSED_MLP:
            raise PlanError(
                f"tensor {name!r} holds the gate and the up projection in one matrix; "
                f"style {styles[name]!r} would give the first ranks every gate row and the "
                "last every up row, which is no rank's share of the MLP; give it style "
                "'replicate', or convert a checkpoint with separate gate_proj and up_proj")
        return ()  # a fused q/k/v tensor: refused with its fix when its heads are cut
    for name in fused:
        styles[name] = "replicate"
    return (f"{len(fused)} fused projections ({fused[0]!r}...) hold two or three parts in "
            f"one matrix, which no single slice a rank holds can share out; they are kept "
            f"whole on every rank ({tp_plan.source}); a loader that reads boxes, as the vLLM "
            "plugin does, still reads only each worker's rows of them",)


def _unnamed_notice(names: list[str], sources: Mapping[str, SourceTensor],
                    tp_plan: TPPlan) -> tuple[str, ...]:
    """Matrices a plan from transformers does not name, kept whole on every rank."""
    if tp_plan.unnamed is None:
        return ()
    kept = [n for n in tp_plan.unnamed_of(names) if len(sources[n].shape) >= 2]
    if not kept:
        return ()
    return (f"{len(kept)} matrices ({kept[0]!r}...) are not named by {tp_plan.source}; "
            f"they are kept whole on every rank, as transformers keeps them",)


def _module_leaf(name: str) -> str:
    """The module a parameter belongs to: ``gate_up_proj`` of ``...mlp.gate_up_proj.weight``."""
    module = name.rpartition(".")[0]
    return module.rpartition(".")[2]


def _kv_notice(splits: Mapping[str, Split | Tied], counts: HeadCounts | None,
               layout: Layout) -> tuple[str, ...]:
    replicated = [n for n, s in splits.items()
                  if isinstance(s, Split) and len(set(s.starts)) < len(s.starts)]
    if not replicated or counts is None:
        return ()
    copies = layout.tp_size // counts.num_kv_heads
    kv = counts.num_kv_heads
    return (f"the model has {kv} key/value head{'' if kv == 1 else 's'} and tp_size (--tp) is "
            f"{layout.tp_size}: as vLLM does, each key/value head is held by {copies} "
            f"consecutive tensor-parallel ranks, recorded as replicas (SPEC 7.4) of "
            f"{len(replicated)} tensors such as {replicated[0]!r}",)


def _stage_notices(stage_of: Mapping[str, int], layout: Layout) -> tuple[str, ...]:
    with_layers = {stage_of[n] for n in stage_of if layer_index(n) is not None}
    if not with_layers:
        return ()
    empty = [s for s in range(layout.pp_size) if s not in with_layers]
    if not empty:
        return ()
    layers = len({layer_index(n) for n in stage_of} - {None})
    stages = ", ".join(str(s) for s in empty)
    return (f"pipeline stage{'s' if len(empty) > 1 else ''} {stages} of pp_size (--pp) "
            f"{layout.pp_size} hold{'' if len(empty) > 1 else 's'} no transformer layer (the "
            f"model has {layers} layer{'' if layers == 1 else 's'})",)


def _split(name: str, src: SourceTensor, style: str, base: Base | None, expert: Any,
           layout: Layout, stage: int, ties: list[Tie], allow_uneven: bool,
           quantize: bool, counts: HeadCounts | None) -> Split:
    grid = base.logical.shape if base is not None else src.shape
    record = TensorRecord(dtype=src.dtype.name, shape=src.shape, pieces=(),
                          logical=None if base is None else base.logical)
    pack = packing(record)
    if pack is None:
        raise PlanError(f"tensor {name!r}: shape {list(src.shape)} does not pack its logical "
                        f"shape {list(grid)}")
    units = _units(grid, pack, ties)
    dim = split_dim(style, grid, name)
    ndim = len(grid)
    kind = head_kind(name, dim, ndim) if dim is not None and layout.tp_size > 1 else None
    if dim is not None and base is not None and base.input_major and ndim >= 2 \
            and dim >= ndim - 2:
        dim = (2 * ndim - 3) - dim  # the grid is [in, out]: swap the last two dims
    if dim is not None and base is not None and base.act_order and layout.tp_size > 1:
        raise PlanError(f"tensor {name!r}: GPTQ with desc_act (act-order) cannot be split: its "
                        "scales and zero points follow g_idx's groups, which are not blocks of "
                        "the weight (SPEC 8.4), so nothing records which go with a slice; keep "
                        "it whole (style 'replicate') or convert a checkpoint without desc_act")
    sizes: tuple[int, ...] = ()
    starts: tuple[int, ...] = ()
    if dim is not None and kind is not None:
        head_starts, head_sizes = _head_aligned(name, kind, grid[dim], layout.tp_size,
                                                units[dim], dim, counts)
        starts = tuple(s // pack[dim] for s in head_starts)
        sizes = tuple(s // pack[dim] for s in head_sizes)
    elif dim is not None:
        grid_sizes = _aligned_sizes(name, grid[dim], layout.tp_size, units[dim],
                                    "tensor-parallel ranks", allow_uneven, dim)
        sizes = tuple(s // pack[dim] for s in grid_sizes)
    expert_at: int | None = None
    expert_sizes: tuple[int, ...] = ()
    if expert is not None and expert.index is not None:
        expert_at = expert_rank(expert.index, expert.experts, layout.ep_size)
    elif expert is not None:
        if dim == 0:
            raise PlanError(f"tensor {name!r} stacks experts along dim 0, which its style "
                            f"{style!r} also splits; give it a style that splits another dim")
        grid_sizes = _aligned_sizes(name, grid[0], layout.ep_size, units[0], "expert ranks",
                                    False, 0)
        expert_sizes = tuple(s // pack[0] for s in grid_sizes)
    return Split(src, style, dim, sizes, stage, expert_at, expert_sizes, quantize, starts)


def _head_aligned(name: str, kind: Kind, length: int, parts: int, unit: int, dim: int,
                  counts: HeadCounts | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The runs of whole heads each rank holds (:func:`head_runs`), refused where one would
    end inside a block or pack of ``unit`` elements (SPEC 8.4)."""
    starts, sizes = cut_heads(name, kind, length, parts, counts)
    for start, size in zip(starts, sizes, strict=True):
        for edge in (start, start + size):
            if edge % unit and edge != length:
                raise PlanError(
                    f"tensor {name!r}: dealing whole heads to {parts} tensor-parallel ranks "
                    f"puts a boundary at element {edge} of dim {dim} ({length} elements), "
                    f"inside a block or pack of {unit} (its packing, or the blocks of a scale "
                    "or zero point tied to it, SPEC 8.4); choose a TP size whose ranks hold "
                    f"whole blocks{_head_sizes_that_work(name, kind, length, unit, counts)}")
    return starts, sizes


def _head_sizes_that_work(name: str, kind: Kind, length: int, unit: int,
                          counts: HeadCounts | None) -> str:
    """The TP sizes (up to 64) that deal ``name`` whole heads in whole blocks of ``unit``."""
    sizes = []
    for parts in range(1, 65):
        try:
            starts, runs = cut_heads(name, kind, length, parts, counts)
        except PlanError:
            continue
        if all(edge % unit == 0 or edge == length
               for start, run in zip(starts, runs, strict=True) for edge in (start, start + run)):
            sizes.append(parts)
    return f" ({', '.join(map(str, sizes))} do)" if sizes else ""


def _check_tied(name: str, tied: Tied, layout: Layout) -> None:
    for ep_rank in range(layout.ep_size):
        for tp_rank in range(layout.tp_size):
            box = tied.base.box(ep_rank, tp_rank)
            if box is None:
                continue
            found = tied_box(tied.base_record, box, tied.tie, tied.shape)
            if isinstance(found, str):
                raise PlanError(f"tensor {name!r} cannot follow its weight: {found} (SPEC 8.4)")
