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
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from ...format.dcp_objects import OBJECTS_KEY, parse_objects
from ...format.dtypes import DTYPES
from ...format.errors import Finding, IntegrityError, RequestError, ShardspecError
from ...format.integrity import Digests, check_digests
from ...format.limits import MANIFEST_NAME
from ...format.manifest import Alias, FileRecord, Manifest, Piece, TensorRecord
from ...reader import Checkpoint, open_checkpoint
from ...reshard.boxes import ReadStats
from ...reshard.load import LOCAL_GAP_BUDGET, REMOTE_GAP_BUDGET, execute_reshard
from ...reshard.plan import ReshardPlan, SourcePiece, TargetPiece
from ...storage.location import Location, PathOrURL
from ...storage.paths import open_inside
from ...storage.remote import RemoteRoot, is_remote
from ...storage.remote_files import RemoteObject
from .planning import dcp_metadata

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

    Non-tensor values are pickles (DCP serializes them with ``torch.save``), read from their
    byte ranges only. By default each is unpickled with ``torch.load(weights_only=True)``
    (tensors, numbers, strings, containers, and classes given to
    ``torch.serialization.add_safe_globals``), re-serialized, and only that handed to DCP's
    planner, which unpickles with ``weights_only=False``: the checkpoint's own pickle never
    reaches it. One that needs more is refused (:class:`shardspec.RequestError`) naming its
    key. ``trust_objects=True`` hands the checkpoint's pickles to the planner as they are, as
    DCP's own readers do: code in them runs in every rank that loads them; only for
    checkpoints you trust. ``verify`` does not make a checkpoint trustworthy: its digests are
    the writer's.
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
        trust_objects: bool = False,
    ) -> None:
        super().__init__()
        self.path: PathOrURL = path
        self.verify = verify
        self.trust_objects = trust_objects
        self.gap_budget = gap_budget
        self.remote_gap_budget = remote_gap_budget
        self.ignore_extensions = ignore_extensions
        self.storage_options = storage_options
        self.stats = ReadStats()
        #: bytes read for non-tensor values (their ranges; whole files when verifying), not in
        #: ``stats``, which counts tensors
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
        manifest; DCP's fallback to per-rank metadata does not apply.)

        DCP turns any exception raised here into its own ``AssertionError("metadata is
        None")``. A checkpoint refused (a :class:`shardspec.ShardspecError`: no manifest, a
        broken objects index) is therefore returned inside an empty metadata and raised by
        :meth:`set_up_storage_reader`, which DCP calls next, so that ``dcp.load`` fails with
        it, its code and its SPEC section."""
        try:
            return dcp_metadata(self.checkpoint.manifest, str(self.path))
        except ShardspecError as exc:
            return Metadata(state_dict_metadata={}, storage_data=_Refused(exc))

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        """Raise the error :meth:`read_metadata` found, if any."""
        if isinstance(metadata.storage_data, _Refused):
            raise metadata.storage_data.error
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
        """Serialized non-tensor values: the byte ranges of the extra files the index names."""
        manifest = checkpoint.manifest
        index = parse_objects(manifest)
        records = {f.path: f for f in manifest.extra_files}
        by_file: dict[str, list[ReadItem]] = {}
        for item in items:
            by_file.setdefault(index[item.storage_index.fqn].path, []).append(item)
        for path, its in by_file.items():
            ranges = [(index[i.storage_index.fqn].offset, index[i.storage_index.fqn].length)
                      for i in its]
            blobs, read = read_ranges(checkpoint.path, records[path], ranges, self.verify)
            self.object_bytes += read
            for item, blob in zip(its, blobs, strict=True):
                planner.load_bytes(item, self._object_stream(item.storage_index.fqn, blob))

    def _object_stream(self, name: str, data: bytes) -> io.BytesIO:
        """What DCP's planner unpickles (with ``weights_only=False``) for object ``name``: the
        checkpoint's pickle when trusted, else the value unpickled with ``weights_only=True``
        and pickled again by ``torch.save`` here."""
        if self.trust_objects:
            return io.BytesIO(data)
        try:
            value = torch.load(io.BytesIO(data), weights_only=True)
        except Exception as exc:  # noqa: BLE001 - torch.load raises many kinds; all refuse
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RequestError(Finding(
                code="reshard-unsupported", file=MANIFEST_NAME,
                json_path=f"$.metadata[{OBJECTS_KEY!r}][{name!r}]",
                message=f"the non-tensor value {name!r} is a pickle that "
                f"torch.load(weights_only=True) refuses ({reason[:300]}); unpickling it as DCP "
                "does (weights_only=False) would run whatever code it names",
                hint="only for a checkpoint you trust: Reader(..., trust_objects=True), or "
                "allow its classes with torch.serialization.add_safe_globals")) from None
        safe = io.BytesIO()
        torch.save(value, safe)
        safe.seek(0)
        return safe


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
    holds one chunk of a tensor, so this is one round; a ``ShardedTensor`` with several local
    shards, or an alias asked for beside its target, takes more). The source side needs no
    rounds: DCP's items name the stored pieces by their global offsets, whichever ranks, and
    however many per rank, hold them."""
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


