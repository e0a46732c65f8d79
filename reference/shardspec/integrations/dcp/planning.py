"""DCP chunks <-> shardspec pieces: what each rank writes, and what a manifest tells DCP.

torch.distributed.checkpoint describes a save as *write items*: a chunk (global offset and
sizes) of a tensor's global shape, or a serialized object. Its planner removes duplicates
(the chunks of a replicated tensor, a plain tensor every rank holds) so that one rank writes
each; shardspec records every copy as a replica (SPEC 7.4), so that a rank of the checkpoint's
layout finds all it holds in its own files. Each rank therefore describes its chunks *before*
the planner removes duplicates (:func:`describe_plan`), and the coordinator numbers the copies
(:func:`assign_pieces`).

On load, a manifest becomes DCP's :class:`~torch.distributed.checkpoint.metadata.Metadata`
(:func:`dcp_metadata`): one chunk per replica-0 piece, so DCP's planner asks for the overlap of
each target chunk with the pieces, and the reader reads those byte ranges only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import SavePlan, WriteItem, WriteItemType

from ...format.dcp_objects import OBJECTS_KEY, parse_objects  # re-exported: DCP's names
from ...format.dtypes import DTYPES, byte_size, from_torch
from ...format.joins import Join, join_of
from ...format.manifest import Alias, Manifest, Piece, TensorRecord
from ...write.save import RankInfo, TensorInfo
from ...write.shards import Shard

__all__ = [
    "OBJECTS_KEY",
    "Assignment",
    "LocalChunk",
    "LocalPlan",
    "assign_pieces",
    "dcp_metadata",
    "describe_plan",
    "objects_file_name",
    "parse_objects",
]

def objects_file_name(rank: int) -> str:
    """The extra file (SPEC 2.1) holding rank ``rank``'s serialized non-tensor values."""
    return f"dcp-objects-rank-{rank}.bin"


@dataclass(frozen=True)
class LocalChunk:
    """One tensor chunk a rank holds, in spec terms (the dtype's name, element offsets)."""

    name: str
    dtype: str
    global_shape: tuple[int, ...]
    offset: tuple[int, ...]
    shape: tuple[int, ...]


@dataclass(frozen=True)
class LocalPlan:
    """What one rank holds, before DCP's planner drops the copies other ranks also hold."""

    rank: int
    chunks: tuple[LocalChunk, ...]
    objects: tuple[str, ...]


@dataclass
class Assignment:
    """What the coordinator tells one rank to write."""

    #: data file -> the chunks it holds, as (tensor name, chunk offset), in the order the
    #: manifest draft places them
    files: dict[str, list[tuple[str, tuple[int, ...]]]] = field(default_factory=dict)
    #: names of the non-tensor values this rank writes, and the extra file they go to
    objects: list[str] = field(default_factory=list)
    objects_file: str | None = None


def describe_plan(rank: int, plan: SavePlan) -> LocalPlan:
    """A rank's local save plan as chunks and object names; refuses what SPEC 6.4 cannot hold."""
    chunks: list[LocalChunk] = []
    objects: list[str] = []
    for item in plan.items:
        name = item.index.fqn
        if item.type == WriteItemType.BYTE_IO:
            objects.append(name)
            continue
        data = item.tensor_data
        assert data is not None, "a tensor write item carries its chunk"
        dtype = from_torch(data.properties.dtype)  # ValueError naming the dtype
        if dtype.per_torch_element != 1:
            raise ValueError(f"tensor {name!r}: {data.properties.dtype} packs several elements "
                             "in one torch element; save it as uint8 bytes instead (SPEC 6.5)")
        chunks.append(LocalChunk(name, dtype.name, tuple(data.size),
                                 tuple(data.chunk.offsets), tuple(data.chunk.sizes)))
    return LocalPlan(rank, tuple(chunks), tuple(objects))


