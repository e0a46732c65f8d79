"""Adopting a directory of per-rank safetensors files in place: a manifest is written beside the
files, nothing is moved, rewritten or copied. Shared by the importers of vLLM's sharded state
(:mod:`.from_vllm`) and of transformers'/torch's distributed Hugging Face saves
(:mod:`.from_hf_distributed`), which differ only in how a file's entries become pieces.

Each data file is opened once, inside the directory, as a regular file (no FIFO to hang on, no
link out of it); its header, its pieces and its digests come from that one descriptor. The
manifest is checked against the schema and every SPEC rule before it is committed.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .._version import __version__
from ..format.checks import check_manifest, path_problem
from ..format.errors import ShardspecError, raise_first_error
from ..format.integrity import digest_stream
from ..format.limits import MANIFEST_NAME
from ..format.manifest import (
    FileRecord,
    Layout,
    Manifest,
    Piece,
    Quantization,
    RankRecord,
    TensorRecord,
    format_version,
)
from ..format.safetensors_header import Header, read_header
from ..format.schema import schema_findings
from ..storage.commit import commit_manifest, uncommit
from ..storage.entries import walk
from ..storage.paths import open_inside
from .directories import SKIPPED_DIRS, WEIGHT_SUFFIXES, Progress, local_dir
from .hf import HFError

__all__ = ["Imported", "PiecesOf", "adopt", "adoptable", "check_numbering", "missing_numbers"]


@dataclass(frozen=True)
class Imported:
    """The committed manifest and the files left out of it (with why)."""

    manifest: Manifest
    skipped: dict[str, str] = field(default_factory=dict)


#: (rank, file name, its checked header) -> (tensor, its piece) for every entry of the file.
PiecesOf = Callable[[int, str, Header], list[tuple[str, Piece]]]


def adopt(root: Path, files: Mapping[int, Mapping[int, str]], pieces_of: PiecesOf, *,
          shapes: Callable[[dict[str, list[Piece]]], dict[str, tuple[int, ...] | None]],
          metadata: dict[str, str], progress: Progress | None,
          renumber: Callable[[list[Piece]], list[Piece]] | None = None) -> Imported:
    """Commit a manifest for ``files`` (rank -> part -> file name, ranks 0..R-1 and parts
    0..P-1 already checked) of ``root``: layout TP = R, each file's entries made pieces by
    ``pieces_of`` (then ``renumber``-ed per tensor), each tensor's shape by ``shapes``; every
    file checksummed."""
    world = len(files)
    layout = Layout(tp_size=world)
    opened: dict[str, tuple[io.FileIO, int]] = {}
    ranks: list[RankRecord] = []
    pieces: dict[str, list[Piece]] = {}
    dtypes: dict[str, str] = {}
    try:
        for parts in files.values():
            for name in parts.values():
                opened[name] = _open_data_file(root, name)
        total = sum(size for _, size in opened.values())
        advance = None if progress is None else (lambda n: progress(n, total))
        for rank in range(world):
            records = []
            for part in range(len(files[rank])):
                name = files[rank][part]
                handle, size = opened[name]
                try:
                    header = read_header(handle, size, name)
                except ShardspecError as exc:
                    raise HFError(f"{name}: not a valid safetensors file: {exc}") from None
                for tensor, piece in pieces_of(rank, name, header):
                    dtype = dtypes.setdefault(tensor, header.entries[tensor].dtype.name)
                    if dtype != header.entries[tensor].dtype.name:
                        raise HFError(f"tensor {tensor!r} is {dtype} on one rank and "
                                      f"{header.entries[tensor].dtype.name} in {name}")
                    # Several pieces of one rank (in different files) must join: the
                    # manifest's checks say so before it is committed (SPEC 7.2 rule 7).
                    pieces.setdefault(tensor, []).append(piece)
                # The header's own bytes begin the digest: the pieces and the checksum come
                # from one read of the file, so a file rewritten in place meanwhile fails
                # validate --checksums instead of passing with the old header's placement.
                digests, hashed = digest_stream(handle, progress=advance,
                                                prefix=header.header_bytes)
                if hashed != size:
                    raise HFError(f"{name}: the file changed during the import ({size} bytes "
                                  f"when opened, {hashed} when hashed); import it again")
                records.append(FileRecord(path=name, size=size, checksums=digests))
            ranks.append(RankRecord(rank=rank, **layout.coordinates(rank), files=tuple(records)))
    finally:
        for handle, _ in opened.values():
            handle.close()
    extras, skipped = _extra_files(root, {n for parts in files.values() for n in parts.values()})
    if renumber is not None:
        pieces = {name: renumber(held) for name, held in pieces.items()}
    shape_of = shapes(pieces)
    manifest = Manifest(
        format_version=format_version(), layout=layout, ranks=tuple(ranks),
        quantization=Quantization(),
        tensors={name: TensorRecord(dtype=dtypes[name], shape=shape_of[name], pieces=tuple(p))
                 for name, p in pieces.items()},
        extra_files=tuple(extras), metadata=metadata, generator=f"shardspec {__version__}",
    )
    raise_first_error(schema_findings(manifest.to_dict()))
    raise_first_error(check_manifest(manifest))
    uncommit(root)
    commit_manifest(root, manifest.to_json())
    return Imported(manifest, skipped)


def adoptable(path: str | os.PathLike[str], what: str, *, overwrite: bool) -> Path:
    """``path`` as a local directory to write a manifest into: HFError if it is none,
    FileExistsError if it holds a manifest and not ``overwrite``."""
    root = local_dir(path, what)
    if not root.is_dir():
        raise HFError(f"{root}: not a directory")
    if (root / MANIFEST_NAME).exists() and not overwrite:
        raise FileExistsError(f"{root} already holds {MANIFEST_NAME}; pass overwrite=True to "
                              "replace it")
    return root


def missing_numbers(numbers: Collection[int], shown: int = 10) -> str:
    """The first numbers missing from 0..len(numbers)-1: bounded, whatever the largest one."""
    missing = [n for n in range(len(numbers)) if n not in numbers]
    more = f" and {len(missing) - shown} more" if len(missing) > shown else ""
    return f"{missing[:shown]}{more}"


def add_data_file(files: dict[int, dict[int, str]], rank: int, part: int, name: str) -> None:
    """File ``name`` as rank ``rank``'s part ``part``; HFError where another file already is
    (one of them would be dropped silently)."""
    held = files.setdefault(rank, {})
    if part in held:
        raise HFError(f"{held[part]!r} and {name!r} are both rank {rank}'s part {part}: "
                      "remove or rename one")
    held[part] = name


def check_numbering(files: Mapping[int, Mapping[int, str]]) -> None:
    """Ranks 0..R-1 and each rank's parts 0..P-1, without gaps, else HFError."""
    world = len(files)
    if sorted(files) != list(range(world)):
        raise HFError(f"ranks {missing_numbers(files)} have no files: ranks must be "
                      f"0..{world - 1} without gaps ({world} ranks have files, the highest is "
                      f"{max(files)})")
    for rank, parts in files.items():
        if sorted(parts) != list(range(len(parts))):
            raise HFError(f"rank {rank} lacks parts {missing_numbers(parts)}: parts must count "
                          "from 0 without gaps")