@dataclass(frozen=True)
class _Refused:
    """Metadata's ``storage_data`` when :meth:`Reader.read_metadata` refused the checkpoint."""

    error: ShardspecError


#: Bytes read at a time while an objects file is hashed: memory stays bounded by the objects
#: wanted plus this, whatever the file's size.
_CHUNK = 1024 * 1024


def read_ranges(
    root: Location, record: FileRecord, ranges: Sequence[tuple[int, int]], verify: bool
) -> tuple[list[bytes], int]:
    """The bytes of ``ranges`` (offset, length) of one listed file, and how many bytes were read.

    Without ``verify``: each range alone (a positioned read; a ranged request in object
    storage), the file's size checked first (SPEC 9.1). With it: the whole file streamed
    through its digests (SPEC 9.2: they cover the whole file) a chunk at a time, each range
    kept as it passes, so the bytes returned are the bytes verified, and none is returned
    before the file is.
    """
    if isinstance(root, RemoteRoot):
        source = RemoteObject(root, record.path, record.size)
        if verify:
            out, read = _captured(source.stream(0, record.size), record, ranges)
        else:
            out = [source.read(offset, offset + length) if length else b""
                   for offset, length in ranges]
            read = sum(len(data) for data in out)
        source.finish()  # SPEC 9.3: the bytes read are of one version of the object
        return out, read
    handle, actual = open_inside(root, record.path)
    with handle:
        if actual != record.size:
            raise IntegrityError(Finding(
                code="file-size", file=record.path,
                message=f"the file has {actual} bytes, the manifest says {record.size}"))
        if verify:
            return _captured(_chunks(handle), record, ranges)
        out = [_read_at(handle, record.path, offset, length) for offset, length in ranges]
        return out, sum(length for _, length in ranges)


def _chunks(handle: io.FileIO) -> Iterator[memoryview]:
    """A file's bytes from the start, in one reused buffer of :data:`_CHUNK` bytes."""
    buffer = memoryview(bytearray(_CHUNK))
    while got := handle.readinto(buffer):
        yield buffer[:got]


def _captured(
    chunks: Iterable[bytes | memoryview], record: FileRecord, ranges: Sequence[tuple[int, int]]
) -> tuple[list[bytes], int]:
    """Feed ``chunks`` (a whole file, in order) to its digests, keeping ``ranges``; check both."""
    digests = Digests(record.checksums)
    kept = [bytearray(length) for _, length in ranges]
    position = 0
    for chunk in chunks:
        digests.update(chunk)
        end = position + len(chunk)
        for (offset, length), buffer in zip(ranges, kept, strict=True):
            low, high = max(offset, position), min(offset + length, end)
            if low < high:
                buffer[low - offset : high - offset] = chunk[low - position : high - position]
        position = end
    if position != record.size:
        raise IntegrityError(Finding(
            code="file-size", file=record.path,
            message=f"read {position} bytes, the manifest says {record.size}"))
    check_digests(record.path, record.checksums, digests.hexdigests())
    return [bytes(buffer) for buffer in kept], position


def _read_at(handle: io.FileIO, path: str, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset``; a file that ends sooner is ``file-size`` (SPEC 9.1)."""
    buffer = bytearray(length)
    view, done = memoryview(buffer), 0
    while done < length:
        got = os.preadv(handle.fileno(), [view[done:]], offset + done)
        if not got:
            raise IntegrityError(Finding(
                code="file-size", file=path,
                message=f"the file ends before byte {offset + length}, where the manifest's "
                "objects index and size place its last object"))
        done += got
    return bytes(buffer)
