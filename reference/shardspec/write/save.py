"""Writing a checkpoint: each rank's tensors -> data files -> the manifest, committed last.

The manifest is built and checked before any byte is written, so bad sharding information is
refused up front; then data files are written durably and the manifest commits them (SPEC 10).
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from .._version import __version__
from ..format.checks import check_manifest
from ..format.dtypes import byte_size, spec_shape
from ..format.errors import raise_first_error
from ..format.integrity import digest_stream
from ..format.limits import DEFAULT_MAX_FILE_SIZE
from ..format.manifest import (
    Alias,
    FileRecord,
    Layout,
    Logical,
    Manifest,
    Piece,
    Quantization,
    RankRecord,
    TensorRecord,
    Tie,
    format_version,
)
from ..format.schema import schema_findings
from ..storage.commit import write_inside
from ..storage.location import Location, PathOrURL, locate
from ..storage.remote import RemoteRoot
from ..storage.remote_write import upload_file, write_object
from .directory import claim_directory, commit_checkpoint, prepare_directory
from .shards import Shard, file_entries, piece_of_value, shards_of

__all__ = [
    "FILE_NAMES",
    "RankInfo",
    "Shard",
    "TensorInfo",
    "claim_directory",
    "commit_checkpoint",
    "copy_extra_files",
    "data_file_name",
    "describe_rank",
    "extra_sources",
    "finish_manifest",
    "plan_checkpoint",
    "place_file",
    "prepare_directory",
    "save",
    "split",
    "torch_file_name",
    "write_data_file",
    "write_rank",
]

StateDict = Mapping[str, torch.Tensor]


def split(tensor: torch.Tensor, dim: int | None, parts: int) -> list[tuple[torch.Tensor, Shard]]:
    """Split ``tensor`` into ``parts`` slices along ``dim`` (None: replicate) with their Shards.

    Slices are views; sizes follow ``torch.tensor_split`` when ``dim`` does not divide evenly.
    """
    dtype, global_shape = spec_shape(tensor)
    if dim is None:
        zeros = (0,) * len(global_shape)
        return [(tensor, Shard(global_shape, zeros, replica=i)) for i in range(parts)]
    if not -tensor.dim() <= dim < tensor.dim():
        raise ValueError(f"dim {dim} is out of range for a tensor of {tensor.dim()} dimensions"
                         + (" (a scalar can only be replicated: dim=None)" if not tensor.dim()
                            else ""))
    dim = dim % tensor.dim()
    scale = dtype.per_torch_element if dim == tensor.dim() - 1 else 1
    out, start = [], 0
    for piece in torch.tensor_split(tensor, parts, dim=dim):
        offset = tuple(start * scale if d == dim else 0 for d in range(tensor.dim()))
        out.append((piece, Shard(global_shape, offset)))
        start += piece.shape[dim]
    return out


def data_file_name(layout: Layout, rank: int, part: int) -> str:
    """SPEC 6.2: vLLM's names when pp_size == ep_size == 1, otherwise names with coordinates."""
    if layout.pp_size == 1 and layout.ep_size == 1:
        return f"model-rank-{rank}-part-{part}.safetensors"
    c = layout.coordinates(rank)
    return (f"model-rank-{rank}-pp-{c['pp_rank']}-ep-{c['ep_rank']}-tp-{c['tp_rank']}"
            f"-part-{part}.safetensors")


def torch_file_name(rank: int, part: int, parts: int) -> str:
    """The name torch's ``HuggingFaceStorageWriter(save_distributed=True)`` gives a rank's file,
    and transformers' ``save_pretrained(..., distributed_checkpoint=True)`` with it (SPEC 6.2,
    informative): ``shard-{S}-model-{C}-of-{N}.safetensors``, S the rank counted from 1 (the
    writer's plan index, ``enumerate(plans, start=1)``), C the file counted from 1 and N the
    rank's number of files, each at least five digits (``_hf_utils._gen_file_name``).
    transformers loads a directory holding such a file with torch's reader."""
    return f"shard-{rank + 1:05d}-model-{part + 1:05d}-of-{parts:05d}.safetensors"


