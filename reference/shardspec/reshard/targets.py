"""Resharding, what a plan holds: each target rank's pieces, and the source boxes each is read
from (SPEC 11.3). Data only; :mod:`~shardspec.reshard.plan` computes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from ..format.dtypes import DTYPES, byte_size
from ..format.manifest import Layout

__all__ = ["Box", "ReshardPlan", "SourcePiece", "TargetPiece"]

#: (offset, shape) of a rectangular slice of a global tensor, in elements.
Box = tuple[tuple[int, ...], tuple[int, ...]]


@dataclass(frozen=True)
class SourcePiece:
    """A source piece a target piece reads from, and the part of it (``box``, global
    coordinates) that lies inside the target piece."""

    rank: int
    file: str
    piece_offset: tuple[int, ...]
    piece_shape: tuple[int, ...]
    box_offset: tuple[int, ...]
    box_shape: tuple[int, ...]


@dataclass(frozen=True)
class TargetPiece:
    """What a target rank holds of one global tensor, and where its elements come from."""

    dtype: str
    global_shape: tuple[int, ...]
    offset: tuple[int, ...]
    shape: tuple[int, ...]
    replica: int
    sources: tuple[SourcePiece, ...]

    @property
    def nbytes(self) -> int:
        return byte_size(DTYPES[self.dtype], self.shape) or 0


@dataclass(frozen=True)
class ReshardPlan:
    """Everything one rank of the target layout holds, and the aliases it hands back."""

    rank: int
    layout: Layout
    pieces: dict[str, TargetPiece]
    aliases: dict[str, str]
    #: Tensors the rank holds in several pieces, one of each part (SPEC 11.3 rule 12), in join
    #: order: the rank's value is their join along ``joined_along[name]`` (7.2 rule 7).
    parts: dict[str, tuple[TargetPiece, ...]] = field(default_factory=dict)
    joined_along: dict[str, int] = field(default_factory=dict)

    def every_piece(self) -> Iterator[tuple[str, int | None, TargetPiece]]:
        """(name, part index or None for a tensor held in one piece, piece)."""
        for name, piece in self.pieces.items():
            yield name, None, piece
        for name, held in self.parts.items():
            for index, piece in enumerate(held):
                yield name, index, piece

    @property
    def target_bytes(self) -> int:
        return sum(p.nbytes for _, _, p in self.every_piece())

    def source_files(self) -> list[tuple[int, str]]:
        """The (source rank, file) pairs the plan reads from, in rank then path order."""
        return sorted({(s.rank, s.file) for _, _, p in self.every_piece() for s in p.sources})
