"""Resharding, the plan: the slice of every tensor a rank of another layout holds, and the
source pieces (and the boxes inside them) it is read from (SPEC 11.3).

Pure computation from a checked manifest; :mod:`shardspec.reshard.load` executes a plan.

How a global tensor is laid out under the target layout is inferred from the source manifest.
Its pieces are grouped by the (pipeline stage, expert rank) of the ranks holding them; within a
group, the *split dimension* is the one dimension along which the pieces have more than one
distinct offset (none: the group holds the tensor replicated or whole; more than one: not a
tensor-parallel split, refused). The group's *region* is the bounding box of its pieces. Under
``tp_size`` K, tp rank t of the group's stage and expert rank holds the t-th of K slices of the
region along the split dimension, sized like ``torch.tensor_split`` (what
:func:`shardspec.split` produces), or the whole region when there is no split dimension. The
stage is the source stage when ``pp_size`` is unchanged, otherwise the one
:func:`shardspec.format.stages.assign_stages` gives, plus those of the tensor's aliases (an alias is
returned wherever its target is: tied embeddings put the embedding on the first and the last
stage).

When ``ep_size`` changes (SPEC 11.3 rule 10), routed experts are known by name or by how the
source's expert ranks hold them (:func:`shardspec.format.experts.experts_held`) and dealt to the
new expert ranks in contiguous blocks: one expert's tensor goes, with its source group's region,
to its expert's new rank only; a stacked expert tensor is cut along dim 0 into one run of
experts per new expert rank; any other tensor must have one region on every source expert rank
of its stage and is held by every new one.

A tensor tied to a base (SPEC 8.4, rule 9) is not inferred from its own pieces: every target
rank holding a box of the base holds the box of the tied tensor that goes with it
(:func:`shardspec.format.ties.tied_box`), refused when the base's box ends inside a block. Copies of
one slice are numbered as replicas 0, 1, ... in rank order. Aliases follow their target;
rank-local tensors cannot be resharded.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import NoReturn

from ..format.dtypes import DTYPES, byte_size
from ..format.errors import Finding, error_for
from ..format.experts import ExpertTensor, expert_rank, experts_held
from ..format.heads import HeadCounts, HeadsError, Kind, head_kind, head_runs, head_slices
from ..format.manifest import Alias, Layout, Manifest, Piece, TensorRecord
from ..format.overlap import first_overlap
from ..format.stages import assign_stages
from ..format.ties import tied_box
from .geometry import (
    Region,
    bounding,
    intersect,
    merged,
    numbered,
    parts_of,
    slice_of,
    volume,
)
from .targets import Box, ReshardPlan, SourcePiece, TargetPiece

__all__ = [
    "Box",
    "ReshardPlan",
    "Resharder",
    "SourcePiece",
    "TargetPiece",
    "plan_reshard",
    "slice_of",
    "target_pieces",
]


def _refuse(
    code: str, message: str, tensor: str | None = None, hint: str | None = None
) -> NoReturn:
    raise error_for(Finding(code=code, message=message, tensor=tensor, hint=hint))


#: (stage, expert rank) -> the region that group of ranks holds
_Regions = dict[tuple[int, int], "Region"]

#: (name, record, target box, replica, [(overlap, the pieces that hold it)]) of one rank
_Wanted = tuple[str, TensorRecord, Box, int, list[tuple[Box, list[Piece]]]]


class Resharder:
    """The whole target layout of a checkpoint, computed once; :meth:`plan` gives one rank's.

    ``split_dims`` overrides the inferred split dimension of named tensors (None: replicate),
    e.g. to split tensors of a TP=1 checkpoint, from which no split can be inferred. ``heads``
    (from ``config.json``) cuts tensors holding attention heads in whole heads, as ``convert``
    does (rule 11, :mod:`shardspec.format.heads`).
    Raises :class:`shardspec.RequestError` (``reshard-rank-local``, ``reshard-unsupported``)
    when the checkpoint cannot be resharded to ``layout``.
    """

    def __init__(
        self,
        manifest: Manifest,
        layout: Layout,
        *,
        split_dims: Mapping[str, int | None] | None = None,
        heads: HeadCounts | None = None,
    ) -> None:
        self.manifest = manifest
        self.layout = layout
        self._heads = heads
        self._split_dims = dict(split_dims or {})
        self._check_request()
        source = manifest.layout
        self._pp_changed = layout.pp_size != source.pp_size
        self._ep_changed = layout.ep_size != source.ep_size
        records = {n: r for n, r in manifest.tensors.items() if isinstance(r, TensorRecord)}
        #: routed experts' tensors, by name (only needed to move them between expert ranks)
        self._experts: dict[str, ExpertTensor] = (
            experts_held(records, source) if self._ep_changed else {})
        #: name -> its stages under a new pp_size: its own and those of its aliases, which are
        #: returned wherever their target is (SPEC 7.6 rule 3)
        self._stages: dict[str, set[int]] = {}
        if self._pp_changed:
            stage_of = assign_stages(manifest.tensors, layout.pp_size)
            self._stages = {name: {stage_of[name]} for name in records}
            for name, record in manifest.tensors.items():
                if isinstance(record, Alias) and record.alias_of in self._stages:
                    self._stages[record.alias_of].add(stage_of[name])
        #: name -> target rank -> its pieces of a tensor cut in parts, in join order (rule 12)
        self.parted: dict[str, dict[int, tuple[tuple[Box, int], ...]]] = {}
        # Bases first: a tied tensor's boxes are derived from its base's (rule 9).
        targets = {name: self._target_boxes(name, record)
                   for name, record in records.items() if record.tied_to is None}
        for name, record in records.items():
            if record.tied_to is not None:
                targets[name] = self._tied_targets(name, record, targets)
        #: name -> target rank -> (box, replica), in the manifest's order
        self.targets: dict[str, dict[int, tuple[Box, int]]] = {
            name: targets[name] for name in records if name not in self.parted
        }
        #: name -> primary box -> the pieces (primary and replicas) holding it
        self._slots: dict[str, dict[Box, list[Piece]]] = {
            name: self._slots_of(record) for name, record in records.items()
        }

    # --- checks ------------------------------------------------------------------------------

    def _check_request(self) -> None:
        layout = self.layout
        if not isinstance(layout, Layout):
            _refuse("reshard-unsupported", f"layout must be a shardspec.Layout, got "
                    f"{type(layout).__name__}")
        if layout.world_size != layout.size:
            _refuse("reshard-unsupported", f"the target layout's world_size {layout.world_size} "
                    f"is not tp_size x pp_size x ep_size = {layout.size}")
        local = sorted(n for n, r in self.manifest.tensors.items()
                       if isinstance(r, TensorRecord) and r.rank_local)
        if local:
            shown = ", ".join(repr(n) for n in local[:10])
            more = f" and {len(local) - 10} more" if len(local) > 10 else ""
            _refuse("reshard-rank-local", f"{len(local)} rank-local tensor(s) cannot be "
                    f"resharded (SPEC 7.5): {shown}{more}", tensor=local[0],
                    hint="load with the checkpoint's own layout, or write these tensors as "
                    "global tensors (with a Shard) so their slices are known")
        for name, dim in self._split_dims.items():
            record = self.manifest.tensors.get(name)
            if not isinstance(record, TensorRecord) or record.shape is None:
                _refuse("reshard-unsupported", "split_dims names no global tensor", tensor=name)
            if dim is not None and not -len(record.shape) <= dim < len(record.shape):
                _refuse("reshard-unsupported", f"split dimension {dim} is out of range for "
                        f"shape {list(record.shape)}", tensor=name)

    # --- the target layout -------------------------------------------------------------------

    def _regions(self, name: str, record: TensorRecord) -> _Regions:
        """(stage, expert rank) of the source -> what that group of ranks holds."""
        assert record.shape is not None
        ranks = self.manifest.ranks
        groups: dict[tuple[int, int], list[Piece]] = {}
        for piece in record.pieces:
            rank = ranks[piece.rank]
            groups.setdefault((rank.pp_rank, rank.ep_rank), []).append(piece)
        ndim = len(record.shape)
        regions = {}
        for key, pieces in sorted(groups.items()):
            offsets = [p.offset or (0,) * ndim for p in pieces]
            box = bounding([(o, p.shape) for o, p in zip(offsets, pieces, strict=True)])
            parted = parts_of(pieces, ndim) if name not in self._split_dims else None
            if parted is not None:
                regions[key] = Region(box, parted[0], parted[1])
                continue
            if name in self._split_dims:
                dim = self._split_dims[name]
                regions[key] = Region(box, None if dim is None else dim % ndim)
                continue
            dims = [d for d in range(ndim) if len({o[d] for o in offsets}) > 1]
            if len(dims) > 1:
                _refuse("reshard-unsupported", f"pipeline stage {key[0]}, expert rank {key[1]} "
                        f"splits the tensor along dimensions {dims}: not a tensor-parallel "
                        "split along one dimension", tensor=name)
            regions[key] = Region(box, dims[0] if dims else None)
        return regions

    def _target_boxes(self, name: str, record: TensorRecord) -> dict[int, tuple[Box, int]]:
        assert record.shape is not None
        regions = self._restaged(name, self._regions(name, record))
        if self._ep_changed:
            regions = self._regrouped(name, regions)
        if any(region.parts for region in regions.values()):
            self.parted[name] = self._part_boxes(name, record, regions)
            return {}
        dtype = DTYPES[record.dtype]
        boxes: dict[int, Box] = {}
        tp_size = self.layout.tp_size
        for (pp_rank, ep_rank), region in regions.items():
            runs = self._head_runs(name, record.shape, region)
            for tp_rank in range(tp_size):
                rank = self.layout.rank_of(tp_rank=tp_rank, pp_rank=pp_rank, ep_rank=ep_rank)
                boxes[rank] = self._slice(name, dtype.bits, region, tp_rank, runs)
        self._check_boxes(name, record, boxes.values())
        return numbered(boxes)

    # --- parts (rule 12) ---------------------------------------------------------------------

    def _part_boxes(self, name: str, record: TensorRecord, regions: _Regions
                    ) -> dict[int, tuple[tuple[Box, int], ...]]:
        """Target rank -> its slice of every part, in join order, with replica numbers; a
        rank's adjacent slices are one piece where no slice of its group is held twice."""
        assert record.shape is not None
        bits = DTYPES[record.dtype].bits
        held: dict[int, list[Box]] = {}
        for (pp_rank, ep_rank), region in regions.items():
            parts = region.parts or (region.box,)
            kinds = self._part_kinds(name, record.shape, region, len(parts))
            ranks = [self.layout.rank_of(tp_rank=t, pp_rank=pp_rank, ep_rank=ep_rank)
                     for t in range(self.layout.tp_size)]
            slices: list[list[Box]] = []
            for part, kind in zip(parts, kinds, strict=True):
                one = Region(part, region.dim)
                runs = self._head_runs(name, record.shape, one, kind)
                slices.append([self._slice(name, bits, one, t, runs)
                               for t in range(len(ranks))])
            repeated = any(len(set(boxes)) < len(boxes) for boxes in slices)
            for t, rank in enumerate(ranks):
                mine = [boxes[t] for boxes in slices]
                held[rank] = mine if repeated else merged(mine, region.dim)
        self._check_boxes(name, record, [box for boxes in held.values() for box in boxes])
        seen: dict[Box, int] = {}
        out: dict[int, tuple[tuple[Box, int], ...]] = {}
        for rank in sorted(held):  # replicas numbered in rank order (rule 6)
            numbered = []
            for box in held[rank]:
                numbered.append((box, seen.get(box, 0)))
                seen[box] = seen.get(box, 0) + 1
            out[rank] = tuple(numbered)
        return out

    def _part_kinds(self, name: str, shape: tuple[int, ...], region: Region, parts: int
                    ) -> tuple[Kind | None, ...]:
        """What each part holds along the split dim: a fused attention tensor cut in three
        parts holds query, then key, then value heads (rule 12); other parts: as named."""
        dim = region.dim
        kind = head_kind(name, dim, len(shape)) if dim is not None else None
        if kind == "fused" and parts == 3:
            return ("query", "kv", "kv")
        return (kind,) * parts

    def _restaged(self, name: str, regions: _Regions) -> _Regions:
        """The regions keyed by the target stage (rule 5); unchanged when pp_size is."""
        if not self._pp_changed:
            return regions
        by_expert: dict[int, Region] = {}
        for (pp_rank, ep_rank), region in regions.items():
            if by_expert.setdefault(ep_rank, region) != region:
                _refuse("reshard-unsupported", f"pipeline stages hold different slices of "
                        f"the tensor (stage {pp_rank}: offset {list(region.box[0])}, shape "
                        f"{list(region.box[1])}), so its stage under pp_size "
                        f"{self.layout.pp_size} is ambiguous", tensor=name)
        return {(stage, ep): region for ep, region in by_expert.items()
                for stage in sorted(self._stages[name])}

    # --- another ep_size (rule 10) -----------------------------------------------------------

    def _regrouped(self, name: str, regions: _Regions) -> _Regions:
        """(stage, source expert rank) -> region becomes (stage, target expert rank) -> region."""
        by_stage: dict[int, dict[int, Region]] = {}
        for (stage, ep_rank), region in regions.items():
            by_stage.setdefault(stage, {})[ep_rank] = region
        expert = self._experts.get(name)
        new_ep = self.layout.ep_size
        if expert is not None and expert.experts % new_ep:
            _refuse("reshard-unsupported", f"its layer has {expert.experts} routed experts, "
                    f"which cannot be dealt evenly to ep_size {new_ep} expert ranks",
                    tensor=name, hint="choose an ep_size that divides the number of experts")
        out: _Regions = {}
        for stage, held in sorted(by_stage.items()):
            if expert is None:
                region = self._one_region(name, stage, held, everywhere=True)
                out |= {(stage, ep_rank): region for ep_rank in range(new_ep)}
            elif expert.index is None:
                runs = self._expert_runs(name, expert, held)
                out |= {(stage, ep_rank): region for ep_rank, region in runs.items()}
            else:
                region = self._one_region(name, stage, held, everywhere=False)
                out[stage, expert_rank(expert.index, expert.experts, new_ep)] = region
        return out

    def _one_region(self, name: str, stage: int, held: Mapping[int, Region],
                    everywhere: bool) -> Region:
        """The region the source expert ranks of ``stage`` hold alike (rule 10 (a), (c)); a
        tensor of no expert must be held by all of them, since every new one holds it."""
        source_ep = self.manifest.layout.ep_size
        if everywhere and set(held) != set(range(source_ep)):
            _refuse("reshard-unsupported", f"pipeline stage {stage} holds it on expert ranks "
                    f"{sorted(held)} only, and it is no routed expert's tensor, so ep_size "
                    f"{self.layout.ep_size} cannot place it", tensor=name)
        regions = set(held.values())
        if len(regions) > 1:
            _refuse("reshard-unsupported", f"the expert ranks of pipeline stage {stage} hold "
                    f"different slices of it, so it cannot move to ep_size "
                    f"{self.layout.ep_size}", tensor=name)
        return regions.pop()

    def _expert_runs(self, name: str, expert: ExpertTensor, held: Mapping[int, Region]
                     ) -> dict[int, Region]:
        """Target expert rank -> its run of a stacked tensor's experts (rule 10 (b)), split
        along the dimension other than the experts' that the source groups split."""
        if any(r.parts for r in held.values()):
            _refuse("reshard-unsupported", "a stacked expert tensor cut in parts cannot move to "
                    f"ep_size {self.layout.ep_size} (SPEC 11.3 rule 12)", tensor=name)
        dims = {r.dim for r in held.values()} - {None, 0}
        if len(dims) > 1:
            _refuse("reshard-unsupported", f"its source expert ranks split it along different "
                    f"dimensions {sorted(dims, key=str)}", tensor=name)
        dim = dims.pop() if dims else None
        offset, shape = bounding([r.box for r in held.values()])
        run = expert.experts // self.layout.ep_size
        return {ep_rank: Region(((ep_rank * run, *offset[1:]), (run, *shape[1:])), dim)
                for ep_rank in range(self.layout.ep_size)}

    # --- tied tensors (rule 9) ---------------------------------------------------------------

    def _tied_targets(self, name: str, record: TensorRecord,
                      targets: Mapping[str, dict[int, tuple[Box, int]]]
                      ) -> dict[int, tuple[Box, int]]:
        """Where the base's target boxes put the tied tensor: the box of it that goes with
        each, so that every rank can still dequantize the base's piece it holds."""
        tie = record.tied_to
        assert tie is not None and record.shape is not None
        base = self.manifest.tensors.get(tie.tensor)
        if not isinstance(base, TensorRecord) or tie.tensor not in targets:
            _refuse("reshard-unsupported", f"tied to {tie.tensor!r}, which is no global tensor "
                    "without a tie of its own (SPEC 8.4 rule 1)", tensor=name)
        boxes: dict[int, Box] = {}
        for rank, (base_box, _) in targets[tie.tensor].items():
            box = tied_box(base, base_box, tie, record.shape)
            if isinstance(box, str):
                _refuse("reshard-unsupported", f"rank {rank} of the requested layout would hold "
                        f"{box}, which its tied tensor cannot follow (SPEC 8.4 rule 4)",
                        tensor=name, hint="choose a tp_size whose slices of the base fall on "
                        "block boundaries")
            boxes[rank] = box
        self._check_boxes(name, record, boxes.values())
        return numbered(boxes)

    def _head_runs(self, name: str, shape: tuple[int, ...], region: Region,
                   kind: Kind | None | str = "by name"
                   ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """Each tp rank's run of whole heads along the region's split dim (rule 11), from its
        start; ``kind``: what a part holds (rule 12), else the tensor's name says."""
        dim = region.dim
        if dim is None:
            return None
        try:
            if kind == "by name":
                if region.box[1][dim] != shape[dim]:
                    return None
                return head_slices(name, shape, dim, self.layout.tp_size, self._heads)
            if kind is None or self._heads is None or self.layout.tp_size == 1:
                return None
            starts, sizes = head_runs(kind, region.box[1][dim], self.layout.tp_size,  # type: ignore[arg-type]
                                      self._heads)
            return tuple(region.box[0][dim] + start for start in starts), sizes
        except HeadsError as exc:
            assert self._heads is not None
            _refuse("reshard-unsupported", f"{exc} (num_attention_heads {self._heads.num_heads}"
                    f", num_key_value_heads {self._heads.num_kv_heads} in config.json, tp_size "
                    f"{self.layout.tp_size})", tensor=name,
                    hint="choose a tp_size that deals whole attention heads to every rank")

    def _slice(self, name: str, bits: int, region: Region, tp_rank: int,
               runs: tuple[tuple[int, ...], tuple[int, ...]] | None = None) -> Box:
        offset, shape = region.box
        dim = region.dim
        if dim is None:
            return region.box
        if runs is not None:  # whole attention heads, from the start of the tensor or part
            start, length = runs[0][tp_rank], runs[1][tp_rank]
            return (tuple(start if d == dim else o for d, o in enumerate(offset)),
                    tuple(length if d == dim else s for d, s in enumerate(shape)))
        # A sub-byte dtype splits its last dimension in whole bytes (SPEC 6.5 rule 5).
        unit = 8 // math.gcd(bits, 8) if dim == len(shape) - 1 else 1
        if shape[dim] % unit:
            _refuse("reshard-unsupported", f"dimension {dim} ({shape[dim]} elements) cannot be "
                    f"split into whole bytes of {bits}-bit elements", tensor=name)
        start, length = slice_of(shape[dim], self.layout.tp_size, tp_rank, unit)
        new_offset = tuple(o + start if d == dim else o for d, o in enumerate(offset))
        new_shape = tuple(length if d == dim else s for d, s in enumerate(shape))
        return new_offset, new_shape

    def _check_boxes(self, name: str, record: TensorRecord, boxes: Iterable[Box]) -> None:
        assert record.shape is not None
        dtype = DTYPES[record.dtype]
        boxes = list(boxes)
        for _, shape in boxes:
            if byte_size(dtype, shape) is None:
                _refuse("reshard-unsupported", f"a target piece of shape {list(shape)} would "
                        f"not fill whole bytes of {record.dtype} (SPEC 6.5)", tensor=name)
        total = volume(record.shape)
        if total == 0:
            return
        distinct = sorted({b for b in boxes if volume(b[1])})
        if first_overlap(distinct) is not None or sum(volume(s) for _, s in distinct) != total:
            _refuse("reshard-unsupported", "the source's pipeline stages or expert ranks hold "
                    "slices that do not tile the tensor, so no target layout can be derived",
                    tensor=name)

    @staticmethod
    def _slots_of(record: TensorRecord) -> dict[Box, list[Piece]]:
        assert record.shape is not None
        ndim = len(record.shape)
        slots: dict[Box, list[Piece]] = {}
        for piece in sorted(record.pieces, key=lambda p: (p.replica, p.rank)):
            box = (piece.offset or (0,) * ndim, piece.shape)
            if piece.replica == 0 or box in slots:
                slots.setdefault(box, []).append(piece)
        return slots

    # --- one rank ----------------------------------------------------------------------------

    def plan(self, rank: int) -> ReshardPlan:
        """The pieces ``rank`` of the target layout holds and where each is read from."""
        size = self.layout.size
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
            _refuse("rank-out-of-range", f"rank {rank!r} is not in 0..{size - 1} (world size "
                    f"{size} of the requested layout)")
        manifest = self.manifest
        wanted: list[_Wanted] = []
        for name in manifest.tensors:
            held = self._held(name, rank)
            record = manifest.tensors[name]
            for box, replica in held:
                assert isinstance(record, TensorRecord)
                wanted.append((name, record, box, replica, self._needs(name, box)))
        chosen = self._choose_sources(rank, wanted)
        targets: dict[str, TargetPiece] = {}
        parts: dict[str, list[TargetPiece]] = {}
        for name, record, box, replica, needs in wanted:
            assert record.shape is not None
            sources = []
            for overlap, candidates in needs:
                piece = chosen[id(candidates)]
                sources.append(SourcePiece(
                    rank=piece.rank, file=piece.file,
                    piece_offset=piece.offset or (0,) * len(record.shape),
                    piece_shape=piece.shape, box_offset=overlap[0], box_shape=overlap[1]))
            target = TargetPiece(dtype=record.dtype, global_shape=record.shape, offset=box[0],
                                 shape=box[1], replica=replica, sources=tuple(sources))
            if len(self._held(name, rank)) > 1:
                parts.setdefault(name, []).append(target)
            else:
                targets[name] = target
        aliases = {name: r.alias_of for name, r in manifest.tensors.items()
                   if isinstance(r, Alias) and (r.alias_of in targets or r.alias_of in parts)}
        joined_along = {name: self._join_dim(held) for name, held in parts.items()}
        return ReshardPlan(rank, self.layout, targets, aliases,
                           {name: tuple(held) for name, held in parts.items()}, joined_along)

    def _held(self, name: str, rank: int) -> tuple[tuple[Box, int], ...]:
        """The (box, replica) of each piece of tensor ``name`` that ``rank`` holds."""
        if name in self.parted:
            return self.parted[name].get(rank, ())
        holders = self.targets.get(name, {})
        return (holders[rank],) if rank in holders else ()

    @staticmethod
    def _join_dim(pieces: list[TargetPiece]) -> int:
        """The one dimension in which the pieces' offsets differ (SPEC 7.2 rule 7)."""
        return next(d for d in range(len(pieces[0].offset))
                    if len({p.offset[d] for p in pieces}) > 1)

    def _needs(self, name: str, box: Box) -> list[tuple[Box, list[Piece]]]:
        """The part of each source slot inside ``box``, with the pieces that hold it."""
        needs: list[tuple[Box, list[Piece]]] = []
        if volume(box[1]):
            for slot, pieces in self._slots[name].items():
                overlap = intersect(slot, box)
                if overlap is not None and volume(overlap[1]):
                    needs.append((overlap, pieces))
            if sum(volume(o[1]) for o, _ in needs) != volume(box[1]):
                raise error_for(Finding(code="coverage-gap", tensor=name,
                                        message="the source pieces do not cover a target piece"))
        return needs

    def _choose_sources(self, rank: int, wanted: list[_Wanted]) -> dict[int, Piece]:
        """One piece per needed slot: a slot held once is read from there; a replicated slot
        from a rank already read from, else from the source rank of the same stage and expert
        rank, else the lowest rank, so that as few source files as possible are opened."""
        chosen: dict[int, Piece] = {}
        used: set[int] = set()
        multi: list[list[Piece]] = []
        for needs in _all_needs(wanted):
            if len(needs) == 1:
                chosen[id(needs)] = needs[0]
                used.add(needs[0].rank)
            else:
                multi.append(needs)
        coords = self.layout.coordinates(rank)
        ranks = self.manifest.ranks
        for needs in multi:
            reused = [p for p in needs if p.rank in used]
            same_group = [p for p in needs if (ranks[p.rank].pp_rank, ranks[p.rank].ep_rank)
                          == (coords["pp_rank"], coords["ep_rank"])]
            pick = min(reused or same_group or needs, key=lambda p: p.rank)
            chosen[id(needs)] = pick
            used.add(pick.rank)
        return chosen


def _all_needs(wanted: list[_Wanted]) -> Iterator[list[Piece]]:
    for *_, needs in wanted:
        for _, candidates in needs:
            yield candidates


def plan_reshard(
    manifest: Manifest,
    layout: Layout,
    rank: int,
    *,
    split_dims: Mapping[str, int | None] | None = None,
    heads: HeadCounts | None = None,
) -> ReshardPlan:
    """The plan of ``rank`` under ``layout`` (for many ranks, build one :class:`Resharder`)."""
    return Resharder(manifest, layout, split_dims=split_dims, heads=heads).plan(rank)


def target_pieces(manifest: Manifest, layout: Layout, rank: int) -> dict[str, TargetPiece]:
    """Name -> the piece ``rank`` holds under ``layout`` (aliases: see :func:`plan_reshard`)."""
    return plan_reshard(manifest, layout, rank).pieces
