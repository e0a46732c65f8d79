"""Where a rank's tensor sits in its global tensor: one :class:`Shard`, or several joined.

Since format 1.3 a rank may hold several pieces of one tensor (SPEC 7.2 rules 3, 7): its value is
their join, the pieces one after the other along one dimension. A writer is handed that value
and one Shard per piece; each piece is then a narrow of the value, written in a file of its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..format.dtypes import DTYPES, torch_layout
from ..format.joins import Join, join_of
from ..format.manifest import Manifest, Piece, TensorRecord

__all__ = ["Cut", "Shard", "file_entries", "piece_of_value", "shards_of"]


@dataclass(frozen=True)
class Shard:
    """Where a rank's tensor sits in its global tensor, in elements (SPEC 7.2).

    ``replica`` numbers identical copies of one slice (0 for the primary, SPEC 7.4). ``shape`` is
    the piece's shape where the rank's tensor joins several pieces (SPEC 7.2 rule 7); one Shard
    alone describes the whole tensor and needs none.
    """

    global_shape: tuple[int, ...]
    offset: tuple[int, ...]
    replica: int = 0
    shape: tuple[int, ...] | None = None


#: The piece a file holds of a rank's value: (dimension, start, length, the value's shape in
#: elements) to narrow the value by, or None for the whole value.
Cut = tuple[int, int, int, tuple[int, ...]] | None


def piece_of_value(value: torch.Tensor, dtype: str, cut: Cut) -> torch.Tensor:
    """The piece ``cut`` names of a rank's ``value`` (``cut`` None: the value itself). A
    sub-byte dtype is cut as bytes: each run of the piece is whole bytes (SPEC 7.2 rule 7), but
    torch's shape of such a tensor need not follow its elements (F6 is flat bytes)."""
    if cut is None:
        return value
    dim, start, length, shape = cut
    spec = DTYPES[dtype]
    if spec.bits >= 8:
        return value.narrow(dim, start, length)
    torch_dtype, torch_shape = torch_layout(spec, (*shape[:dim], length, *shape[dim + 1:]))
    if not math.prod(shape):  # no elements (SPEC 7.7): no rows of bytes to cut
        return torch.empty(torch_shape, dtype=torch_dtype, device=value.device)
    inner = math.prod(shape[dim + 1:]) * spec.bits
    rows = value.contiguous().reshape(-1).view(torch.uint8).reshape(math.prod(shape[:dim]), -1)
    piece = rows[:, start * inner // 8:(start + length) * inner // 8]
    return piece.contiguous().reshape(-1).view(torch_dtype).reshape(torch_shape)


def shards_of(name: str, rank: int, given: Shard | Sequence[Shard], shape: tuple[int, ...]
              ) -> tuple[Shard, ...]:
    """``given`` as a tuple of Shards with their pieces' shapes, checked to join to ``shape``."""
    if isinstance(given, Shard):
        return (Shard(tuple(given.global_shape), tuple(given.offset), given.replica, shape),)
    shards = tuple(Shard(tuple(s.global_shape), tuple(s.offset), s.replica,
                         None if s.shape is None else tuple(s.shape)) for s in given)
    if len(shards) == 1 and shards[0].shape in (None, shape):
        return (Shard(shards[0].global_shape, shards[0].offset, shards[0].replica, shape),)
    where = f"rank {rank}, tensor {name!r}"
    if not shards:
        raise ValueError(f"{where}: an empty list of Shards")
    if any(s.shape is None for s in shards):
        raise ValueError(f"{where}: each of several Shards needs the shape of its piece")
    pieces = [Piece(rank=rank, file=str(i), shape=s.shape, offset=s.offset)  # type: ignore[arg-type]
              for i, s in enumerate(shards)]
    join = join_of(pieces)
    if isinstance(join, str):
        raise ValueError(f"{where}: its {len(shards)} Shards cannot be joined (SPEC 7.2 rule 7): "
                         f"{join}")
    if join.shape != shape:
        raise ValueError(f"{where}: its Shards join to shape {list(join.shape)}, but the tensor "
                         f"has shape {list(shape)}")
    return shards


def file_entries(draft: Manifest, rank: int) -> dict[str, list[tuple[str, Cut]]]:
    """Each of ``rank``'s files -> the tensors it holds and the cut of each rank's value."""
    entries: dict[str, list[tuple[str, Cut]]] = {f.path: [] for f in draft.ranks[rank].files}
    for name, record in draft.tensors.items():
        if not isinstance(record, TensorRecord):
            continue
        mine = [p for p in record.pieces if p.rank == rank]
        if len(mine) == 1:
            entries[mine[0].file].append((name, None))
        elif mine:
            join = join_of(mine, DTYPES[record.dtype].bits)
            assert isinstance(join, Join)  # the draft was checked
            start = 0
            for piece in join.pieces:
                length = piece.shape[join.dim]
                entries[piece.file].append((name, (join.dim, start, length, join.shape)))
                start += length
    return entries
