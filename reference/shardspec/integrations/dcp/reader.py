"""``dcp.load`` from a shardspec checkpoint: a :class:`torch.distributed.checkpoint.StorageReader`.

Any checkpoint loads: one written through :class:`~shardspec.integrations.dcp.writer.Writer`,
by :func:`shardspec.save`, or converted from Hugging Face. The manifest, checked like every
reader checks it, becomes DCP's metadata (one chunk per replica-0 piece); DCP's planner then
asks each rank for the overlap of its target chunks with those pieces, and the reader reads
exactly those byte ranges with the resharding reader's machinery
(:func:`shardspec.reshard.load.execute_reshard`: files opened and checked by SPEC 2.2, 6.3, 7.2
and 9.1, runs of bytes coalesced into ``preadv`` calls, ranged requests in object storage,
whole-file checksums when ``verify``).
"""

from __future__ import annotations

import io
import os
from collections.abc import Collection
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from ...format.dtypes import DTYPES
from ...format.errors import Finding, IntegrityError, RequestError
from ...format.integrity import digest_stream
from ...format.limits import MANIFEST_NAME
from ...format.manifest import Alias, Manifest, Piece, TensorRecord
from ...reader import Checkpoint, open_checkpoint
from ...reshard.boxes import ReadStats
from ...reshard.load import LOCAL_GAP_BUDGET, REMOTE_GAP_BUDGET, execute_reshard
from ...reshard.plan import ReshardPlan, SourcePiece, TargetPiece
from ...storage.location import PathOrURL
from ...storage.paths import open_inside
from ...storage.remote import RemoteRoot, is_remote
from .planning import dcp_metadata, parse_objects

__all__ = ["Reader"]