def assign_pieces(
    locals_: Sequence[LocalPlan], kept: Sequence[Sequence[WriteItem]], replicas: bool
) -> tuple[list[RankInfo], list[list[str]]]:
    """Every rank's pieces (as :class:`RankInfo` for :func:`shardspec.write.save.plan_checkpoint`)
    and the objects each rank writes.

    ``kept[r]`` are the items DCP's planner left rank r. With ``replicas``, every copy of a
    chunk is a piece, numbered 0, 1, ... in rank order (SPEC 7.4); without, only the kept one.
    Empty chunks of a non-empty tensor (FSDP's ranks past the last row) are no piece; a tensor
    with no element keeps one piece. A rank holding several chunks of one tensor (a
    ``ShardedTensor`` with several local shards) holds several pieces of it, each in a file of
    its own, its value their join (SPEC 7.2 rules 3, 6, 7); chunks that cannot be joined along
    one dimension are refused (:class:`ValueError` naming the tensor and the rank), before
    anything is written.
    """
    kept_keys = [{(i.index.fqn, tuple(i.index.offset or ())) for i in items
                  if i.type != WriteItemType.BYTE_IO} for items in kept]
    for local in locals_:  # refuse first: every chunk a rank holds, whichever copies it writes
        held: dict[str, list[LocalChunk]] = {}
        for chunk in local.chunks:
            if not _empty(chunk):
                held.setdefault(chunk.name, []).append(chunk)
        for name, chunks in held.items():
            if len(chunks) > 1:
                _join(local.rank, name, chunks)
    copies: dict[tuple[str, tuple[int, ...]], list[int]] = {}
    for local in locals_:
        for chunk in local.chunks:
            writes = replicas or (chunk.name, chunk.offset) in kept_keys[local.rank]
            if writes and not _empty(chunk):
                copies.setdefault((chunk.name, chunk.offset), []).append(local.rank)
    for local in locals_:  # a tensor without elements still needs a record: one piece
        for chunk in local.chunks:
            if math.prod(chunk.global_shape) == 0 and not any(
                    key[0] == chunk.name for key in copies):
                copies[(chunk.name, chunk.offset)] = [local.rank]
    infos: list[RankInfo] = []
    for local in locals_:
        mine: dict[str, list[LocalChunk]] = {}
        for chunk in local.chunks:
            if local.rank in copies.get((chunk.name, chunk.offset), ()):
                mine.setdefault(chunk.name, []).append(chunk)
        tensors: dict[str, TensorInfo] = {}
        for name, chunks in mine.items():
            shape = chunks[0].shape
            if len(chunks) > 1:  # in join order: the k-th piece goes to the k-th run of files
                join = _join(local.rank, name, chunks)
                chunks, shape = [chunks[int(p.file)] for p in join.pieces], join.shape
            shards = tuple(Shard(c.global_shape, c.offset,
                                 copies[(name, c.offset)].index(local.rank), c.shape)
                           for c in chunks)
            nbytes = byte_size(DTYPES[chunks[0].dtype], shape) or 0
            tensors[name] = TensorInfo(chunks[0].dtype, shape, nbytes,
                                       shards[0] if len(shards) == 1 else shards)
        infos.append(RankInfo(local.rank, tensors, {}))
    objects = [[i.index.fqn for i in items if i.type == WriteItemType.BYTE_IO] for items in kept]
    return infos, objects


def _empty(chunk: LocalChunk) -> bool:
    """An empty chunk of a tensor that has elements: no piece."""
    return math.prod(chunk.shape) == 0 and math.prod(chunk.global_shape) > 0


def _join(rank: int, name: str, chunks: Sequence[LocalChunk]) -> Join:
    """The join of one rank's chunks of a tensor (SPEC 7.2 rule 7), or a ValueError saying why
    there is none."""
    pieces = [Piece(rank=rank, file=str(i), shape=c.shape, offset=c.offset)
              for i, c in enumerate(chunks)]
    join = join_of(pieces)
    if isinstance(join, str):
        boxes = ", ".join(f"offset {list(c.offset)} size {list(c.shape)}" for c in chunks)
        raise ValueError(
            f"rank {rank} holds {len(chunks)} chunks of tensor {name!r} ({boxes}) that cannot "
            f"be joined along one dimension: {join}. A rank's pieces of one tensor must have "
            "the same offset and size in every dimension but one, and not overlap in it (SPEC "
            "7.2 rule 7); shard the tensor so that each rank's chunks lie along one dimension")
    return join


def dcp_metadata(manifest: Manifest, checkpoint_id: str) -> Metadata:
    """DCP's view of a checkpoint: every global tensor with its replica-0 pieces as chunks,
    an alias as its target, each indexed object as bytes (the index checked first: a
    :class:`~shardspec.ShardspecError` names the entry and field it refuses).

    Rank-local tensors (SPEC 7.5) are no slice of a global tensor and sub-byte tensors have no
    torch dtype of one element each: DCP cannot ask for them, so they are left out.
    """
    out: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {}
    for name, record in manifest.tensors.items():
        target = record
        if isinstance(target, Alias):
            target = manifest.tensors[target.alias_of]
        assert isinstance(target, TensorRecord)
        dtype = DTYPES[target.dtype]
        if target.shape is None or dtype.torch_dtype is None or dtype.per_torch_element != 1:
            continue
        chunks = [ChunkStorageMetadata(torch.Size(p.offset or ()), torch.Size(p.shape))
                  for p in target.pieces if p.replica == 0]
        out[name] = TensorStorageMetadata(TensorProperties(dtype=dtype.torch_dtype),
                                          torch.Size(target.shape), chunks)
    for name in parse_objects(manifest):
        out[name] = BytesStorageMetadata()
    return Metadata(state_dict_metadata=out, storage_meta=StorageMeta(checkpoint_id=checkpoint_id))


def objects_index(entries: Mapping[str, tuple[str, int, int]]) -> str:
    """The JSON text stored under :data:`OBJECTS_KEY`, sorted so equal saves write equal bytes."""
    return json.dumps({k: list(v) for k, v in sorted(entries.items())}, separators=(",", ":"))
