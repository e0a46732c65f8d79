"""Tied tensors (SPEC 8.4): which block of its base's grid each piece of a scale, zero point or
group index holds.

A quantizer output T (``weight_scale_inv``, ``scales``, ``qzeros``...) describes blocks of the
elements of a base tensor W. The *grid* is W's logical shape (W's shape when it has no
``logical``); W itself may pack ``L[d] / W.shape[d]`` grid elements into one stored element
along dim d (an int4 ``qweight`` in I32 packs 8). Dim j of T follows grid dim ``axes[j]``, each
element spanning ``block[j]`` grid elements; dims of T past ``len(block)`` are *inner* dims,
never split. So a piece of W held by a rank fixes the piece of T that rank holds, and a piece of
W that ends inside a block of T is a split no quantized kernel can use.

Pure functions over manifest records, used by the validator (:func:`check_ties`), the
converter and the resharder (:func:`tied_box`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

from .errors import Finding
from .manifest import Alias, Manifest, Piece, TensorRecord, Tie

__all__ = ["Box", "check_ties", "grid_of", "packing", "tie_problem", "tied_box"]

#: (offset, shape) of a rectangular slice, in elements.
Box = tuple[tuple[int, ...], tuple[int, ...]]


def grid_of(base: TensorRecord) -> tuple[int, ...]:
    """The base's grid: its logical shape, else its shape."""
    if base.logical is not None:
        return base.logical.shape
    assert base.shape is not None
    return base.shape