#: The names a writer may give data files (``plan_checkpoint``'s ``file_names``): shardspec's
#: defaults (:func:`data_file_name`), or torch's distributed Hugging Face names
#: (:func:`torch_file_name`), which ``convert`` writes with Hugging Face tensor names.
FILE_NAMES = ("shardspec", "torch")


def _file_names(layout: Layout, rank: int, parts: int, style: str) -> list[str]:
    if style == "torch":
        return [torch_file_name(rank, p, parts) for p in range(parts)]
    if style != "shardspec":
        raise ValueError(f"file_names must be one of {list(FILE_NAMES)}, got {style!r}")
    return [data_file_name(layout, rank, p) for p in range(parts)]


def save(
    states: Mapping[int, StateDict],
    path: PathOrURL,
    *,
    layout: Layout,
    sharding: Mapping[int, Mapping[str, Shard | Sequence[Shard]]] | None = None,
    quantization: Quantization | None = None,
    logical: Mapping[str, Logical] | None = None,
    ties: Mapping[str, Tie] | None = None,
    extra_files: Mapping[str, str | os.PathLike[str]] | Iterable[str | os.PathLike[str]] = (),
    max_file_size: int = DEFAULT_MAX_FILE_SIZE,
    overwrite: bool = False,
    metadata: Mapping[str, str] | None = None,
    extensions: Mapping[str, Mapping[str, Any]] | None = None,
    storage_options: dict[str, Any] | None = None,
    remove_adopted: bool = False,
) -> Manifest:
    """Write ``states`` (rank -> state dict) as a committed checkpoint at ``path``, a directory
    or an object-storage URL (``storage_options`` for its fsspec filesystem).

    ``logical`` and ``ties`` give tensors' logical records and ties to their base (SPEC 8.2,
    8.4), by name. A tensor with a :class:`Shard` in ``sharding[rank]`` is a piece of a global
    tensor; one with several Shards (each with its piece's ``shape``) is the join of several
    pieces, written in files of their own (SPEC 7.2 rule 7); one without is rank-local.
    Tensors sharing storage on every rank that has them are recorded as aliases;
    non-contiguous tensors are written contiguous; zero-size tensors are kept. Each rank's
    tensors are split into files of about ``max_file_size`` bytes. ``extra_files`` maps
    names inside the checkpoint to source paths (or is a list of paths kept by base name).
    Bad sharding information is refused before anything is written. ``overwrite`` replaces a
    checkpoint at ``path``; one that ``shardspec import`` adopted only with ``remove_adopted``.
    """
    root = locate(path, storage_options)
    sharding = sharding or {}
    if set(states) != set(range(layout.size)):
        raise ValueError(f"states must have one state dict per rank 0..{layout.size - 1} "
                         f"(SPEC 5.3); got ranks {sorted(states)}")
    extras = extra_sources(extra_files)
    draft = plan_checkpoint(
        layout, [describe_rank(r, states[r], sharding.get(r)) for r in sorted(states)],
        quantization=quantization, logical=logical, ties=ties, metadata=metadata,
        extensions=extensions, extra_files=list(extras), max_file_size=max_file_size,
    )
    prepare_directory(root, overwrite, remove_adopted=remove_adopted, paths=list(extras))
    records: dict[str, FileRecord] = {}
    for rank in range(layout.size):
        records.update({f.path: f for f in write_rank(root, rank, states[rank], draft)})
    records.update({f.path: f for f in copy_extra_files(root, extras)})
    manifest = finish_manifest(draft, records)
    commit_checkpoint(root, manifest.to_json())
    return manifest


@dataclass(frozen=True)
class TensorInfo:
    """What a rank knows of one of its tensors, without its data (spec dtype and shape)."""

    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    #: None for a rank-local tensor; several Shards for the join of several pieces
    shard: Shard | tuple[Shard, ...] | None

    @property
    def shards(self) -> tuple[Shard, ...]:
        """One Shard per piece, each with its piece's shape (none for a rank-local tensor)."""
        if self.shard is None:
            return ()
        if isinstance(self.shard, Shard):
            return (replace(self.shard, shape=self.shape),)
        return self.shard


