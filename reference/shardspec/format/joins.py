"""Several pieces of one tensor on one rank (SPEC 7.2 rules 3, 6, 7, format 1.3): their join.

A fused projection shared part by part gives a rank two or three slices of one tensor, and torch's
distributed checkpoint may give a rank several chunks; the rank's value is their join, the slices
laid one after the other along the one dimension in which their offsets differ.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .manifest import Piece

__all__ = ["JOINS_SINCE_MINOR", "Join", "allows_joins", "join_of", "several_per_rank"]

#: The first minor version of major 1 whose manifests may hold several pieces of a tensor on one
#: rank: an older manifest is read by its own version's rules (SPEC 4.2 rule 4, 7.2 rule 3).
JOINS_SINCE_MINOR = 3


def allows_joins(format_version: str) -> bool:
    """Whether a manifest of ``format_version`` (a checked ``MAJOR.MINOR``) may join pieces."""
    major, _, minor = format_version.partition(".")
    return int(major) > 1 or int(minor) >= JOINS_SINCE_MINOR


class Join:
    """The pieces of one rank in join order, the dimension they join along, and the joined shape."""

    __slots__ = ("dim", "pieces", "shape")

    def __init__(self, dim: int, pieces: tuple[Piece, ...]) -> None:
        self.dim = dim
        self.pieces = pieces
        shape = list(pieces[0].shape)
        shape[dim] = sum(p.shape[dim] for p in pieces)
        self.shape = tuple(shape)

    def __eq__(self, other: object) -> bool:
        # by value, as the plans that hold joins compare (the fast plan is the validator's)
        if not isinstance(other, Join):
            return NotImplemented
        return (self.dim, self.pieces) == (other.dim, other.pieces)

    def __hash__(self) -> int:
        return hash((self.dim, self.pieces))

    def __repr__(self) -> str:
        return f"Join(dim={self.dim}, pieces={self.pieces!r})"


def join_of(pieces: Sequence[Piece], bits: int = 8) -> Join | str:
    """The join of one rank's pieces of a global tensor (two or more) of a dtype of ``bits``
    bits, or why there is none."""
    files = [p.file for p in pieces]
    if len(set(files)) != len(files):
        return "two of them lie in one file (a file holds one entry of a name)"
    first = pieces[0]
    if first.offset is None or not first.shape:
        return "only pieces of a global tensor of one dimension or more can be joined"
    # a piece whose offset and shape disagree in length is piece-bounds (SPEC 7.2), reported
    # by the bounds check: the checks run on every piece, in bounds or not
    if any(p.offset is None or not len(p.offset) == len(p.shape) == len(first.shape)
           for p in pieces):
        return "their offsets and shapes do not all have the same number of dimensions"
    differing = [d for d in range(len(first.shape))
                 if any(p.offset is None or p.offset[d] != first.offset[d] for p in pieces)]
    if len(differing) != 1:
        return ("their offsets differ in no dimension" if not differing
                else f"their offsets differ in dimensions {differing}, not in one")
    dim = differing[0]
    for p in pieces:
        if p.offset is None or len(p.shape) != len(first.shape) or any(
                p.shape[d] != first.shape[d] or p.offset[d] != first.offset[d]
                for d in range(len(first.shape)) if d != dim):
            return f"their offsets or sizes differ outside dimension {dim}"
    ordered = tuple(sorted(pieces, key=lambda p: p.offset[dim]))  # type: ignore[index]
    for a, b in zip(ordered, ordered[1:], strict=False):
        start_a, start_b = a.offset[dim], b.offset[dim]  # type: ignore[index]
        if start_a == start_b or start_a + a.shape[dim] > start_b:
            return f"they overlap along dimension {dim}"
    if bits < 8 and any(math.prod(p.shape[dim:]) * bits % 8 for p in ordered):
        return (f"a piece's run along dimension {dim} does not fill whole bytes of its "
                f"{bits}-bit elements (SPEC 6.5)")
    return Join(dim, ordered)


def several_per_rank(pieces: Sequence[Piece]) -> dict[int, list[Piece]]:
    """The ranks that hold several of ``pieces``, each with its pieces in record order."""
    by_rank: dict[int, list[Piece]] = {}
    for piece in pieces:
        by_rank.setdefault(piece.rank, []).append(piece)
    return {rank: held for rank, held in by_rank.items() if len(held) > 1}
