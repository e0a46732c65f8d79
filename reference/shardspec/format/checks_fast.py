"""A fast verdict on the semantic rules of SPEC 3.5: "nothing to report", or "look closer".

:func:`is_sound` answers True only where :func:`shardspec.format.checks.check_manifest` finds
nothing; where it answers False, that function is run to say what is wrong. The per-piece rules
(rank in the layout, file owned by the rank, one piece per rank, whole bytes, bounds, coverage, no
overlap, replicas) are computed with numpy over flat arrays of every piece at once instead of one
Python object at a time: a manifest may hold a million pieces, and every rank checks all of them on
open (SPEC 11.1). The rules over ranks, files and tensor records, a few per tensor at most, and the
ties of SPEC 8.4, are the Python ones of :mod:`shardspec.format.checks`.

Arithmetic never wraps: every size is below 2**63 (the schema's limit) and fits an int64, bounds
are compared as ``shape <= total`` and ``offset <= total - shape``, and a product or a sum that
could pass 2**62 (guessed in float64) is redone exactly with Python ints, or left to the Python
rules of :mod:`shardspec.format.checks` for that tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, repeat
from operator import attrgetter

import numpy as np
import numpy.typing as npt

from .checks import _check_files, _check_layout, check_several_per_rank, tie_bases_of
from .dtypes import DTYPES, bit_count, byte_size, element_count
from .joins import allows_joins
from .limits import MAX_NAME_BYTES, MAX_SIZE
from .manifest import Alias, Manifest, Piece, TensorRecord
from .overlap import first_overlap
from .ties import check_ties

__all__ = ["is_sound"]

Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]

#: Below this a float64 estimate of a product or sum proves the exact value below 2**63.
_SAFE = float(2**62)


def is_sound(manifest: Manifest) -> bool:
    """True only where ``check_manifest(manifest)`` yields no finding at all.

    ``manifest`` must have passed the schema. False means that there may be a finding: the
    caller runs the Python rules to report it.
    """
    if next(_check_layout(manifest), None) is not None:
        return False
    if next(_check_files(manifest), None) is not None:
        return False
    tensors = manifest.tensors
    # 4 bytes a character at most: only long names need encoding to be measured.
    if any(len(name) * 4 > MAX_NAME_BYTES
           and len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES for name in tensors):
        return False
    aliases = [r for r in tensors.values() if isinstance(r, Alias)]
    if not all(isinstance(tensors.get(a.alias_of), TensorRecord) for a in aliases):
        return False
    records = [r for r in tensors.values() if isinstance(r, TensorRecord)]
    # Ties (SPEC 8.4) are one Python pass over the pieces of tied tensors and their bases.
    if any(r.tied_to is not None for r in records) and next(check_ties(manifest), None):
        return False
    # Tensors share shapes: each distinct one is counted once.
    shapes = {(r.dtype, r.shape) for r in records} | {
        (r.logical.dtype, r.logical.shape) for r in records if r.logical is not None}
    if any(bit_count(DTYPES[dtype], shape) is None for dtype, shape in shapes
           if shape is not None):
        return False
    # The per-piece rules judge a tensor by its dtype, shape and pieces alone: tensors that
    # share one tuple of pieces (equal texts do, see parse_fast) and agree on both are one case.
    # A tie's base and its tied tensors keep one piece per rank (SPEC 8.4): part of the key.
    tied = {id(r) for r in records if r.tied_to is not None} | {
        id(tensors.get(name)) for name in tie_bases_of(manifest)}
    records = list({(r.dtype, r.shape, id(r.pieces), id(r) in tied): r
                    for r in records}.values())
    # Global tensors first: their pieces, and only theirs, have offsets.
    records = [r for r in records if r.shape is not None] + [r for r in records
                                                             if r.shape is None]
    owner = {f.path: r.rank for r in manifest.ranks for f in r.files}
    return _Pieces(records, owner, len(manifest.ranks), [id(r) in tied for r in records],
                   allows_joins(manifest.format_version)).sound()


class _Pieces:
    """Every piece of ``records`` as flat arrays, and the rules over them.

    ``owner`` maps each rank's file to the rank (paths are unique once ``_check_files`` found
    nothing); ``ranks`` is the world size (the ranks are 0 to ranks - 1 once ``_check_layout``
    found nothing). Each rule fills in the columns the next ones read: ``rank`` first, then
    ``ndim`` and ``dims`` (every piece's shape, flattened).
    """

    rank: Ints
    ndim: Ints
    dims: Ints

    def __init__(self, records: list[TensorRecord], owner: dict[str, int], ranks: int,
                 tied: list[bool], joins: bool = True) -> None:
        self.records = records
        #: Whether the manifest's version lets a rank join pieces (SPEC 4.2 rule 4).
        self.joins = joins
        #: Whether each record is tied or a tie's base (its pieces then never join).
        self.tied = tied
        self.owner = owner
        self.ranks = ranks
        self.pieces: list[Piece] = list(chain.from_iterable(r.pieces for r in records))
        counts = np.fromiter(map(len, (r.pieces for r in records)), np.int64, len(records))
        #: Index into ``records`` of every piece.
        self.tensor: Ints = np.repeat(np.arange(len(records), dtype=np.int64), counts)
        #: Where each tensor's pieces start in the flat order.
        self.first: Ints = np.concatenate(([0], np.cumsum(counts)))
        self.globals = sum(1 for r in records if r.shape is not None)
        self.global_pieces = int(self.first[self.globals])

    def sound(self) -> bool:
        return (self._ranks_and_files() and self._several_per_rank_join()
                and self._whole_bytes() and self._global_pieces())

    def _ints(self, field: str, pieces: Sequence[Piece] | None = None) -> Ints:
        pieces = self.pieces if pieces is None else pieces
        return np.fromiter(map(attrgetter(field), pieces), np.int64, len(pieces))

    def _ranks_and_files(self) -> bool:
        """SPEC 5.3, 6.1: each piece's rank is in the layout and owns the piece's file."""
        self.rank = self._ints("rank")
        files = map(attrgetter("file"), self.pieces)
        owners = np.fromiter(map(self.owner.get, files, repeat(-1)), np.int64, len(self.pieces))
        return bool(np.all(self.rank < self.ranks)) and bool(np.array_equal(owners, self.rank))

    def _several_per_rank_join(self) -> bool:
        """SPEC 7.2 rules 3, 7: where a rank holds two pieces of one tensor, they join."""
        key = self.tensor * self.ranks + self.rank
        if len(key) < 2 or bool(np.all(key[1:] > key[:-1])):  # pieces are usually in rank order
            return True
        key = np.sort(key)
        repeated = np.unique(key[1:][key[1:] == key[:-1]] // self.ranks)
        # Few tensors (fused projections, a rank's several DCP chunks): the Python rule on each.
        return not any(next(check_several_per_rank("", self.records[int(t)], self.tied[int(t)],
                                                   self.joins), None) for t in repeated)

    def _whole_bytes(self) -> bool:
        """SPEC 6.5, 12: each piece fills whole bytes, fewer than 2**63."""
        shapes = list(map(attrgetter("shape"), self.pieces))
        self.ndim = np.fromiter(map(len, shapes), np.int64, len(shapes))
        self.dims = np.fromiter(chain.from_iterable(shapes), np.int64, int(self.ndim.sum()))
        count, exact = _products(self.dims, self.ndim)
        bits = np.array([DTYPES[r.dtype].bits for r in self.records], dtype=np.int64)[self.tensor]
        fits = (count <= MAX_SIZE // bits) & ((count % 8) * bits % 8 == 0)
        for i in np.flatnonzero(~exact).tolist():  # a dimension near 2**63: Python decides
            record = self.records[self.tensor[i]]
            fits[i] = byte_size(DTYPES[record.dtype], self.pieces[i].shape) is not None
        return bool(np.all(fits))

    def _global_pieces(self) -> bool:
        """SPEC 7.2-7.4 for the global tensors: bounds, replicas, no overlap, full coverage."""
        n = self.global_pieces
        if n == 0:
            return True
        pieces = self.pieces[:n]
        ndim = self.ndim[:n]
        tensor_ndim = np.array([len(r.shape or ()) for r in self.records[: self.globals]],
                               dtype=np.int64)
        offsets = list(map(attrgetter("offset"), pieces))
        if None in offsets:  # not after the schema; the Python rules know what it means
            return False
        if not (np.array_equal(ndim, tensor_ndim[self.tensor[:n]])
                and np.array_equal(np.fromiter(map(len, offsets), np.int64, n), ndim)):
            return False
        # Offsets and shapes now have the same lengths: one flat index serves both.
        offset_dims = np.fromiter(chain.from_iterable(offsets), np.int64, int(ndim.sum()))
        start = np.cumsum(ndim) - ndim
        replica = self._ints("replica", pieces)
        # Distinct values with bincount: np.unique's first call imports np.ma (5 ms).
        for d in np.flatnonzero(np.bincount(tensor_ndim)).tolist():
            rows = np.flatnonzero(ndim == d)
            columns = start[rows][:, None] + np.arange(d, dtype=np.int64)
            group = _Group(self, d, self.tensor[rows], offset_dims[columns],
                           self.dims[columns], replica[rows])
            if not group.sound():
                return False
        return True


class _Group:
    """The global pieces of ``d``-dimensional tensors: n x d matrices of offsets and shapes.

    Rows are in manifest order, so each tensor's pieces are contiguous, tensors ascending.
    """

    def __init__(self, pieces: _Pieces, d: int, tensor: Ints, offset: Ints, shape: Ints,
                 replica: Ints) -> None:
        self.records = pieces.records
        self.d = d
        self.tensor, self.offset, self.shape, self.replica = tensor, offset, shape, replica
        #: The tensors of the group, where each one's rows start, and each row's tensor in it.
        self.first, self.index = _segments(tensor)
        self.tensors = tensor[self.first]
        index = self.index
        #: Each tensor's shape and element count (below 2**63: is_sound checked).
        shapes = [self.records[t].shape or () for t in self.tensors.tolist()]
        self.total = np.array(shapes, dtype=np.int64).reshape(len(shapes), d)[index]
        self.volume = [element_count(s) or 0 for s in shapes]

    def sound(self) -> bool:
        return self._in_bounds() and self._replicas_copy_primaries() and self._covered_once()

    def _in_bounds(self) -> bool:
        """SPEC 7.2: offset + shape <= the tensor's shape, compared without adding."""
        return bool(np.all(self.shape <= self.total)
                    and np.all(self.offset <= self.total - self.shape))

    def _replicas_copy_primaries(self) -> bool:
        """SPEC 7.4: each replica's box is the box of a replica-0 piece of its tensor.

        Boxes are matched by a 64-bit hash, then compared exactly; a replica without a match
        is looked at again in Python with its tensor's whole set of boxes, so a collision costs
        time, never a wrong answer.
        """
        copies = self.replica != 0
        if not np.any(copies):
            return True
        box = np.concatenate((self.tensor[:, None], self.offset, self.shape), axis=1)
        hashed = _row_hash(box)
        primary = np.flatnonzero(~copies)
        order = primary[np.argsort(hashed[primary], kind="stable")]
        wanted = np.flatnonzero(copies)
        if len(order) == 0:
            return False
        at = np.minimum(np.searchsorted(hashed[order], hashed[wanted]), len(order) - 1)
        found = np.all(box[order[at]] == box[wanted], axis=1)
        for t in np.flatnonzero(np.bincount(self.tensor[wanted[~found]])).tolist():
            record = self.records[t]
            boxes = {(p.offset, p.shape) for p in record.pieces if p.replica == 0}
            if any((p.offset, p.shape) not in boxes for p in record.pieces if p.replica):
                return False
        return True

    def _covered_once(self) -> bool:
        """SPEC 7.3: the replica-0 pieces of a non-empty tensor cover it, no element twice."""
        volume = np.array(self.volume, dtype=np.int64)
        index = self.index
        # In bounds of a non-empty tensor every partial product of a piece's dimensions is at
        # most the tensor's, so below 2**63. Other rows' products may wrap: they are unused.
        solid = (volume[index] > 0) & (self.replica == 0) & np.all(self.shape > 0, axis=1)
        sizes = np.where(solid, np.prod(self.shape, axis=1, dtype=np.int64), 0)
        covered = np.add.reduceat(sizes, self.first)
        estimate = np.add.reduceat(sizes.astype(np.float64), self.first)
        exact = estimate < _SAFE
        if not np.array_equal(covered[exact], volume[exact]):
            return False
        ends = np.append(self.first[1:], len(sizes))
        for k in np.flatnonzero(~exact).tolist():  # the sum may pass 2**63: add exactly
            if sum(sizes[self.first[k] : ends[k]].tolist()) != self.volume[k]:
                return False
        keep = np.flatnonzero(solid)
        return _no_overlap(self.tensor[keep], self.offset[keep], self.shape[keep])


def _no_overlap(tensor: Ints, offset: Ints, shape: Ints) -> bool:
    """No two boxes of one tensor share an element (boxes of non-zero size, grouped by tensor).

    The usual split has the boxes of a tensor differ along one dimension only: they then
    overlap exactly where their intervals along it do, which sorting finds. A tensor split
    along several dimensions is swept by the Python rule of :mod:`shardspec.format.checks`.
    """
    if len(tensor) < 2:
        return True
    first, segment = _segments(tensor)
    d = shape.shape[1]
    if d == 0:  # scalars: two boxes of one are the same element
        return len(first) == len(tensor)
    boxes = np.concatenate((offset, shape), axis=1)
    varies = np.minimum.reduceat(boxes, first) != np.maximum.reduceat(boxes, first)
    varies = varies.reshape(len(first), 2, d).any(axis=1)
    count = varies.sum(axis=1)
    along = np.argmax(varies, axis=1)[segment][:, None]  # the dimension that varies (or 0)
    start = np.take_along_axis(offset, along, 1)[:, 0]
    end = start + np.take_along_axis(shape, along, 1)[:, 0]  # <= the tensor's size: no wrap
    same = segment[1:] == segment[:-1]
    if not np.all(~same | (start[1:] >= start[:-1])):  # written in order, usually: no sort
        order = np.lexsort((start, segment))
        start, end, segment = start[order], end[order], segment[order]
    simple = count[segment[1:]] <= 1
    if np.any(same & simple & (start[1:] < end[:-1])):
        return False
    ends = np.append(first[1:], len(tensor))
    for k in np.flatnonzero(count > 1).tolist():
        sweep = [(tuple(offset[i].tolist()), tuple(shape[i].tolist()))
                 for i in range(first[k], ends[k])]
        if first_overlap(sweep) is not None:
            return False
    return True


def _segments(tensor: Ints) -> tuple[Ints, Ints]:
    """Where each run of equal values of ``tensor`` starts, and each row's run number."""
    new = np.empty(len(tensor), dtype=np.bool_)
    new[:1] = True
    np.not_equal(tensor[1:], tensor[:-1], out=new[1:])
    return np.flatnonzero(new), np.cumsum(new) - 1


def _products(dims: Ints, ndim: Ints) -> tuple[Ints, Bools]:
    """Each piece's element count, and whether it is exact (no running product passed 2**62).

    A running product is at most the product of the nonzero dimensions, whose float64 estimate
    decides; where it is not exact, :func:`shardspec.format.dtypes.byte_size` decides in Python.
    """
    count = np.ones(len(ndim), dtype=np.int64)
    exact = np.ones(len(ndim), dtype=np.bool_)
    some = np.flatnonzero(ndim > 0)
    if len(some) == 0:
        return count, exact
    start = (np.cumsum(ndim) - ndim)[some]
    with np.errstate(over="ignore"):  # an estimate may reach inf; a wrapped count is unused
        estimate = np.multiply.reduceat(np.where(dims == 0, 1, dims).astype(np.float64), start)
        count[some] = np.multiply.reduceat(dims, start)
    exact[some] = estimate < _SAFE
    count[~exact] = 0
    return count, exact


_MIX = np.uint64(0x9E3779B97F4A7C15)


def _row_hash(rows: Ints) -> npt.NDArray[np.uint64]:
    """A 64-bit hash of each row (equal rows, equal hashes; wrapping arithmetic)."""
    hashed = np.zeros(len(rows), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for column in rows.T.view(np.uint64):
            hashed = (hashed ^ column) * _MIX
            hashed ^= hashed >> np.uint64(29)
    return hashed