@dataclass(frozen=True)
class RankInfo:
    """One rank's tensors as metadata: small enough to gather from every worker."""

    rank: int
    tensors: dict[str, TensorInfo]
    #: alias -> target: names that are the same view of one storage on this rank
    local_aliases: dict[str, str]


def describe_rank(
    rank: int, state: StateDict, sharding: Mapping[str, Shard | Sequence[Shard]] | None = None
) -> RankInfo:
    """Check one rank's state dict and describe it (no data is copied)."""
    sharding = sharding or {}
    tensors: dict[str, TensorInfo] = {}
    first_with: dict[tuple[Any, ...], str] = {}
    local_aliases: dict[str, str] = {}
    for name, tensor in state.items():
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise ValueError(f"rank {rank}: {name!r} is not a valid tensor name (SPEC 7.1)")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"rank {rank}, tensor {name!r}: expected a torch.Tensor, got "
                            f"{type(tensor).__name__}")
        dtype, shape = spec_shape(tensor)  # raises for a dtype the format cannot hold
        given = sharding.get(name)
        shards = None if given is None else shards_of(name, rank, given, shape)
        shard = shards[0] if shards is not None and len(shards) == 1 else shards
        tensors[name] = TensorInfo(dtype.name, shape, byte_size(dtype, shape) or 0, shard)
        key = _storage_key(tensor)
        if key is None:
            continue
        if key in first_with:
            local_aliases[name] = first_with[key]
        else:
            first_with[key] = name
    unknown = sorted(set(sharding) - set(tensors))
    if unknown:
        raise ValueError(f"rank {rank}: sharding names tensors not in the state dict: {unknown}")
    return RankInfo(rank, tensors, local_aliases)


def _storage_key(tensor: torch.Tensor) -> tuple[Any, ...] | None:
    if tensor.numel() == 0:
        return None
    return (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
            tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)


def _global_aliases(ranks: Sequence[RankInfo]) -> dict[str, str]:
    """alias -> target where the two are the same view on every rank holding either (SPEC 7.6)."""
    holders: dict[str, set[int]] = {}
    for info in ranks:
        for name in info.tensors:
            holders.setdefault(name, set()).add(info.rank)
    candidates = {a: t for info in ranks for a, t in info.local_aliases.items()}
    return {
        alias: target
        for alias, target in candidates.items()
        if holders[alias] == holders[target]
        and all(ranks[r].local_aliases.get(alias) == target for r in holders[alias])
    }


def _assign_parts(
    tensors: Mapping[str, TensorInfo], skip: Container[str], max_file_size: int
) -> list[list[tuple[str, int]]]:
    """Greedy split of (name, piece index) into parts of at most ``max_file_size`` data bytes;
    always one part. The k-th pieces of joined tensors follow in parts of their own, one run
    of parts for each k: two pieces of one tensor never share a file (SPEC 7.2 rule 3)."""
    parts: list[list[tuple[str, int]]] = [[]]
    size = 0
    for k in range(max((len(i.shards) for i in tensors.values()), default=1) or 1):
        if k:
            parts.append([])
            size = 0
        for name, info in tensors.items():
            if name in skip or (k and k >= len(info.shards)):
                continue
            nbytes = info.nbytes if len(info.shards) < 2 else _piece_bytes(info, k)
            if parts[-1] and size + nbytes > max_file_size:
                parts.append([])
                size = 0
            parts[-1].append((name, k))
            size += nbytes
    return parts


def _piece_bytes(info: TensorInfo, k: int) -> int:
    piece = info.shards[k].shape
    assert piece is not None
    return info.nbytes * _count(piece) // max(_count(info.shape), 1)