class Reader(StorageReader):
    """Read a shardspec checkpoint at ``path`` (a directory or an object-storage URL) for
    ``dcp.load``, into any sharding of the state dict.

    ``verify`` checks the sha256 of every file a rank reads from (whole files: SPEC 9.2 digests
    cover whole files, so verifying reads them in full). A state dict tensor whose dtype differs
    from the checkpoint's is refused (:class:`shardspec.RequestError`) naming the tensor; DCP's
    planner refuses a different shape before the reader sees the request. Runs of wanted bytes
    are read together across the gaps between them while the bytes read beyond the wanted ones
    stay within ``gap_budget`` x the wanted bytes of a local file (default 0.1);
    ``gap_budget=None`` reads every gap under 1 MiB (fewer, longer reads, more bytes).
    ``remote_gap_budget`` is the same bound in object storage (default 1.0: there a request
    costs a round trip, a gap only its bytes). ``stats`` counts
    the tensor bytes this rank read (headers, data, verification), across loads.
    """

    def __init__(
        self,
        path: PathOrURL,
        *,
        verify: bool = False,
        gap_budget: float | None = LOCAL_GAP_BUDGET,
        remote_gap_budget: float = REMOTE_GAP_BUDGET,
        ignore_extensions: Collection[str] = (),
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.path: PathOrURL = path
        self.verify = verify
        self.gap_budget = gap_budget
        self.remote_gap_budget = remote_gap_budget
        self.ignore_extensions = ignore_extensions
        self.storage_options = storage_options
        self.stats = ReadStats()
        #: bytes of serialized non-tensor values read (not in ``stats``, which counts tensors)
        self.object_bytes = 0
        self._checkpoint: Checkpoint | None = None

    @property
    def checkpoint(self) -> Checkpoint:
        """The opened checkpoint (its manifest checked), opened on first use."""
        if self._checkpoint is None:
            self._checkpoint = open_checkpoint(self.path, ignore_extensions=self.ignore_extensions,
                                               storage_options=self.storage_options)
        return self._checkpoint

    # -- DCP's protocol ------------------------------------------------------------------------

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None and checkpoint_id != self.path:
            self.path = checkpoint_id
            self._checkpoint = None

    def read_metadata(self) -> Metadata:
        """The manifest as DCP's metadata. (No ``rank`` argument: every rank reads the one
        manifest; DCP's fallback to per-rank metadata does not apply.)"""
        return dcp_metadata(self.checkpoint.manifest, str(self.path))

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """A URL, or a directory holding ``shardspec.json``."""
        if isinstance(checkpoint_id, str) and is_remote(checkpoint_id):
            return True
        return os.path.isfile(os.path.join(os.fspath(checkpoint_id), MANIFEST_NAME))

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read the byte ranges ``plan`` asks for into the planner's tensors."""
        checkpoint = self.checkpoint
        manifest = checkpoint.manifest
        tensor_items = [i for i in plan.items if i.type == LoadItemType.TENSOR]
        for item in tensor_items:  # refuse before reading anything
            _check_dtype(manifest, item, planner.resolve_tensor(item))
        for round_items in _rounds(manifest, tensor_items):
            self._read_round(checkpoint, round_items, planner)
        objects = [i for i in plan.items if i.type == LoadItemType.BYTE_IO]
        if objects:
            self._read_objects(checkpoint, objects, planner)
        future: Future[None] = Future()
        future.set_result(None)
        return future

    # -- reading -------------------------------------------------------------------------------

    def _read_round(
        self, checkpoint: Checkpoint, items: list[ReadItem], planner: LoadPlanner
    ) -> None:
        """Items of distinct tensors: each tensor's target chunk is one target piece whose
        sources are the pieces DCP's items name, read by the resharding reader."""
        manifest = checkpoint.manifest
        by_stored: dict[str, list[ReadItem]] = {}
        for item in items:
            by_stored.setdefault(_stored_name(manifest, item.storage_index.fqn), []).append(item)
        pieces: dict[str, TargetPiece] = {}
        for stored, its in by_stored.items():
            record = manifest.tensors[stored]
            assert isinstance(record, TensorRecord) and record.shape is not None
            primaries = {p.offset: p for p in record.pieces if p.replica == 0}
            target_offset = tuple(its[0].dest_index.offset or ())
            # the chunk's shape: DCP's items for one chunk cover it, so their far corner
            ends = [[o + n for o, n in zip(i.dest_offsets, i.lengths, strict=True)] for i in its]
            shape = tuple(max(dims) for dims in zip(*ends, strict=True))
            sources = []
            for item in its:
                piece: Piece = primaries[tuple(item.storage_index.offset or ())]
                assert piece.offset is not None
                box = tuple(p + s for p, s in zip(piece.offset, item.storage_offsets, strict=True))
                sources.append(SourcePiece(piece.rank, piece.file, piece.offset, piece.shape,
                                           box, tuple(item.lengths)))
            pieces[stored] = TargetPiece(record.dtype, record.shape, target_offset, shape, 0,
                                         tuple(sources))
        reshard = ReshardPlan(rank=-1, layout=manifest.layout, pieces=pieces, aliases={})
        read = execute_reshard(checkpoint.path, manifest, reshard, torch.device("cpu"),
                               verify=self.verify, stats=self.stats, separate=True,
                               gap_budget=self.remote_gap_budget,
                               local_gap_budget=self.gap_budget)
        for stored, its in by_stored.items():
            for item in its:
                value = read[stored]
                for dim, (start, length) in enumerate(zip(item.dest_offsets, item.lengths,
                                                          strict=True)):
                    value = value.narrow(dim, start, length)
                target = planner.resolve_tensor(item).detach()
                target.copy_(value)
                planner.commit_tensor(item, target)

    def _read_objects(
        self, checkpoint: Checkpoint, items: list[ReadItem], planner: LoadPlanner
    ) -> None:
        """Serialized non-tensor values: ranges of the extra files the writer indexed."""
        index = parse_objects(checkpoint.manifest)
        records = {f.path: f for f in checkpoint.manifest.extra_files}
        contents: dict[str, bytes] = {}
        for item in items:
            path, offset, length = index[item.storage_index.fqn]
            if path not in contents:
                contents[path] = _read_whole(checkpoint.path, path, records[path].size,
                                             records[path].checksums["sha256"], self.verify)
                self.object_bytes += len(contents[path])
            planner.load_bytes(item, io.BytesIO(contents[path][offset : offset + length]))


def _stored_name(manifest: Manifest, name: str) -> str:
    record = manifest.tensors[name]
    return record.alias_of if isinstance(record, Alias) else name


def _check_dtype(manifest: Manifest, item: ReadItem, target: torch.Tensor) -> None:
    name = item.dest_index.fqn
    record = manifest.tensors[_stored_name(manifest, item.storage_index.fqn)]
    assert isinstance(record, TensorRecord)
    stored = DTYPES[record.dtype].torch_dtype
    if target.dtype != stored:
        raise RequestError(Finding(
            code="reshard-unsupported", tensor=name, file=MANIFEST_NAME,
            message=f"the checkpoint holds {record.dtype} ({stored}) but the state dict's "
            f"tensor is {target.dtype}; load into a {stored} tensor and convert after"))


def _rounds(manifest: Manifest, items: list[ReadItem]) -> list[list[ReadItem]]:
    """Split items so that each round reads one target chunk per stored tensor (a rank normally
    holds one chunk of a tensor, so this is one round; an alias asked for beside its target
    takes a second)."""
    chunk_of: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
    rounds: list[list[ReadItem]] = []
    for item in items:
        chunks = chunk_of.setdefault(_stored_name(manifest, item.storage_index.fqn), [])
        key = (item.dest_index.fqn, tuple(item.dest_index.offset or ()))
        if key not in chunks:
            chunks.append(key)
        number = chunks.index(key)
        while len(rounds) <= number:
            rounds.append([])
        rounds[number].append(item)
    return rounds


def _read_whole(root: Any, path: str, size: int, sha256: str, verify: bool) -> bytes:
    """A small extra file, read whole: its size checked (SPEC 9.1), its digest when asked."""
    if isinstance(root, RemoteRoot):
        data = root.read(path, 0, size) if size else b""
    else:
        handle, actual = open_inside(root, path)
        with handle:
            if actual != size:
                raise IntegrityError(Finding(
                    code="file-size", file=path,
                    message=f"the file has {actual} bytes, the manifest says {size}"))
            data = handle.read()
    if len(data) != size:
        raise IntegrityError(Finding(code="file-size", file=path,
                                     message=f"read {len(data)} bytes, the manifest says {size}"))
    if verify:
        digests, _ = digest_stream(io.BytesIO(data))
        if digests["sha256"] != sha256:
            raise IntegrityError(Finding(
                code="checksum-mismatch", file=path,
                message="the file's sha256 differs from the manifest's: it is corrupt or was "
                "changed"))
    return data
