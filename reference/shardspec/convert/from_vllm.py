"""A manifest for a vLLM ``save_sharded_state`` directory: :func:`import_vllm`.

The data files are ``model-rank-{rank}-part-{part}.safetensors``: the TP size is the number of
ranks, every tensor is rank-local (vLLM's pieces are not described as slices), every file is
checksummed and nothing is rewritten or copied.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Collection
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
from ..format.safetensors_header import read_header
from ..format.schema import schema_findings
from ..storage.commit import commit_manifest, uncommit
from ..storage.paths import open_inside
from .directories import SKIPPED_DIRS, WEIGHT_SUFFIXES, Progress, local_dir
from .hf import HFError

__all__ = ["Imported", "import_vllm"]


_VLLM_FILE = re.compile(r"^model-rank-(0|[1-9][0-9]*)-part-(0|[1-9][0-9]*)\.safetensors$")


@dataclass(frozen=True)
class Imported:
    """The committed manifest and the files left out of it (with why)."""

    manifest: Manifest
    skipped: dict[str, str] = field(default_factory=dict)


def import_vllm(
    path: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Imported:
    """Commit a manifest for the vLLM ``save_sharded_state`` directory at ``path``.

    Data files are ``model-rank-{rank}-part-{part}.safetensors``; ranks must be 0..R-1 and each
    rank's parts 0..P-1, without gaps; the TP size is R. Every tensor is recorded rank-local.
    Other files become extra files, except stale indexes (``*.index.json``), ``original/``
    folders and hidden files, which are skipped (and reported); any other weight file
    (``*.safetensors``, ``*.bin``, ``*.pt``...) at the top is refused as ambiguous. Nothing is
    rewritten or copied: only ``shardspec.json`` is added. Refuses a directory that already
    holds a manifest unless ``overwrite``.
    """
    root = local_dir(path, "the vLLM directory to import")
    if not root.is_dir():
        raise HFError(f"{root}: not a directory")
    if (root / MANIFEST_NAME).exists() and not overwrite:
        raise FileExistsError(f"{root} already holds {MANIFEST_NAME}; pass overwrite=True to "
                              "replace it")
    files: dict[int, dict[int, str]] = {}
    stray = []
    for entry in sorted(os.listdir(root)):
        match = _VLLM_FILE.match(entry)
        if match:
            files.setdefault(int(match[1]), {})[int(match[2])] = entry
        elif (entry.endswith(WEIGHT_SUFFIXES) and not entry.endswith(".index.json")) \
                or entry.startswith("model-rank-"):
            stray.append(entry)
    if stray:
        raise HFError(f"{root} holds weight files that are not vLLM sharded-state files "
                      f"model-rank-{{rank}}-part-{{part}}.safetensors: {stray}")
    if not files:
        raise HFError(f"{root} holds no model-rank-{{rank}}-part-{{part}}.safetensors files")
    world = len(files)
    if sorted(files) != list(range(world)):
        raise HFError(f"ranks {_missing(files)} have no files: ranks must be 0..{world - 1} "
                      f"without gaps ({world} ranks have files, the highest is {max(files)})")
    for rank, parts in files.items():
        if sorted(parts) != list(range(len(parts))):
            raise HFError(f"rank {rank} lacks parts {_missing(parts)}: parts must count from 0 "
                          "without gaps")
    layout = Layout(tp_size=world)
    # Each data file is opened once, inside the directory, as a regular file (no FIFO to hang
    # on, no link out of it), and its header and digests are read from that one descriptor.
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
                for item in sorted(header.entries.values(),
                                    key=lambda e: (e.begin, e.end, e.name)):
                    tensor = item.name
                    dtype = dtypes.setdefault(tensor, item.dtype.name)
                    if dtype != item.dtype.name:
                        raise HFError(f"tensor {tensor!r} is {dtype} on one rank and "
                                      f"{item.dtype.name} in {name}")
                    if any(p.rank == rank for p in pieces.get(tensor, ())):
                        raise HFError(f"rank {rank} holds tensor {tensor!r} twice (in {name} "
                                      "too)")
                    pieces.setdefault(tensor, []).append(Piece(rank=rank, file=name,
                                                               shape=item.shape))
                handle.seek(0)
                digests, size = digest_stream(handle, progress=advance)
                records.append(FileRecord(path=name, size=size, checksums=digests))
            ranks.append(RankRecord(rank=rank, **layout.coordinates(rank), files=tuple(records)))
    finally:
        for handle, _ in opened.values():
            handle.close()
    extras, skipped = _vllm_extras(root, {n for parts in files.values() for n in parts.values()})
    manifest = Manifest(
        format_version=format_version(), layout=layout, ranks=tuple(ranks),
        quantization=Quantization(),
        tensors={name: TensorRecord(dtype=dtypes[name], shape=None, pieces=tuple(p))
                 for name, p in pieces.items()},
        extra_files=tuple(extras), metadata={"imported_from": "vllm sharded_state"},
        generator=f"shardspec {__version__}",
    )
    raise_first_error(schema_findings(manifest.to_dict()))
    raise_first_error(check_manifest(manifest))
    uncommit(root)
    commit_manifest(root, manifest.to_json())
    return Imported(manifest, skipped)


def _missing(numbers: Collection[int], shown: int = 10) -> str:
    """The first numbers missing from 0..len(numbers)-1: bounded, whatever the largest one."""
    missing = [n for n in range(len(numbers)) if n not in numbers]
    more = f" and {len(missing) - shown} more" if len(missing) > shown else ""
    return f"{missing[:shown]}{more}"


def _open_data_file(root: Path, name: str) -> tuple[io.FileIO, int]:
    try:
        return open_inside(root, name)
    except ShardspecError as exc:
        raise HFError(f"{root / name}: {exc.finding.message}") from None


def _vllm_extras(root: Path, data_files: set[str]) -> tuple[list[FileRecord], dict[str, str]]:
    extras: list[FileRecord] = []
    skipped: dict[str, str] = {}
    for folder, dirs, names in os.walk(root):
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
