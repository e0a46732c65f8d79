"""Writing a checkpoint: each rank's tensors -> data files -> the manifest, committed last.

The manifest is built and checked before any byte is written, so bad sharding information is
refused up front; then data files are written durably and the manifest commits them (SPEC 10).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from . import __version__
from .checks import check_manifest
from .commit import TEMP_SUFFIX, commit_manifest, fsync_dir, uncommit, write_durably
from .dtypes import byte_size, spec_shape
from .errors import raise_first_error
from .integrity import digest_stream
from .limits import DEFAULT_MAX_FILE_SIZE, MANIFEST_NAME
from .manifest import (
    Alias,
    FileRecord,
    Layout,
    Logical,
    Manifest,
    Piece,
    Quantization,
    RankRecord,
    TensorRecord,
    format_version,
)
from .parse import read_manifest
from .paths import resolve_inside
from .schema import schema_findings

__all__ = ["Shard", "data_file_name", "save", "split"]

StateDict = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class Shard:
    """Where a rank's tensor sits in its global tensor, in elements (SPEC 7.2).

    ``replica`` numbers identical copies of one slice (0 for the primary, SPEC 7.4).
    """

    global_shape: tuple[int, ...]
    offset: tuple[int, ...]
    replica: int = 0


def split(tensor: torch.Tensor, dim: int | None, parts: int) -> list[tuple[torch.Tensor, Shard]]:
    """Split ``tensor`` into ``parts`` slices along ``dim`` (None: replicate) with their Shards.

    Slices are views; sizes follow ``torch.tensor_split`` when ``dim`` does not divide evenly.
    """
    dtype, global_shape = spec_shape(tensor)
    if dim is None:
        zeros = (0,) * len(global_shape)
        return [(tensor, Shard(global_shape, zeros, replica=i)) for i in range(parts)]
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


def save(
    states: Mapping[int, StateDict],
    path: str | os.PathLike[str],
    *,
    layout: Layout,
    sharding: Mapping[int, Mapping[str, Shard]] | None = None,
    quantization: Quantization | None = None,
    logical: Mapping[str, Logical] | None = None,
    extra_files: Mapping[str, str | os.PathLike[str]] | Iterable[str | os.PathLike[str]] = (),
    max_file_size: int = DEFAULT_MAX_FILE_SIZE,
    overwrite: bool = False,
    metadata: Mapping[str, str] | None = None,
    extensions: Mapping[str, Mapping[str, Any]] | None = None,
) -> Manifest:
    """Write ``states`` (rank -> state dict) as a committed checkpoint at ``path``.

    A tensor with a :class:`Shard` in ``sharding[rank]`` is a piece of a global tensor; one
    without is rank-local. Tensors sharing storage on every rank that has them are recorded as
    aliases; non-contiguous tensors are written contiguous; zero-size tensors are kept. Each
    rank's tensors are split into files of about ``max_file_size`` bytes. ``extra_files`` maps
    names inside the checkpoint to source paths (or is a list of paths kept by base name).
    """
    root = Path(path)
    sharding = sharding or {}
    tensors_of = _check_states(states, layout)
    aliases = _find_aliases(tensors_of)
    parts = {
        rank: _assign_parts([n for n in tensors_of[rank] if n not in aliases],
                            tensors_of[rank], max_file_size)
        for rank in tensors_of
    }
    extras = _extra_sources(extra_files)
    draft = _build_manifest(
        layout=layout, tensors_of=tensors_of, sharding=sharding, aliases=aliases, parts=parts,
        quantization=quantization or Quantization(), logical=logical or {},
        metadata=metadata or {}, extensions=extensions or {},
        extras={name: FileRecord(path=name, size=0, checksums={"sha256": "0" * 64})
                for name in extras},
        file_records={},
    )
    _refuse_invalid(draft)

    _prepare_directory(root, overwrite)
    file_records: dict[str, FileRecord] = {}
    for rank, rank_parts in parts.items():
        for part, names in enumerate(rank_parts):
            name = data_file_name(layout, rank, part)
            file_records[name] = _write_data_file(
                root / name, {n: tensors_of[rank][n] for n in names})
    extra_records = {name: _copy_extra(root, name, source) for name, source in extras.items()}
    manifest = _build_manifest(
        layout=layout, tensors_of=tensors_of, sharding=sharding, aliases=aliases, parts=parts,
        quantization=quantization or Quantization(), logical=logical or {},
        metadata=metadata or {}, extensions=extensions or {}, extras=extra_records,
        file_records=file_records,
    )
    _refuse_invalid(manifest)
    commit_manifest(root, manifest.to_json())
    return manifest


def _check_states(states: Mapping[int, StateDict], layout: Layout) -> dict[int, dict[str, Any]]:
    expected = set(range(layout.size))
    if set(states) != expected:
        raise ValueError(f"states must have one state dict per rank 0..{layout.size - 1} "
                         f"(SPEC 5.3); got ranks {sorted(states)}")
    out: dict[int, dict[str, Any]] = {}
    for rank in sorted(states):
        out[rank] = {}
        for name, tensor in states[rank].items():
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"rank {rank}, tensor {name!r}: expected a torch.Tensor, got "
                                f"{type(tensor).__name__}")
            if not isinstance(name, str) or not name or name == "__metadata__":
                raise ValueError(f"rank {rank}: {name!r} is not a valid tensor name (SPEC 7.1)")
            spec_shape(tensor)  # raises for a dtype the format cannot hold
            out[rank][name] = tensor
    return out


def _storage_key(tensor: torch.Tensor) -> tuple[Any, ...] | None:
    if tensor.numel() == 0:
        return None
    return (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
            tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)


def _find_aliases(tensors_of: Mapping[int, Mapping[str, torch.Tensor]]) -> dict[str, str]:
    """alias -> target where the two are the same view on every rank holding either (SPEC 7.6)."""
    holders: dict[str, set[int]] = {}
    found_on: dict[int, dict[str, str]] = {}
    for rank, tensors in tensors_of.items():
        first_with: dict[tuple[Any, ...], str] = {}
        found_on[rank] = {}
        for name, tensor in tensors.items():
            holders.setdefault(name, set()).add(rank)
            key = _storage_key(tensor)
            if key is None:
                continue
            if key in first_with:
                found_on[rank][name] = first_with[key]
            else:
                first_with[key] = name
    candidates = {a: t for found in found_on.values() for a, t in found.items()}
    return {
        alias: target
        for alias, target in candidates.items()
        if holders[alias] == holders[target]
        and all(found_on[r].get(alias) == target for r in holders[alias])
    }


def _nbytes(tensor: torch.Tensor) -> int:
    dtype, shape = spec_shape(tensor)
    return byte_size(dtype, shape) or 0


def _assign_parts(
    names: list[str], tensors: Mapping[str, torch.Tensor], max_file_size: int
) -> list[list[str]]:
    """Greedy split into parts of at most ``max_file_size`` data bytes; always one part."""
    parts: list[list[str]] = [[]]
    size = 0
    for name in names:
        nbytes = _nbytes(tensors[name])
        if parts[-1] and size + nbytes > max_file_size:
            parts.append([])
            size = 0
        parts[-1].append(name)
        size += nbytes
    return parts


def _build_manifest(
    *,
    layout: Layout,
    tensors_of: Mapping[int, Mapping[str, torch.Tensor]],
    sharding: Mapping[int, Mapping[str, Shard]],
    aliases: Mapping[str, str],
    parts: Mapping[int, list[list[str]]],
    quantization: Quantization,
    logical: Mapping[str, Logical],
    metadata: Mapping[str, str],
    extensions: Mapping[str, Mapping[str, Any]],
    extras: Mapping[str, FileRecord],
    file_records: Mapping[str, FileRecord],
) -> Manifest:
    placeholder = {"sha256": "0" * 64}
    file_of: dict[tuple[int, str], str] = {}
    ranks = []
    for rank in range(layout.size):
        names = [data_file_name(layout, rank, p) for p in range(len(parts[rank]))]
        for file_name, part in zip(names, parts[rank], strict=True):
            file_of.update({(rank, tensor): file_name for tensor in part})
        ranks.append(RankRecord(
            rank=rank, **layout.coordinates(rank),
            files=tuple(file_records.get(n, FileRecord(path=n, size=0, checksums=placeholder))
                        for n in names)))
    tensors: dict[str, TensorRecord | Alias] = {}
    for rank in range(layout.size):
        for name in tensors_of[rank]:
            if name in tensors:
                continue
            if name in aliases:
                tensors[name] = Alias(alias_of=aliases[name])
                continue
            tensors[name] = _tensor_record(name, tensors_of, sharding, file_of, logical)
    return Manifest(
        format_version=format_version(), layout=layout, ranks=tuple(ranks),
        quantization=quantization, tensors=tensors, extra_files=tuple(extras.values()),
        metadata=dict(metadata), extensions=dict(extensions),
        generator=f"shardspec {__version__}",
    )


def _tensor_record(
    name: str,
    tensors_of: Mapping[int, Mapping[str, torch.Tensor]],
    sharding: Mapping[int, Mapping[str, Shard]],
    file_of: Mapping[tuple[int, str], str],
    logical: Mapping[str, Logical],
) -> TensorRecord:
    holders = [r for r in sorted(tensors_of) if name in tensors_of[r]]
    dtypes = {spec_shape(tensors_of[r][name])[0].name for r in holders}
    if len(dtypes) != 1:
        raise ValueError(f"tensor {name!r} has dtypes {sorted(dtypes)} on different ranks; "
                         "one tensor has one dtype (SPEC 7.1)")
    shards = {r: sharding.get(r, {}).get(name) for r in holders}
    given = [r for r, s in shards.items() if s is not None]
    if given and len(given) != len(holders):
        missing = sorted(set(holders) - set(given))
        raise ValueError(f"tensor {name!r} has a Shard on ranks {given} but not on {missing}: "
                         "give every rank's piece a Shard, or none for a rank-local tensor")
    global_shapes = {tuple(s.global_shape) for s in shards.values() if s is not None}
    if len(global_shapes) > 1:
        raise ValueError(f"tensor {name!r}: the ranks' Shards disagree on the global shape: "
                         f"{sorted(global_shapes)}")
    pieces = []
    for rank in holders:
        shape = spec_shape(tensors_of[rank][name])[1]
        shard = shards[rank]
        pieces.append(Piece(
            rank=rank, file=file_of[(rank, name)], shape=shape,
            offset=None if shard is None else tuple(shard.offset),
            replica=0 if shard is None else shard.replica))
    return TensorRecord(
        dtype=dtypes.pop(),
        shape=global_shapes.pop() if global_shapes else None,
        pieces=tuple(pieces),
        logical=logical.get(name),
    )


def _refuse_invalid(manifest: Manifest) -> None:
    """The writer never commits a manifest its own reader would refuse."""
    data = manifest.to_dict()
    raise_first_error(schema_findings(data))
    raise_first_error(check_manifest(manifest))


def _prepare_directory(root: Path, overwrite: bool) -> None:
    """Create ``root``, or empty it of a previous checkpoint when ``overwrite`` (SPEC 10.2)."""
    if root.exists() and not root.is_dir():
        raise NotADirectoryError(f"{root} exists and is not a directory")
    root.mkdir(parents=True, exist_ok=True)
    existing = [p.name for p in root.iterdir()]
    if not existing:
        return
    if not overwrite:
        raise FileExistsError(f"{root} is not empty; pass overwrite=True to replace the "
                              "checkpoint in it")
    previous = read_manifest(root).manifest if MANIFEST_NAME in existing else None
    uncommit(root)  # from here on a crash leaves no manifest, never a stale one
    stale = set()
    if previous is not None:
        stale |= {f.path for r in previous.ranks for f in r.files}
        stale |= {f.path for f in previous.extra_files}
    pattern = re.compile(r"^model-rank-\d+-.*\.safetensors$|^\..*" + re.escape(TEMP_SUFFIX) + "$")
    stale |= {name for name in existing if pattern.match(name)}
    for name in sorted(stale):
        try:
            resolve_inside(root, name).unlink()
        except Exception:  # noqa: BLE001 - a stale file that cannot be resolved is left alone
            continue
    fsync_dir(root)


def _write_data_file(path: Path, tensors: Mapping[str, torch.Tensor]) -> FileRecord:
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

    write_durably(path, write)
    _make_readable(path)
    with path.open("rb") as handle:
        digests, size = digest_stream(handle)
    return FileRecord(path=path.name, size=size, checksums=digests)


def _make_readable(path: Path) -> None:
    """Give a written file the usual permissions (the creating library may use 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)


def _extra_sources(
    extra_files: Mapping[str, str | os.PathLike[str]] | Iterable[str | os.PathLike[str]],
) -> dict[str, Path]:
    if isinstance(extra_files, Mapping):
        return {str(name): Path(source) for name, source in extra_files.items()}
    return {Path(source).name: Path(source) for source in extra_files}


def _copy_extra(root: Path, name: str, source: Path) -> FileRecord:
    target = root / name
    target.parent.mkdir(parents=True, exist_ok=True)
    def copy(temp: Path) -> None:
        shutil.copyfile(source, temp)

    write_durably(target, copy)
    fsync_dir(target.parent)
    with target.open("rb") as handle:
        digests, size = digest_stream(handle)
    return FileRecord(path=name, size=size, checksums=digests)