def packing(base: TensorRecord) -> tuple[int, ...] | None:
    """Grid elements per stored element of the base along each grid dim; None where the grid
    and the shape do not agree (SPEC 8.4 rule 2)."""
    assert base.shape is not None
    grid = grid_of(base)
    if len(base.shape) < len(grid):
        return None
    out = []
    for stored, logical in zip(base.shape, grid, strict=False):
        if stored == 0 or logical == 0:
            if stored != logical:
                return None
            out.append(1)
        elif logical % stored:
            return None
        else:
            out.append(logical // stored)
    return tuple(out)


def _axes(tie: Tie) -> tuple[int, ...]:
    assert tie.block is not None
    return tie.axes if tie.axes is not None else tuple(range(len(tie.block)))


def tie_problem(name: str, record: TensorRecord, tensors: Mapping[str, object]
                ) -> Finding | None:
    """The first rule of SPEC 8.4 rules 1-3 that ``record``'s tie breaks, if any."""
    tie = record.tied_to
    assert tie is not None and record.shape is not None
    where = f"$.tensors[{name!r}].tied_to"
    base = tensors.get(tie.tensor)
    if tie.tensor == name or not isinstance(base, TensorRecord) or base.rank_local \
            or base.tied_to is not None:
        what = ("itself" if tie.tensor == name else "an alias" if isinstance(base, Alias)
                else "not a tensor of the manifest" if base is None
                else "rank-local" if isinstance(base, TensorRecord) and base.rank_local
                else "itself tied to another tensor")
        return Finding(code="tie-target", tensor=name, json_path=where + ".tensor",
                       message=f"tied_to {tie.tensor!r}, which is {what}",
                       hint="a tie names a global tensor that has no tie of its own")
    grid = grid_of(base)
    if packing(base) is None:
        return Finding(code="tie-shape", tensor=name, json_path=where,
                       message=f"the base {tie.tensor!r} has shape {list(base.shape or ())} and "
                       f"grid (logical shape) {list(grid)}: each of its first {len(grid)} "
                       "dimensions must divide the grid's")
    if tie.block is None:
        if math.prod(record.shape) != 1:
            return Finding(code="tie-shape", tensor=name, json_path=where,
                           message=f"a tie without block is one value for the whole base, but "
                           f"the shape is {list(record.shape)}")
        return None
    axes = _axes(tie)
    if len(axes) != len(tie.block) or len(set(axes)) != len(axes) \
            or any(a >= len(grid) for a in axes):
        return Finding(code="tie-shape", tensor=name, json_path=where,
                       message=f"axes {list(axes)} must be {len(tie.block)} distinct dimensions "
                       f"of the base's grid {list(grid)}, one for each block size")
    if len(record.shape) < len(axes):
        return Finding(code="tie-shape", tensor=name, json_path=where,
                       message=f"shape {list(record.shape)} has fewer dimensions than block "
                       f"{list(tie.block)}")
    for j, (axis, size) in enumerate(zip(axes, tie.block, strict=True)):
        want = -(-grid[axis] // size)
        if record.shape[j] != want:
            return Finding(code="tie-shape", tensor=name, json_path=where,
                           message=f"dim {j} has {record.shape[j]} elements, but blocks of "
                           f"{size} over the base's grid dim {axis} ({grid[axis]}) make {want}")
    return None


def tied_box(base: TensorRecord, base_box: Box, tie: Tie, shape: tuple[int, ...]
             ) -> Box | str:
    """The box of the tied tensor (of ``shape``) that goes with the base's piece ``base_box``
    (stored coordinates), or why there is none: the piece ends inside a block (SPEC 8.4 rule 4).
    The tie must have passed :func:`tie_problem`."""
    assert base.shape is not None
    grid = grid_of(base)
    pack = packing(base)
    assert pack is not None
    offset, size = base_box
    for d in range(len(grid), len(base.shape)):
        if offset[d] != 0 or size[d] != base.shape[d]:
            return (f"the piece of {tie.tensor!r} at offset {list(offset)} splits its inner "
                    f"dim {d} (a pack of grid elements)")
    if tie.block is None:
        return (0,) * len(shape), shape
    out_offset = [0] * len(shape)
    out_shape = list(shape)
    for j, (axis, block) in enumerate(zip(_axes(tie), tie.block, strict=True)):
        lo, hi = offset[axis] * pack[axis], (offset[axis] + size[axis]) * pack[axis]
        if lo % block or (hi % block and hi != grid[axis]):
            edge = lo if lo % block else hi
            return (f"the piece of {tie.tensor!r} at offset {list(offset)}, shape {list(size)} "
                    f"has an edge at element {edge} of grid dim {axis}, inside a block of "
                    f"{block}")
        out_offset[j] = lo // block
        out_shape[j] = -(-hi // block) - lo // block
    return tuple(out_offset), tuple(out_shape)


def check_ties(manifest: Manifest) -> Iterator[Finding]:
    """SPEC 8.4: every tie names a usable base, has the shape its blocks give, and each rank's
    piece of a tied tensor is the block-aligned one its piece of the base fixes."""
    tensors = manifest.tensors
    # Experts repeat the same shapes and splits thousands of times: each distinct case of
    # (base shape, grid, base piece, blocks, tied shape) is computed once.
    cache: dict[tuple[object, ...], Box | str] = {}
    for name, record in tensors.items():
        if not isinstance(record, TensorRecord) or record.tied_to is None \
                or record.shape is None:
            continue
        problem = tie_problem(name, record, tensors)
        if problem is not None:
            yield problem
            continue
        finding = _placement_problem(name, record, tensors[record.tied_to.tensor], cache)
        if finding is not None:
            yield finding


def _placement_problem(name: str, record: TensorRecord, base: object,
                       cache: dict[tuple[object, ...], Box | str]) -> Finding | None:
    assert isinstance(base, TensorRecord) and record.tied_to is not None
    assert record.shape is not None
    tie = record.tied_to
    mine: dict[int, Piece] = {p.rank: p for p in record.pieces}
    theirs: dict[int, Piece] = {p.rank: p for p in base.pieces}
    if mine.keys() != theirs.keys():
        extra = sorted(mine.keys() - theirs.keys())
        lacking = sorted(theirs.keys() - mine.keys())
        detail = (f"ranks {extra} hold it without a piece of the base" if extra
                  else f"ranks {lacking} hold a piece of the base but none of it")
        return Finding(code="tie-split", tensor=name,
                       message=f"tied to {tie.tensor!r}: {detail}",
                       hint="a tied tensor is held exactly where its base is (SPEC 8.4)")
    assert base.shape is not None
    ndim = len(base.shape)
    if any(len(p.offset or ()) != ndim or len(p.shape) != ndim
           or any(o + n > t for o, n, t in zip(p.offset or (), p.shape, base.shape, strict=True))
           for p in base.pieces):
        return None  # a piece outside its base is piece-bounds (7.2), found by _check_tensors
    for rank, piece in theirs.items():
        base_box = (piece.offset or (0,) * ndim, piece.shape)
        key = (base.shape, base.logical, base_box, tie.block, tie.axes, record.shape)
        box = cache.get(key)
        if box is None:
            box = cache[key] = tied_box(base, base_box, tie, record.shape)
        if isinstance(box, str):  # the message names this tensor's base, not a cached one's
            box = tied_box(base, base_box, tie, record.shape)
        if isinstance(box, str):
            return Finding(code="tie-split", tensor=name,
                           message=f"rank {rank}: {box} of {name!r}")
        held = mine[rank]
        if (held.offset or (0,) * len(record.shape), held.shape) != box:
            return Finding(code="tie-split", tensor=name,
                           message=f"rank {rank} holds offset {list(held.offset or ())}, shape "
                           f"{list(held.shape)}, but its piece of {tie.tensor!r} needs offset "
                           f"{list(box[0])}, shape {list(box[1])}")
    return None