def _count(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


_PLACEHOLDER = {"sha256": "0" * 64}


def plan_checkpoint(
    layout: Layout,
    ranks: Sequence[RankInfo],
    *,
    quantization: Quantization | None = None,
    logical: Mapping[str, Logical] | None = None,
    ties: Mapping[str, Tie] | None = None,
    metadata: Mapping[str, str] | None = None,
    extensions: Mapping[str, Mapping[str, Any]] | None = None,
    extra_files: Sequence[str] = (),
    max_file_size: int = DEFAULT_MAX_FILE_SIZE,
    file_names: str = "shardspec",
) -> Manifest:
    """The manifest to write, with placeholder sizes and digests; checked before any write.

    Every worker of a distributed save computes the same draft from the same gathered infos.
    ``file_names`` is one of :data:`FILE_NAMES`.
    """
    if [info.rank for info in ranks] != list(range(layout.size)):
        raise ValueError(f"expected one RankInfo per rank 0..{layout.size - 1}, in order")
    aliases = _global_aliases(ranks)
    logical = logical or {}
    ties = ties or {}
    rank_records = []
    file_of: dict[tuple[int, str, int], str] = {}
    for info in ranks:
        parts = _assign_parts(info.tensors, aliases, max_file_size)
        names = _file_names(layout, info.rank, len(parts), file_names)
        for file_name, part in zip(names, parts, strict=True):
            file_of.update({(info.rank, tensor, k): file_name for tensor, k in part})
        rank_records.append(RankRecord(
            rank=info.rank, **layout.coordinates(info.rank),
            files=tuple(FileRecord(path=n, size=0, checksums=_PLACEHOLDER) for n in names)))
    tensors: dict[str, TensorRecord | Alias] = {}
    for info in ranks:
        for name in info.tensors:
            if name in tensors:
                continue
            if name in aliases:
                tensors[name] = Alias(alias_of=aliases[name])
            else:
                tensors[name] = _tensor_record(name, ranks, file_of, logical.get(name),
                                               ties.get(name))
    draft = Manifest(
        format_version=format_version(), layout=layout, ranks=tuple(rank_records),
        quantization=quantization or Quantization(), tensors=tensors,
        extra_files=tuple(FileRecord(path=n, size=0, checksums=_PLACEHOLDER)
                          for n in extra_files),
        metadata=dict(metadata or {}), extensions=dict(extensions or {}),
        generator=f"shardspec {__version__}",
    )
    _refuse_invalid(draft)
    return draft


def _tensor_record(
    name: str,
    ranks: Sequence[RankInfo],
    file_of: Mapping[tuple[int, str, int], str],
    logical: Logical | None,
    tie: Tie | None = None,
) -> TensorRecord:
    holders = [info for info in ranks if name in info.tensors]
    infos = {info.rank: info.tensors[name] for info in holders}
    dtypes = {t.dtype for t in infos.values()}
    if len(dtypes) != 1:
        raise ValueError(f"tensor {name!r} has dtypes {sorted(dtypes)} on different ranks; "
                         "one tensor has one dtype (SPEC 7.1)")
    given = [r for r, t in infos.items() if t.shard is not None]
    if given and len(given) != len(infos):
        missing = sorted(set(infos) - set(given))
        raise ValueError(f"tensor {name!r} has a Shard on ranks {given} but not on {missing}: "
                         "give every rank's piece a Shard, or none for a rank-local tensor")
    global_shapes = {s.global_shape for t in infos.values() for s in t.shards}
    if len(global_shapes) > 1:
        raise ValueError(f"tensor {name!r}: the ranks' Shards disagree on the global shape: "
                         f"{sorted(global_shapes)}")
    pieces = tuple(p for r, t in infos.items() for p in _pieces(r, name, t, file_of))
    return TensorRecord(dtype=dtypes.pop(), shape=global_shapes.pop() if global_shapes else None,
                        pieces=pieces, logical=logical, tied_to=tie)


def _pieces(rank: int, name: str, info: TensorInfo,
            file_of: Mapping[tuple[int, str, int], str]) -> list[Piece]:
    """``rank``'s pieces of tensor ``name``: one a Shard, or a rank-local tensor's one piece."""
    if info.shard is None:
        return [Piece(rank=rank, file=file_of[(rank, name, 0)], shape=info.shape)]
    return [Piece(rank=rank, file=file_of[(rank, name, k)], shape=s.shape or info.shape,
                  offset=s.offset, replica=s.replica) for k, s in enumerate(info.shards)]


def write_rank(
    root: Location, rank: int, state: StateDict, draft: Manifest
) -> list[FileRecord]:
    """Write ``rank``'s data files as ``draft`` places them; return their real records."""
    dtype_of = {name: r.dtype for name, r in draft.tensors.items() if isinstance(r, TensorRecord)}
    return [write_data_file(root, path, {n: piece_of_value(state[n], dtype_of[n], cut)
                                         for n, cut in entries})
            for path, entries in file_entries(draft, rank).items()]


def finish_manifest(draft: Manifest, records: Mapping[str, FileRecord]) -> Manifest:
    """The draft with every placeholder replaced by the written file's record, checked again."""
    def real(record: FileRecord) -> FileRecord:
        if record.path not in records:
            raise ValueError(f"no written file for {record.path!r}")
        return records[record.path]

    manifest = replace(
        draft,
        ranks=tuple(replace(r, files=tuple(map(real, r.files))) for r in draft.ranks),
        extra_files=tuple(map(real, draft.extra_files)),
    )
    _refuse_invalid(manifest)
    return manifest


def _refuse_invalid(manifest: Manifest) -> None:
    """The writer never commits a manifest its own reader would refuse."""
    data = manifest.to_dict()
    raise_first_error(schema_findings(data))
    raise_first_error(check_manifest(manifest))


def write_data_file(
    root: Location, relative: str, tensors: Mapping[str, torch.Tensor]
) -> FileRecord:
    """Write one part with safetensors, durably, and record its size and sha256."""
    ready: dict[str, torch.Tensor] = {}
    seen_storage: set[int] = set()
    for name, tensor in tensors.items():
        tensor = tensor.detach().to("cpu").contiguous()
        if tensor.numel():
            pointer = tensor.untyped_storage().data_ptr()
            if pointer in seen_storage:
                tensor = tensor.clone()  # safetensors refuses two names on one storage
            seen_storage.add(tensor.untyped_storage().data_ptr())
        ready[name] = tensor

    def write(temp: Path) -> None:
        save_file(ready, str(temp), metadata={"format": "pt"})

    return place_file(root, relative, write)


def place_file(root: Location, relative: str, write: Callable[[Path], object]) -> FileRecord:
    """Put the file that ``write(path)`` produces at ``relative``, durably in a directory
    (SPEC 10.1) or as one upload to object storage (10.4); its record from the bytes placed."""
    if isinstance(root, RemoteRoot):
        return write_object(root, relative, write)
    path = write_inside(root, relative, write, sync_folder=False)
    with path.open("rb") as handle:
        digests, size = digest_stream(handle)
    return FileRecord(path=relative, size=size, checksums=digests)


def extra_sources(
    extra_files: Mapping[str, str | os.PathLike[str]] | Iterable[str | os.PathLike[str]],
) -> dict[str, Path]:
    """Name in the checkpoint -> source file, each checked to be a readable file now, before
    a byte of the checkpoint is written."""
    if isinstance(extra_files, Mapping):
        sources = {str(name): Path(source) for name, source in extra_files.items()}
    else:
        sources = {}
        for source in map(Path, extra_files):
            if source.name in sources:
                raise ValueError(f"extra files {str(sources[source.name])!r} and "
                                 f"{str(source)!r} share a base name; pass a mapping of names "
                                 "to sources")
            sources[source.name] = source
    for name, source in sources.items():
        if not source.is_file() or not os.access(source, os.R_OK):
            why = "is not a readable file" if source.exists() else "does not exist"
            raise FileNotFoundError(errno.ENOENT, f"extra file {name!r}: {source} {why}; "
                                    "nothing was written", str(source))
    return sources


def copy_extra_files(root: Location, sources: Mapping[str, Path]) -> list[FileRecord]:
    """Copy extra files (config.json, tokenizer files) into the checkpoint, durably."""
    if isinstance(root, RemoteRoot):
        return [upload_file(root, name, source) for name, source in sources.items()]
    return [_copy_extra(root, name, source) for name, source in sources.items()]


def _copy_extra(root: Path, name: str, source: Path) -> FileRecord:
    def copy(temp: Path) -> None:
        shutil.copyfile(source, temp)

    target = write_inside(root, name, copy)
    with target.open("rb") as handle:
        digests, size = digest_stream(handle)
    return FileRecord(path=name, size=size, checksums=digests)