def _open_data_file(root: Path, name: str) -> tuple[io.FileIO, int]:
    try:
        return open_inside(root, name)
    except ShardspecError as exc:
        raise HFError(f"{root / name}: {exc.finding.message}") from None


def _extra_files(root: Path, data_files: set[str]) -> tuple[list[FileRecord], dict[str, str]]:
    extras: list[FileRecord] = []
    skipped: dict[str, str] = {}
    for folder, dirs, names in walk(root):
        relative = Path(folder).relative_to(root)
        for d in sorted(dirs):
            if d.startswith(".") or d in SKIPPED_DIRS:
                skipped[(relative / d).as_posix() + "/"] = (
                    "hidden folder" if d.startswith(".") else "original weights folder")
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS)
        for name in sorted(names):
            rel = (relative / name).as_posix()
            if rel in data_files or rel == MANIFEST_NAME:
                continue
            if name.startswith("."):
                skipped[rel] = "hidden file"
                continue
            if name.endswith(".index.json"):
                skipped[rel] = "stale index of other weight files"
                continue
            if name.endswith(WEIGHT_SUFFIXES):
                skipped[rel] = "weight file of another format"
                continue
            problem = path_problem(rel)
            handle = None
            if not problem:
                try:  # inside the directory and a regular file, or skipped
                    handle, _ = open_inside(root, rel)
                except ShardspecError as exc:
                    problem = exc.finding.message
            if handle is None:
                skipped[rel] = problem or "not a regular file"
                continue
            with handle:
                digests, size = digest_stream(handle)
            extras.append(FileRecord(path=rel, size=size, checksums=digests))
    return extras, skipped
