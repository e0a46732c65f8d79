"""A checked manifest -> the plan of reads for one rank: its files and what each must hold.

A plan is pure data, computed from the manifest alone; executing it (:mod:`shardspec.load`)
checks each file's header against it before reading any tensor byte.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .errors import Finding, raise_first_error
from .manifest import Alias, FileRecord, Manifest, TensorRecord
from .safetensors_header import Header

__all__ = ["FilePlan", "RankPlan", "plan_rank"]


@dataclass(frozen=True)
class FilePlan:
    """One data file of the rank and the tensors (name -> dtype, shape) it must hold."""

    record: FileRecord
    expected: dict[str, tuple[str, tuple[int, ...]]]

    def header_findings(self, header: Header) -> Iterator[Finding]:
        """SPEC 7.2: the file holds exactly the planned tensors, with their dtypes and shapes."""
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
    """Everything one rank reads, and the aliases it hands back (alias -> target)."""

    rank: int
    files: tuple[FilePlan, ...]
    aliases: dict[str, str]

    @property
    def total_bytes(self) -> int:
        return sum(f.record.size for f in self.files)


def plan_rank(manifest: Manifest, rank: int) -> RankPlan:
    """The reads of ``rank``: only its own files (SPEC 6.1), each with its expected tensors."""
    expected: dict[str, dict[str, tuple[str, tuple[int, ...]]]] = {
        f.path: {} for f in manifest.files_of(rank)
    }
    held: set[str] = set()
    for name, record in manifest.tensors.items():
        if isinstance(record, TensorRecord):
            piece = record.piece_of(rank)
            if piece is not None:
                expected[piece.file][name] = (record.dtype, piece.shape)
                held.add(name)
    aliases = {
        name: record.alias_of
        for name, record in manifest.tensors.items()
        if isinstance(record, Alias) and record.alias_of in held
    }
    files = tuple(FilePlan(f, expected[f.path]) for f in manifest.files_of(rank))
    return RankPlan(rank, files, aliases)
