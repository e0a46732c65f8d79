"""A recording (:mod:`.recorder`) and the manifest -> the reads that place a worker's bytes.

Each recorded copy takes a box of a global tensor (a product of ranges, as narrowing and
slicing make) into a region of a target. Against the manifest's pieces it becomes one
:class:`Read` per piece it overlaps: ``count`` runs of ``length`` bytes, ``src_stride`` apart
in the piece's data in its file and ``dst_stride`` apart in the target's storage (a column-
parallel weight is one run; a row-parallel one a run per row). The plan is pure data, so it is
cached (:mod:`.plan_cache`) and a second start skips the recording.

A plan is checked before it is kept: every target the loader reported loaded is written whole,
by reads and fills or by tensors left to the loader (``fallback``), and no two writes overlap
(reads run in parallel, in no order). A recording that fails these checks places nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...format.dtypes import DTYPES
from ...format.joins import Join
from ...format.manifest import Manifest, TensorRecord
from ...format.pieces import Piece
from .recorder import Copy, Fill, Recording, Region

__all__ = ["PLAN_VERSION", "PlacementPlan", "Read", "covering_box", "lower", "own_layout_plan",
           "source_box"]

#: Bumped when the meaning of a cached plan changes: older plans are then recorded again.
PLAN_VERSION = 1


@dataclass(frozen=True)
class Read:
    """``count`` runs of ``length`` bytes: the i-th from byte ``src + i * src_stride`` of
    ``tensor``'s data in ``file`` into byte ``dst + i * dst_stride`` of ``target``'s storage."""

    file: str
    tensor: str
    src: int
    src_stride: int
    target: str
    dst: int
    dst_stride: int
    length: int
    count: int

    @property
    def src_end(self) -> int:
        return self.src + (self.count - 1) * self.src_stride + self.length

    @property
    def dst_end(self) -> int:
        return self.dst + (self.count - 1) * self.dst_stride + self.length


@dataclass
class PlacementPlan:
    """Everything a worker reads straight into its model, and what its loader still does."""

    reads: list[Read] = field(default_factory=list)
    fills: list[Fill] = field(default_factory=list)
    #: checkpoint tensors handed to the model's loader as before, with the reason
    fallback: dict[str, str] = field(default_factory=dict)

    @property
    def files(self) -> list[str]:
        return sorted({r.file for r in self.reads})

    def to_dict(self) -> dict[str, Any]:
        return {"version": PLAN_VERSION,
                "reads": [[r.file, r.tensor, r.src, r.src_stride, r.target, r.dst, r.dst_stride,
                           r.length, r.count] for r in self.reads],
                "fills": [[f.target, f.dst.offset, list(f.dst.strides), list(f.dst.shape),
                           f.value] for f in self.fills],
                "fallback": self.fallback}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlacementPlan:
        """The plan ``to_dict`` wrote; KeyError, TypeError or ValueError for anything else."""
        if data["version"] != PLAN_VERSION:
            raise ValueError(f"plan version {data['version']!r}")
        reads = [Read(str(f), str(t), _count(s), _count(ss), str(g), _count(d), _count(ds),
                      _count(n), _count(c)) for f, t, s, ss, g, d, ds, n, c in data["reads"]]
        fills = [Fill(str(t), Region(_count(o), tuple(map(_count, st)), tuple(map(_count, sh))),
                      float(v)) for t, o, st, sh, v in data["fills"]]
        fallback = {str(k): str(v) for k, v in dict(data["fallback"]).items()}
        return cls(reads, fills, fallback)


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{value!r} is not a byte count")
    return value


def lower(recording: Recording, manifest: Manifest, targets: Mapping[str, torch.Tensor],
          ) -> PlacementPlan:
    """The plan of ``recording`` against ``manifest``'s pieces (see the module docstring).

    Raises :class:`PlacementError` where the recording cannot be replayed whole."""
    fallback = dict(recording.unplaceable)
    reads: list[Read] = []
    copies, superseded = _last_writes(recording.copies)
    records = {c.source: manifest.tensors[c.source] for c in recording.copies}
    replicated = {name for name, r in records.items()
                  if isinstance(r, TensorRecord) and any(p.replica for p in r.pieces)}
    files: set[str] = set()  # those read so far
    # Unreplicated tensors first: of a replicated region, the copy in a file read anyway.
    for copy in sorted(copies, key=lambda c: c.source in replicated):
        record = records[copy.source]
        assert isinstance(record, TensorRecord) and record.shape is not None
        lowered = _reads_of(copy, record, targets[copy.target], files)
        if isinstance(lowered, str):
            fallback.setdefault(copy.source, lowered)
        else:
            reads += lowered
            files.update(r.file for r in lowered)
    # A region written again by a tensor the loader writes for real is written after the
    # reads: so is the later write's tensor, in the loader's own order.
    for _ in superseded:
        for earlier, later in superseded:
            if earlier in fallback and later not in fallback:
                fallback[later] = f"writes a region {earlier!r} writes too, after it"
    # A tensor that one of its copies could not place goes to the loader whole.
    plan = PlacementPlan([r for r in reads if r.tensor not in fallback],
                         list(recording.fills), fallback)
    _check_writes(plan, recording, targets)
    return plan


def _last_writes(copies: list[Copy]) -> tuple[list[Copy], list[tuple[str, str]]]:
    """The copies whose region of their target no later copy writes again, and (earlier,
    later) source of each that one does. vLLM's loaders write some regions once per part of
    a fused layer (its one activation scale, from each of q, k and v): the model holds the
    last."""
    last = {(c.target, c.dst): i for i, c in enumerate(copies)}
    kept = [c for i, c in enumerate(copies) if last[c.target, c.dst] == i]
    superseded = [(c.source, copies[last[c.target, c.dst]].source)
                  for i, c in enumerate(copies) if last[c.target, c.dst] != i]
    return kept, superseded


class PlacementError(ValueError):
    """A recording whose writes do not replay to the loaded model (overlap, or a gap)."""


def own_layout_plan(files: Mapping[str, Iterable[str]], targets: Mapping[str, torch.Tensor],
                    joins: Mapping[str, Join] | None = None) -> PlacementPlan:
    """The plan of a checkpoint rank under the model's own names (file -> tensor names): each
    tensor read whole into the target of its name (same dtype and shape, checked by the
    caller). A tensor whose value on the rank joins several pieces (``joins``, SPEC 7.2
    rule 7) has each piece read from its file into its place in the target: along dim 0,
    consecutive rows, one contiguous read."""
    joins = joins or {}
    reads = []
    for file, names in files.items():
        for name in names:
            target = targets[name]
            size = target.element_size()
            base = int(target.storage_offset()) * size
            nbytes = target.numel() * size
            join = joins.get(name)
            if join is not None:
                reads += _join_reads(file, name, join, target)
            elif nbytes:
                reads.append(Read(file, name, 0, nbytes, name, base, nbytes, nbytes, 1))
    return PlacementPlan(reads)


def _join_reads(file: str, name: str, join: Join, target: torch.Tensor) -> list[Read]:
    """The read of the piece of ``join`` in ``file`` into its place in ``target`` (the join,
    contiguous): its run of every row above the join's dim, ``count`` runs (one where the join
    is along dim 0). In bytes, as the join lays them (SPEC 7.2 rule 7: each run whole bytes),
    whatever torch's shape of a sub-byte dtype."""
    start = 0
    for piece in join.pieces:  # in join order: each starts where the ones before end
        if piece.file == file:
            break
        start += piece.shape[join.dim]
    else:
        raise ValueError(f"tensor {name!r} has no piece of its join in {file!r}")
    elements = math.prod(join.shape)
    nbytes = target.numel() * target.element_size()
    if not elements or not nbytes or not piece.shape[join.dim]:
        return []
    inner_bits = math.prod(join.shape[join.dim + 1:]) * (nbytes * 8 // elements)
    length = piece.shape[join.dim] * inner_bits // 8
    base = int(target.storage_offset()) * target.element_size() + start * inner_bits // 8
    return [Read(file, name, 0, length, name, base, join.shape[join.dim] * inner_bits // 8,
                 length, math.prod(join.shape[:join.dim]))]


# --- one copy -> reads -----------------------------------------------------------------------

def _reads_of(copy: Copy, record: TensorRecord, target: torch.Tensor, prefer: set[str]
              ) -> list[Read] | str:
    """The reads of one copy, or why it cannot be read straight into its target."""
    assert record.shape is not None
    dtype = DTYPES[record.dtype]
    if dtype.torch_dtype is None or dtype.per_torch_element != 1:
        return f"its dtype {record.dtype} packs elements below a byte"
    size = dtype.torch_dtype.itemsize
    if target.element_size() != size:
        return "copied into a target of another element size"
    box = _as_box(copy.src, record.shape)
    if box is None:
        return "a region of it that is not a box of the tensor"
    start, dims = box  # dims: (global dim, extent, view dim) per view dim longer than one
    reads = []
    for piece in _one_replica(record, prefer):
        if piece.offset is None:
            return "rank-local"
        lo = [max(s, o) for s, o in zip(start, piece.offset, strict=True)]
        hi = [s + 1 for s in start]  # a unit extent, but along the box's dimensions
        for g, extent, _ in dims:
            hi[g] = start[g] + extent
        hi = [min(h, o + p) for h, o, p in zip(hi, piece.offset, piece.shape, strict=True)]
        if any(h <= low for low, h in zip(lo, hi, strict=True)):
            continue
        reads += _runs(copy, piece.file, record, piece.offset, piece.shape, start, dims, lo, hi,
                       size)
    return reads


def _one_replica(record: TensorRecord, prefer: set[str]) -> list[Piece]:
    """The pieces of ``record``, one of each set of replicas (one in a preferred file, else
    the first)."""
    chosen: dict[tuple[Any, ...], Piece] = {}
    for piece in record.pieces:
        key = (piece.offset, piece.shape)
        if key not in chosen or (piece.file in prefer and chosen[key].file not in prefer):
            chosen[key] = piece
    return list(chosen.values())


def source_box(region: Region, shape: tuple[int, ...]) -> tuple[tuple[int, ...],
                                                               tuple[int, ...]] | None:
    """``region`` of a contiguous tensor of ``shape`` as a box (start, extent per dimension),
    or None where it is no box."""
    box = _as_box(region, shape)
    if box is None:
        return None
    start, dims = box
    extent = [1] * len(shape)
    for g, n, _ in dims:
        extent[g] = n
    return tuple(start), tuple(extent)


def covering_box(region: Region, shape: tuple[int, ...]) -> tuple[tuple[int, ...],
                                                                  tuple[int, ...]]:
    """The smallest box of a contiguous tensor of ``shape`` that holds every element
    ``region`` views (where it is no box: from its first element to its last, whole along
    every dimension after the first one they differ in)."""
    box = source_box(region, shape)
    if box is not None:
        return box
    last = region.offset + sum((n - 1) * s for n, s in zip(region.shape, region.strides,
                                                          strict=True) if n)
    lo, hi = _index(region.offset, shape), _index(last, shape)
    start, extent = [], []
    for d, (a, b) in enumerate(zip(lo, hi, strict=True)):
        if a == b:
            start.append(a)
            extent.append(1)
            continue
        start += [min(a, b)] + [0] * (len(shape) - d - 1)
        extent += [abs(b - a) + 1] + list(shape[d + 1:])
        break
    return tuple(start), tuple(extent)


def _index(offset: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for d in range(len(shape)):
        stride = math.prod(shape[d + 1:])
        out.append(offset // stride if stride else 0)
        offset = offset % stride if stride else offset
    return out


def _as_box(region: Region, shape: tuple[int, ...]
            ) -> tuple[list[int], list[tuple[int, int, int]]] | None:
    """``region`` of a contiguous tensor of ``shape`` as a box: its start (a global index) and,
    for each view dimension longer than one, the global dimension it runs along (in order),
    its extent and its index in the view; None where it is no box (a transpose, a reshape)."""
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    start, rest = [], region.offset
    for stride in strides:
        start.append(rest // stride if stride else 0)
        rest = rest % stride if stride else rest
    dims: list[tuple[int, int, int]] = []
    last = -1
    for k, (stride, extent) in enumerate(zip(region.strides, region.shape, strict=True)):
        if extent == 1:
            continue
        g = next((d for d in range(last + 1, len(shape))
                  if strides[d] == stride and shape[d] > 1), None)
        if g is None or start[g] + extent > shape[g]:
            return None
        dims.append((g, extent, k))
        last = g
    return start, dims


def _runs(copy: Copy, file: str, record: TensorRecord, offset: tuple[int, ...],
          shape: tuple[int, ...], start: list[int], dims: list[tuple[int, int, int]],
          lo: list[int], hi: list[int], size: int) -> list[Read]:
    """The reads of the part ``lo``..``hi`` of the copy's box that one piece holds."""
    piece_strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    src0 = sum((low - o) * s for low, o, s in zip(lo, offset, piece_strides, strict=True))
    dst0 = copy.dst.offset + sum((lo[g] - start[g]) * copy.dst.strides[k] for g, _, k in dims)
    # (extent, source stride, destination stride) per dimension, outermost first; merged from
    # the innermost while both sides stay contiguous.
    axes = [(hi[g] - lo[g], piece_strides[g], copy.dst.strides[k]) for g, _, k in dims]
    length = 1
    while axes and axes[-1][1] == length and axes[-1][2] == length:
        length *= axes.pop()[0]
    if length == 1 and axes:  # no contiguous run at all: element by element, not a read
        return []
    reads = []
    count, src_stride, dst_stride = axes.pop() if axes else (1, length, length)
    for index in np.ndindex(*[a[0] for a in axes]):
        src = src0 + sum(i * a[1] for i, a in zip(index, axes, strict=True))
        dst = dst0 + sum(i * a[2] for i, a in zip(index, axes, strict=True))
        reads.append(Read(file, copy.source, src * size, src_stride * size, copy.target,
                          dst * size, dst_stride * size, length * size, count))
    return reads


# --- checks --------------------------------------------------------------------------------

def _check_writes(plan: PlacementPlan, recording: Recording,
                  targets: Mapping[str, torch.Tensor]) -> None:
    """Every loaded target written whole, no byte twice (see the module docstring)."""
    spans: dict[str, list[np.ndarray]] = {}
    writers: dict[str, list[str]] = {}
    for read in plan.reads:
        spans.setdefault(read.target, []).append(_read_spans(read))
        writers.setdefault(read.target, []).append(f"{read.tensor} ({read.file})")
    for fill in plan.fills:
        spans.setdefault(fill.target, []).append(_region_spans(fill.dst, targets[fill.target]))
        writers.setdefault(fill.target, []).append(f"a fill with {fill.value}")
    by_fallback = {c.target for c in recording.copies if c.source in plan.fallback}
    by_fallback |= recording.unplaced_targets
    for name, parts in spans.items():
        starts_ends = np.concatenate(parts)
        order = np.argsort(starts_ends[:, 0], kind="stable")
        starts, ends = starts_ends[order, 0], starts_ends[order, 1]
        if len(starts) > 1 and bool(np.any(starts[1:] < ends[:-1])):
            raise PlacementError(f"two writes into {name!r} overlap (of "
                                 f"{', '.join(writers[name])})")
        tensor = targets[name]
        if name in by_fallback:
            continue
        want = tensor.numel() * tensor.element_size()
        first = tensor.storage_offset() * tensor.element_size()
        if int((ends - starts).sum()) != want or starts[0] != first:
            raise PlacementError(f"{name!r} is not written whole by the recorded copies")
    loaded = recording.loaded if recording.loaded is not None else set(spans)
    for name in sorted(loaded):
        if name in targets and name not in spans and name not in by_fallback and \
                targets[name].numel():
            raise PlacementError(f"{name!r} is loaded, but no recorded copy writes it")


def _read_spans(read: Read) -> np.ndarray:
    if read.dst_stride == read.length or read.count == 1:
        return np.array([[read.dst, read.dst_end]], dtype=np.int64)
    starts = read.dst + np.arange(read.count, dtype=np.int64) * read.dst_stride
    return np.stack([starts, starts + read.length], axis=1)


def _region_spans(region: Region, tensor: torch.Tensor) -> np.ndarray:
    size = tensor.element_size()
    offsets = np.full(1, region.offset, dtype=np.int64)
    inner, merging = 1, True
    for stride, extent in reversed(list(zip(region.strides, region.shape, strict=True))):
        if merging and (stride == inner or extent == 1):
            inner *= extent
            continue
        merging = False
        offsets = (offsets[:, None] + np.arange(extent, dtype=np.int64) * stride).reshape(-1)
    starts = offsets * size
    return np.stack([starts, starts + inner * size], axis=1)
