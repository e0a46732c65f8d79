"""Resharding, the geometry of boxes: slices, overlaps, bounding boxes, replica numbers, and a
source group's region and parts (SPEC 11.3 rules 3, 4, 6 and 12). Pure functions of offsets
and shapes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..format.manifest import Piece
from .targets import Box

__all__ = ["Region", "bounding", "intersect", "merged", "numbered", "parts_of", "slice_of",
           "volume"]


def volume(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def slice_of(size: int, parts: int, index: int, unit: int = 1) -> tuple[int, int]:
    """(start, length) of part ``index`` of ``range(size)`` split ``torch.tensor_split``-style
    into ``parts``, in steps of ``unit`` elements (``size`` must be a multiple of ``unit``)."""
    units = size // unit
    base, extra = divmod(units, parts)
    start = index * base + min(index, extra)
    length = base + (1 if index < extra else 0)
    return start * unit, length * unit


def intersect(a: Box, b: Box) -> Box | None:
    """The overlap of two boxes, None when it holds no element (a scalar always overlaps)."""
    offset, shape = [], []
    for ao, as_, bo, bs in zip(a[0], a[1], b[0], b[1], strict=True):
        lo, hi = max(ao, bo), min(ao + as_, bo + bs)
        if hi <= lo:
            return None
        offset.append(lo)
        shape.append(hi - lo)
    return tuple(offset), tuple(shape)


def bounding(boxes: list[Box]) -> Box:
    """The smallest box holding all of ``boxes`` (at least one, all of one rank)."""
    ndim = len(boxes[0][0])
    lo = tuple(min(b[0][d] for b in boxes) for d in range(ndim))
    hi = tuple(max(b[0][d] + b[1][d] for b in boxes) for d in range(ndim))
    return lo, tuple(h - low for h, low in zip(hi, lo, strict=True))


def merged(boxes: list[Box], dim: int | None) -> list[Box]:
    """A rank's slices of the parts with each run of adjacent ones along ``dim`` (each ending
    where the next begins) made one box (SPEC 11.3 rule 12)."""
    out = [boxes[0]]
    for box in boxes[1:]:
        last = out[-1]
        if dim is not None and last[0][dim] + last[1][dim] == box[0][dim]:
            shape = tuple(a + b if d == dim else a
                          for d, (a, b) in enumerate(zip(last[1], box[1], strict=True)))
            out[-1] = (last[0], shape)
        else:
            out.append(box)
    return out


def numbered(boxes: Mapping[int, Box]) -> dict[int, tuple[Box, int]]:
    """rank -> (box, replica): equal boxes are replicas 0, 1, ... in rank order (rule 6)."""
    replica_of: dict[Box, int] = {}
    out: dict[int, tuple[Box, int]] = {}
    for rank in sorted(boxes):
        box = boxes[rank]
        replica = replica_of.get(box, 0)
        replica_of[box] = replica + 1
        out[rank] = (box, replica)
    return out


@dataclass(frozen=True)
class Region:
    """What one (stage, expert rank) group of source ranks holds of a tensor; ``parts``: the
    regions of its parts, in order along ``dim``, where the group holds it cut in parts."""

    box: Box
    dim: int | None
    parts: tuple[Box, ...] = ()


def parts_of(pieces: list[Piece], ndim: int) -> tuple[int, tuple[Box, ...]] | None:
    """(join dim, part regions) where every rank of a group holds m >= 2 pieces whose j-th ones
    make up part j, the parts following one another along the join dim, each spanning the
    group's region in the other dims (SPEC 11.3 rule 12); None otherwise."""
    by_rank: dict[int, list[Piece]] = {}
    for piece in pieces:
        by_rank.setdefault(piece.rank, []).append(piece)
    counts = {len(held) for held in by_rank.values()}
    if len(counts) != 1 or counts == {1} or ndim == 0:
        return None
    offsets = {id(p): p.offset or (0,) * ndim for p in pieces}
    dims = {d for held in by_rank.values() for d in range(ndim)
            if len({offsets[id(p)][d] for p in held}) > 1}
    if len(dims) != 1:
        return None
    dim = dims.pop()
    ordered = [sorted(held, key=lambda p: offsets[id(p)][dim]) for held in by_rank.values()]
    parts = tuple(bounding([(offsets[id(held[j])], held[j].shape) for held in ordered])
                  for j in range(counts.pop()))
    region = bounding([(offsets[id(p)], p.shape) for p in pieces])
    if any(a[0][dim] + a[1][dim] > b[0][dim] for a, b in zip(parts, parts[1:], strict=False)):
        return None
    if any(part[0][e] != region[0][e] or part[1][e] != region[1][e]
           for part in parts for e in range(ndim) if e != dim):
        return None
    return dim, parts
