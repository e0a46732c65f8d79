"""A checked manifest -> the plan of reads for one rank: its files and what each must hold.

A plan is pure data, computed from the manifest alone; executing it (:mod:`shardspec.load.execute`)
checks each file's header against it before reading any tensor byte.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ..format.dtypes import DTYPES
from ..format.errors import Finding, raise_first_error
from ..format.joins import Join, join_of
from ..format.manifest import Alias, FileRecord, Manifest, Piece, TensorRecord
from ..format.safetensors_header import Header

__all__ = ["FilePlan", "RankPlan", "plan_rank", "plan_ranks"]


@dataclass(frozen=True)
class FilePlan:
    """One data file of the rank and the tensors (name -> dtype, shape) it must hold."""

    record: FileRecord
    expected: dict[str, tuple[str, tuple[int, ...]]]

    def header_findings(self, header: Header) -> Iterator[Finding]:
        """SPEC 7.2: the file holds exactly the planned tensors, with their dtypes and shapes."""
        held = {name: (entry.dtype.name, entry.shape) for name, entry in header.entries.items()}
        if held == self.expected:  # the usual answer, at C speed: nothing to report
            return
        path = self.record.path
        for name, (dtype, shape) in self.expected.items():
            entry = header.entries.get(name)
            if entry is None:
                yield Finding(code="st-missing-tensor", file=path, tensor=name,
                              message="the manifest places this tensor in the file but it is "
                              "absent")
            elif (entry.dtype.name, entry.shape) != (dtype, shape):
                yield Finding(code="st-mismatch", file=path, tensor=name,
                              message=f"the file has {entry.dtype.name} {list(entry.shape)}, "
                              f"the manifest says {dtype} {list(shape)}")
        for name in header.entries:
            if name not in self.expected:
                yield Finding(code="st-extra-tensor", file=path, tensor=name,
                              message="the file holds a tensor the manifest does not place there")

    def check_header(self, header: Header) -> None:
        """Raise the first disagreement between the header and the manifest."""
        raise_first_error(self.header_findings(header))


@dataclass(frozen=True)
class RankPlan:
    """Everything one rank reads, the tensors it joins from several pieces (SPEC 7.2 rule 7),
    and the aliases it hands back (alias -> target)."""

    rank: int
    files: tuple[FilePlan, ...]
    aliases: dict[str, str]
    joins: dict[str, Join]

    def dtype_of(self, name: str) -> str:
        """The spec dtype of a tensor the rank reads."""
        return next(f.expected[name][0] for f in self.files if name in f.expected)

    @property
    def total_bytes(self) -> int:
        return sum(f.record.size for f in self.files)


def plan_rank(manifest: Manifest, rank: int) -> RankPlan:
    """The reads of ``rank``: only its own files (SPEC 6.1), each with its expected tensors."""
    return plan_ranks(manifest, [rank])[0]


def plan_ranks(manifest: Manifest, ranks: Iterable[int]) -> list[RankPlan]:
    """:func:`plan_rank` for several ranks in one pass over the pieces (a validator's view)."""
    ranks = list(ranks)
    expected: dict[int, dict[str, dict[str, tuple[str, tuple[int, ...]]]]] = {
        rank: {f.path: {} for f in manifest.files_of(rank)} for rank in ranks
    }
    held: dict[int, set[str]] = {rank: set() for rank in ranks}
    joins: dict[int, dict[str, Join]] = {rank: {} for rank in ranks}
    for name, record in manifest.tensors.items():
        if not isinstance(record, TensorRecord):
            continue
        mine: dict[int, list[Piece]] = {}  # the planned ranks' pieces of it
        for piece in record.pieces:
            files = expected.get(piece.rank)
            if files is None:
                continue
            mine.setdefault(piece.rank, []).append(piece)
            # A piece in a file its rank does not own is error file-rank (checks.py), and a
            # second piece of one rank in one file error piece-duplicate: not planned.
            if piece.file in files and name not in files[piece.file]:
                files[piece.file][name] = (record.dtype, piece.shape)
                held[piece.rank].add(name)
        for rank, pieces in mine.items():
            if len(pieces) > 1:
                join = join_of(pieces, DTYPES[record.dtype].bits)  # a checked manifest's join
                if isinstance(join, Join):
                    joins[rank][name] = join
    aliases = [(name, record.alias_of) for name, record in manifest.tensors.items()
               if isinstance(record, Alias)]
    return [
        RankPlan(
            rank,
            tuple(FilePlan(f, expected[rank][f.path]) for f in manifest.files_of(rank)),
            {name: target for name, target in aliases if target in held[rank]},
            joins[rank],
        )
        for rank in ranks
    ]
