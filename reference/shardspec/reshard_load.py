"""Resharding, the reads: a :class:`~shardspec.reshard_plan.ReshardPlan` -> tensors (SPEC 11.3).

Only the byte ranges of the source pieces that overlap a target piece are read, with
``os.preadv`` at their file offsets; runs less than :data:`COALESCE_GAP` apart are read as one,
and reads that follow each other in a file are gathered into one call. From object storage
(SPEC 2.4) the same runs become ranged requests, several in flight, and gaps are fetched only
while the bytes asked stay within :data:`REMOTE_GAP_BUDGET` of the bytes wanted.
A run that is contiguous both in its source entry and in its target piece (a column-parallel
slice, a replicated tensor) is read straight into the target's memory; others (a row-parallel
slice) are read into a scratch buffer and copied with one strided copy. Every source file is
opened by SPEC 2.2, its size checked against the manifest (9.1) and its header checked (6.3)
and compared with the manifest (7.2) before any of its data is read.

:func:`reshard` writes a whole resharded checkpoint, one target rank at a time.
"""

from __future__ import annotations

import itertools
import math
import os
import tempfile
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.lib.stride_tricks import as_strided

from .dtypes import DTYPES, torch_layout
from .errors import Finding, IntegrityError, ShardspecError, error_for
from .host_memory import fresh_buffer
from .integrity import Readable, digest_stream
from .location import Location, PathOrURL, locate
from .manifest import FileRecord, Layout, Manifest, TensorRecord
from .paths import open_inside, resolve_inside
from .plan import FilePlan, plan_ranks
from .reads import pread_into
from .remote import REQUEST_BYTES, RemoteRoot, is_remote
from .remote_files import PARTIAL_HEADER_PROBE, RemoteReader, open_object, remote_version
from .reshard_plan import Resharder, ReshardPlan, SourcePiece, TargetPiece
from .safetensors_header import Header, read_header
from .writer import (
    RankInfo,
    Shard,
    TensorInfo,
    commit_checkpoint,
    copy_extra_files,
    finish_manifest,
    plan_checkpoint,
    prepare_directory,
    write_rank,
)

__all__ = [
    "COALESCE_GAP",
    "READ_THREADS",
    "REMOTE_GAP_BUDGET",
    "ReadStats",
    "execute_reshard",
    "load_resharded",
    "rank_info",
    "reshard",
]

#: Runs of wanted bytes at most this far apart in a file are read with one read call: reading a
#: gap this small costs less than another request to the storage.
COALESCE_GAP = 1 << 20

#: From object storage, the gaps between wanted runs that are fetched anyway (one request
#: instead of two) add up to at most this fraction of the wanted bytes.
REMOTE_GAP_BUDGET = 0.1

#: Source files read at the same time.
READ_THREADS = 4

#: Each target tensor starts at a multiple of this in the rank's buffer.
_ALIGN = 64

#: Bytes -> the numpy type copies move them in.
_UNITS: dict[int, type[np.generic]] = {8: np.int64, 4: np.int32, 2: np.int16, 1: np.uint8}


@dataclass
class ReadStats:
    """What a resharding load read: counts, for benchmarks and tests."""

    #: source files opened, in order
    files_opened: list[str] = field(default_factory=list)
    #: bytes of length prefixes and headers read
    header_bytes: int = 0
    #: bytes of tensor data read (wanted bytes plus the coalesced gaps)
    data_bytes: int = 0
    #: bytes read to verify checksums (whole files; only with verify=True)
    verify_bytes: int = 0
    #: read calls for tensor data
    reads: int = 0
    #: bytes of the target pieces returned
    target_bytes: int = 0

    @property
    def bytes_read(self) -> int:
        return self.header_bytes + self.data_bytes + self.verify_bytes


def load_resharded(
    root: Path | RemoteRoot,
    manifest: Manifest,
    rank: int,
    layout: Layout,
    device: torch.device,
    *,
    verify: bool = False,
    stats: ReadStats | None = None,
    resharder: Resharder | None = None,
) -> dict[str, torch.Tensor]:
    """Load what ``rank`` of ``layout`` holds from the checkpoint at ``root`` (written with
    another layout), reading only the byte ranges that overlap it.

    ``verify`` hashes every source file the load reads from, whole (9.2 digests cover whole
    files), so it reads more than the partial reads alone. ``stats`` is filled in when given.
    """
    resharder = resharder or Resharder(manifest, layout)
    plan = resharder.plan(rank)
    return execute_reshard(root, manifest, plan, device, verify=verify, stats=stats)


def execute_reshard(
    root: Path | RemoteRoot,
    manifest: Manifest,
    plan: ReshardPlan,
    device: torch.device,
    *,
    verify: bool = False,
    stats: ReadStats | None = None,
    separate: bool = False,
    gap_budget: float | None = None,
) -> dict[str, torch.Tensor]:
    """Read ``plan``'s pieces onto ``device``; aliases share their target's storage.

    The pieces are filled in one host buffer (``separate``: one allocation per tensor, as a
    writer wants them), moved to ``device`` at the end. ``gap_budget`` (from object storage;
    default :data:`REMOTE_GAP_BUDGET`) bounds the gap bytes fetched to save requests.
    """
    budget = REMOTE_GAP_BUDGET if gap_budget is None else gap_budget
    stats = stats if stats is not None else ReadStats()
    stats.target_bytes += plan.target_bytes
    out = _allocate(plan.pieces, separate)
    jobs: dict[tuple[int, str], list[tuple[str, TargetPiece, SourcePiece]]] = {}
    for name, piece in plan.pieces.items():
        for source in piece.sources:
            jobs.setdefault((source.rank, source.file), []).append((name, piece, source))
    file_plans = {f.record.path: f  # one pass over the manifest for every source rank
                  for rank_plan in plan_ranks(manifest, sorted({r for r, _ in jobs}))
                  for f in rank_plan.files}
    work = [(file_plans[path], file_jobs, ReadStats())
            for (_, path), file_jobs in sorted(jobs.items())]

    def read(item: tuple[FilePlan, list[tuple[str, TargetPiece, SourcePiece]], ReadStats]
             ) -> None:
        _read_file(root, item[0], item[1], out, _Scratch(), item[2], verify, budget)

    # Files are read concurrently: reads of different files overlap each other and the copies
    # (preadv and numpy's copy release the GIL). Each file's boxes land in disjoint bytes.
    threads = min(READ_THREADS, len(work))
    if threads > 1:
        with ThreadPoolExecutor(threads, thread_name_prefix="shardspec-reshard") as pool:
            for _ in pool.map(read, work):
                pass
    else:
        for item in work:
            read(item)
    for _, _, file_stats in work:
        stats.files_opened += file_stats.files_opened
        stats.header_bytes += file_stats.header_bytes
        stats.data_bytes += file_stats.data_bytes
        stats.verify_bytes += file_stats.verify_bytes
        stats.reads += file_stats.reads
    return _finish(plan, out, device)


def _allocate(pieces: Mapping[str, TargetPiece], separate: bool) -> dict[str, torch.Tensor]:
    """Name -> a flat uint8 host tensor of the piece's bytes (uninitialised)."""
    sizes = {name: p.nbytes for name, p in pieces.items() if p.nbytes}
    if separate:
        return {name: fresh_buffer(size) for name, size in sizes.items()}
    offsets, total = {}, 0
    for name, size in sizes.items():
        offsets[name] = total
        total += -(-size // _ALIGN) * _ALIGN
    buffer = fresh_buffer(total)
    return {name: buffer[offsets[name] : offsets[name] + size] for name, size in sizes.items()}


def _finish(
    plan: ReshardPlan, out: dict[str, torch.Tensor], device: torch.device
) -> dict[str, torch.Tensor]:
    if device.type != "cpu" and out:
        first = next(iter(out.values()))
        base = first._base if first._base is not None else None
        if base is not None and all(t._base is base for t in out.values()):
            moved = base.to(device)  # one transfer for the whole rank
            out = {n: moved[t.storage_offset() : t.storage_offset() + t.numel()]
                   for n, t in out.items()}
        else:
            out = {n: t.to(device) for n, t in out.items()}
    tensors: dict[str, torch.Tensor] = {}
    for name, piece in plan.pieces.items():
        dtype, shape = torch_layout(DTYPES[piece.dtype], piece.shape)
        if name not in out:
            tensors[name] = torch.empty(shape, dtype=dtype, device=device)
        else:
            tensors[name] = out[name].view(dtype).reshape(shape)
    for alias, target in plan.aliases.items():
        tensors[alias] = tensors[target]
    return tensors


class _Scratch:
    """A reusable host buffer for reads that are copied, not read in place."""

    def __init__(self) -> None:
        self.buffer = torch.empty(0, dtype=torch.uint8)

    def get(self, size: int) -> torch.Tensor:
        if self.buffer.numel() < size:
            self.buffer = torch.empty(size, dtype=torch.uint8)
        return self.buffer[:size]


def _read_file(
    root: Path | RemoteRoot,
    plan: FilePlan,
    jobs: list[tuple[str, TargetPiece, SourcePiece]],
    out: dict[str, torch.Tensor],
    scratch: _Scratch,
    stats: ReadStats,
    verify: bool,
    gap_budget: float,
) -> None:
    if isinstance(root, RemoteRoot):
        _read_remote_file(root, plan, jobs, out, stats, verify, gap_budget)
        return
    record = plan.record
    handle, size = open_inside(root, record.path)
    with handle:
        stats.files_opened.append(record.path)
        if size != record.size:
            raise IntegrityError(Finding(
                code="file-size", file=record.path,
                message=f"the file has {size} bytes, the manifest says {record.size}"))
        header = read_header(handle, size, record.path)
        stats.header_bytes += header.data_start
        plan.check_header(header)
        if verify:
            handle.seek(0)
            _verify(handle, record, stats)
        reads = _Reads(handle.fileno(), stats, record.path)
        jobs = sorted(jobs, key=lambda job: header.entries[job[0]].begin)
        for name, target, source in jobs:
            _read_box(reads, header, name, target, source, out[name], scratch)
        reads.flush()


def _read_remote_file(
    root: RemoteRoot,
    plan: FilePlan,
    jobs: list[tuple[str, TargetPiece, SourcePiece]],
    out: dict[str, torch.Tensor],
    stats: ReadStats,
    verify: bool,
    gap_budget: float,
) -> None:
    """:func:`_read_file` of an object: the same checks, then every box's runs as ranged
    requests, and the object's version compared once they are in (SPEC 9.3)."""
    record = plan.record
    stats.files_opened.append(record.path)
    before, header, prefix = open_object(root, record.path, record.size, PARTIAL_HEADER_PROBE)
    stats.header_bytes += len(prefix)
    plan.check_header(header)
    if verify or not before.tag:  # no version to compare: the checksum decides (SPEC 9.3)
        _verify(RemoteReader(root, record.path, record.size), record, stats)
    reads = _RemoteReads(root, stats, record.path, prefix, gap_budget)
    for name, target, source in sorted(jobs, key=lambda job: header.entries[job[0]].begin):
        # Boxes read through a scratch buffer are copied after every request is in: each box
        # gets a scratch buffer of its own.
        _read_box(reads, header, name, target, source, out[name], _Scratch())
    reads.flush()
    root.check_unchanged(record.path, before)


def _verify(readable: Readable, record: FileRecord, stats: ReadStats) -> None:
    """Hash everything left in ``readable`` (a whole file): 9.2 digests cover whole files."""
    digests, count = digest_stream(readable)
    stats.verify_bytes += count
    if digests["sha256"] != record.checksums["sha256"]:
        raise IntegrityError(Finding(
            code="checksum-mismatch", file=record.path,
            message="the file's sha256 differs from the manifest's: it is corrupt or was "
            "changed"))


def _unsupported(name: str, message: str) -> ShardspecError:
    return error_for(Finding(code="reshard-unsupported", tensor=name, message=message))


def _geometry(
    name: str, bits: int, source: SourcePiece, target: TargetPiece
) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """Byte geometry of the copy: source shape, target shape, box shape, box offset in the
    source, box offset in the target, with trailing dims the box covers fully in both merged
    and the last dim counted in bytes."""
    src = list(source.piece_shape) or [1]
    dst = list(target.shape) or [1]
    box = list(source.box_shape) or [1]
    src_off = [b - o for b, o in zip(source.box_offset, source.piece_offset, strict=True)] or [0]
    dst_off = [b - o for b, o in zip(source.box_offset, target.offset, strict=True)] or [0]
    while len(box) > 1 and box[-1] == src[-1] == dst[-1]:
        inner_src, inner_dst = src.pop(), dst.pop()
        inner_box = box.pop()
        src_off.pop()
        dst_off.pop()
        src[-1] *= inner_src
        dst[-1] *= inner_dst
        box[-1] *= inner_box
        src_off[-1] *= inner_src
        dst_off[-1] *= inner_dst
    lasts = (src[-1], dst[-1], box[-1], src_off[-1], dst_off[-1])
    if any(value * bits % 8 for value in lasts):
        raise _unsupported(name, f"a slice boundary splits a byte of {bits}-bit elements "
                           "(SPEC 6.5); cannot reshard it")
    for shape in (src, dst, box, src_off, dst_off):
        shape[-1] = shape[-1] * bits // 8
    return src, dst, box, src_off, dst_off


def _strides(shape: list[int]) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return strides[::-1]


def _extent(box: list[int], strides: list[int], start: int) -> int:
    """Bytes from the first to past the last byte of the box's dims ``start..``."""
    return sum((b - 1) * s for b, s in zip(box[start:], strides[start:], strict=True)) + 1


def _read_box(
    reads: _Reads | _RemoteReads,
    header: Header,
    name: str,
    target: TargetPiece,
    source: SourcePiece,
    out: torch.Tensor,
    scratch: _Scratch,
) -> None:
    bits = DTYPES[target.dtype].bits
    src, dst, box, src_off, dst_off = _geometry(name, bits, source, target)
    src_strides, dst_strides = _strides(src), _strides(dst)
    entry = header.entries[name]
    base = header.data_start + entry.begin + sum(
        o * s for o, s in zip(src_off, src_strides, strict=True))
    dst_start = sum(o * s for o, s in zip(dst_off, dst_strides, strict=True))
    volume = math.prod(box)
    if _extent(box, src_strides, 0) == volume and _extent(box, dst_strides, 0) == volume:
        reads.add(base, out[dst_start : dst_start + volume])
        return
    reads.barrier()  # keep the file's reads in order
    # Dims whose repetition leaves a gap over COALESCE_GAP become separate reads.
    level = 0
    for d in range(len(box) - 1):
        gap = src_strides[d] - _extent(box, src_strides, d + 1) if box[d] > 1 else 0
        if gap > reads.coalesce_gap:
            level = d + 1
    chunk = _extent(box, src_strides, level)
    count = math.prod(box[:level])
    buffer = scratch.get(count * chunk)
    for index, outer in enumerate(itertools.product(*(range(b) for b in box[:level]))):
        position = base + sum(i * s for i, s in zip(outer, src_strides, strict=False))
        reads.read(position, buffer[index * chunk : (index + 1) * chunk])
    # One strided copy, in the widest unit that divides every row and offset. numpy's copy is
    # single-threaded: a small torch copy on a busy machine can wait milliseconds for its pool.
    unit = 8
    while any(v % unit for v in (src[-1], dst[-1], box[-1], src_off[-1], dst_off[-1])):
        unit //= 2
    kind = _UNITS[unit]
    shape = [*box[:-1], box[-1] // unit]
    outer_strides = [chunk * math.prod(box[d + 1 : level]) for d in range(level)]
    view = as_strided(buffer.numpy().view(kind), shape,
                      [*outer_strides, *src_strides[level:-1], unit])
    into = as_strided(out.numpy()[dst_start:].view(kind), shape, [*dst_strides[:-1], unit])
    reads.then(lambda: np.copyto(into, view))


def _iov_max() -> int:
    """Most buffers one preadv takes: the system's limit (Linux: 1024), else POSIX's minimum."""
    try:
        return max(16, min(os.sysconf("SC_IOV_MAX"), 1024))
    except (AttributeError, ValueError, OSError):
        return 16


_IOV_MAX = _iov_max()


class _Reads:
    """One source file's reads. Reads straight into target memory that follow each other in
    the file are gathered and issued as one ``preadv`` scattering into every target (a
    column-parallel slice and the norms beside it: one call, not one per tensor)."""

    @property
    def coalesce_gap(self) -> int:
        """Gaps up to this are read rather than skipped (the module's, read at each use)."""
        return COALESCE_GAP

    def __init__(self, fd: int, stats: ReadStats, path: str) -> None:
        self.fd, self.stats, self.path = fd, stats, path
        self.pending: list[memoryview] = []
        self.start = self.end = 0

    def add(self, position: int, into: torch.Tensor) -> None:
        """Fill ``into`` (a contiguous uint8 host tensor) from ``position``, soon."""
        view = memoryview(into.numpy())  # type: ignore[arg-type]
        if not len(view):
            return
        if self.pending and (position != self.end or len(self.pending) == _IOV_MAX):
            self.flush()
        if not self.pending:
            self.start = self.end = position
        self.pending.append(view)
        self.end += len(view)

    def read(self, position: int, into: torch.Tensor) -> None:
        """Fill ``into`` from ``position`` now."""
        self.add(position, into)
        self.flush()

    def flush(self) -> None:
        """Issue the gathered reads, repeating where the kernel returns fewer bytes."""
        views, position = self.pending, self.start
        self.pending = []
        self.stats.data_bytes += sum(map(len, views))
        self.stats.reads += pread_into(self.fd, views, position, self.path)

    def barrier(self) -> None:
        """Issue the reads gathered so far before the next ones."""
        self.flush()

    def then(self, copy: Callable[[], object]) -> None:
        """Run ``copy`` once the reads so far are done (they are: :meth:`read` waits)."""
        copy()


class _RemoteReads:
    """One object's reads: every wanted run is gathered first, then fetched by ranged
    requests, :data:`~shardspec.remote.REQUESTS_IN_FLIGHT` at once. Bytes that came with the
    header's request (``prefix``) are not asked again. Neighbouring runs share a request when
    the gap between them is among the smallest, while everything asked of the object, the
    header's request included, stays within ``gap_budget`` x the wanted bytes (a
    request costs a round trip, a gap only bytes). Copies out of scratch buffers run after the
    last request."""

    #: Every gap is left to :meth:`flush`'s budget.
    coalesce_gap = 0

    def __init__(self, root: RemoteRoot, stats: ReadStats, path: str, prefix: bytes,
                 gap_budget: float) -> None:
        self.root, self.stats, self.path, self.gap_budget = root, stats, path, gap_budget
        self.prefix = memoryview(prefix)
        self.targets: list[tuple[int, memoryview]] = []
        self.copies: list[Callable[[], object]] = []

    def add(self, position: int, into: torch.Tensor) -> None:
        view = memoryview(into.numpy())  # type: ignore[arg-type]
        if len(view):
            self.targets.append((position, view))

    read = add

    def barrier(self) -> None:
        """Nothing: every run of the object is planned together in :meth:`flush`."""

    def then(self, copy: Callable[[], object]) -> None:
        self.copies.append(copy)

    def flush(self) -> None:
        targets = sorted(self.targets, key=lambda target: target[0])
        self.targets = []
        wanted = sum(len(view) for _, view in targets)
        have = len(self.prefix)
        rest: list[tuple[int, memoryview]] = []
        for position, view in targets:  # what the header's request brought is copied
            if position < have:
                count = min(len(view), have - position)
                view[:count] = self.prefix[position : position + count]
                position, view = position + count, view[count:]
            if len(view):
                rest.append((position, view))
        unwanted = have - (wanted - sum(len(view) for _, view in rest))
        allowance = max(0.0, self.gap_budget * wanted - unwanted)
        requests = _requests(rest, allowance, REQUEST_BYTES)

        def fetch(request: tuple[int, int, list[tuple[int, memoryview]]]) -> None:
            start, end, inside = request
            data = memoryview(self.root.read(self.path, start, end))
            for position, view in inside:
                low, high = max(position, start), min(position + len(view), end)
                view[low - position : high - position] = data[low - start : high - start]

        self.root.map(fetch, requests)
        self.stats.reads += len(requests)
        self.stats.data_bytes += sum(end - start for start, end, _ in requests)
        copies, self.copies = self.copies, []
        for copy in copies:
            copy()


def _requests(
    targets: list[tuple[int, memoryview]], allowance: float, most: int
) -> list[tuple[int, int, list[tuple[int, memoryview]]]]:
    """Byte ranges to request for ``targets`` (sorted, disjoint), each with the targets it
    fills: touching targets share a run, the smallest gaps are bridged while the gap bytes add
    up to at most ``allowance``, and no request is over ``most`` bytes."""
    runs: list[list[int]] = []
    for position, view in targets:
        if runs and position <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], position + len(view))
        else:
            runs.append([position, position + len(view)])
    bridged = [False] * max(len(runs) - 1, 0)
    gaps = sorted(range(len(runs) - 1), key=lambda i: runs[i + 1][0] - runs[i][1])
    for i in gaps:
        gap = runs[i + 1][0] - runs[i][1]
        if gap > allowance:
            break
        allowance -= gap
        bridged[i] = True
    spans: list[list[int]] = []
    for i, run in enumerate(runs):
        if i and bridged[i - 1]:
            spans[-1][1] = run[1]
        else:
            spans.append(list(run))
    requests: list[tuple[int, int, list[tuple[int, memoryview]]]] = []
    index = 0
    for span_start, span_end in spans:
        for start in range(span_start, span_end, most):
            end = min(start + most, span_end)
            while index < len(targets) and targets[index][0] + len(targets[index][1]) <= start:
                index += 1
            inside, look = [], index
            while look < len(targets) and targets[look][0] < end:
                inside.append(targets[look])
                look += 1
            requests.append((start, end, inside))
    return requests


# --- writing a resharded checkpoint ------------------------------------------------------------


def rank_info(plan: ReshardPlan) -> RankInfo:
    """The writer's description of a target rank, from its plan alone (no data)."""
    tensors = {
        name: TensorInfo(piece.dtype, piece.shape, piece.nbytes,
                         Shard(piece.global_shape, piece.offset, piece.replica))
        for name, piece in plan.pieces.items()
    }
    for alias, target in plan.aliases.items():
        tensors[alias] = tensors[target]
    return RankInfo(plan.rank, tensors, dict(plan.aliases))


def reshard(
    source: PathOrURL,
    destination: PathOrURL,
    layout: Layout,
    *,
    overwrite: bool = False,
    verify: bool = False,
    ignore_extensions: tuple[str, ...] = (),
    progress: Callable[[int, int], None] | None = None,
    storage_options: dict[str, Any] | None = None,
    destination_options: dict[str, Any] | None = None,
    gap_budget: float | None = None,
) -> Manifest:
    """Write the checkpoint at ``source`` again at ``destination`` with ``layout``.

    Either may be an object-storage URL: ``storage_options`` configure the source's fsspec
    filesystem, ``destination_options`` the destination's (default: the source's).
    ``gap_budget`` is :func:`execute_reshard`'s, for a source in object storage.

    One target rank is in memory at a time. Quantization, logical records, ties, metadata,
    extensions and extra files carry over; extra files are checked against their recorded
    sha256 as they are copied. ``verify`` also hashes every source data file read (whole).
    ``progress(done, total)`` is called with the bytes of target pieces written so far and in
    all, before the first rank and after each.
    """
    from .reader import open_checkpoint  # reader imports this module

    src = locate(source, storage_options if is_remote(source) else None)
    dst = locate(destination, (destination_options if destination_options is not None
                               else storage_options) if is_remote(destination) else None)
    checkpoint = open_checkpoint(src, ignore_extensions=ignore_extensions)
    manifest = checkpoint.manifest
    resharder = Resharder(manifest, layout)
    plans = [resharder.plan(rank) for rank in range(layout.size)]
    logical = {name: r.logical for name, r in manifest.tensors.items()
               if isinstance(r, TensorRecord) and r.logical is not None}
    ties = {name: r.tied_to for name, r in manifest.tensors.items()
            if isinstance(r, TensorRecord) and r.tied_to is not None}
    draft = plan_checkpoint(
        layout, [rank_info(p) for p in plans], quantization=manifest.quantization,
        logical=logical, ties=ties, metadata=manifest.metadata, extensions=manifest.extensions,
        extra_files=[f.path for f in manifest.extra_files],
    )
    if _same_place(src, dst):
        raise ValueError("the destination is the source checkpoint's directory")
    with tempfile.TemporaryDirectory(prefix="shardspec-extras-") as folder:
        extras = _extra_sources(src, manifest, Path(folder))
        return _write_resharded(src, dst, manifest, plans, draft, extras, overwrite, verify,
                                progress, gap_budget)


def _same_place(src: Location, dst: Location) -> bool:
    """Whether writing ``dst`` would overwrite ``src``: the same directory, or the same prefix
    of the same kind of store however the URL spells it (``s3://`` and ``s3a://``)."""
    if isinstance(src, RemoteRoot) and isinstance(dst, RemoteRoot):
        return type(src.fs) is type(dst.fs) and src.prefix == dst.prefix
    if isinstance(src, RemoteRoot) or isinstance(dst, RemoteRoot):
        return False
    return dst.exists() and os.path.realpath(dst) == os.path.realpath(src)


def _extra_sources(src: Location, manifest: Manifest, folder: Path) -> dict[str, Path]:
    """Local files to copy the extra files from: the source's own, or fetched copies (they are
    small: configs, tokenizers)."""
    if isinstance(src, Path):
        return {f.path: resolve_inside(src, f.path) for f in manifest.extra_files}
    extras = {}
    for index, record in enumerate(manifest.extra_files):
        local = folder / str(index)
        before = remote_version(src, record.path, record.size)
        with local.open("wb") as handle:
            for chunk in src.stream(record.path, 0, record.size):
                handle.write(chunk)
        src.check_unchanged(record.path, before)
        extras[record.path] = local  # its sha256 is compared with the record when copied
    return extras


def _write_resharded(
    src: Location, dst: Location, manifest: Manifest, plans: list[ReshardPlan], draft: Manifest,
    extras: dict[str, Path], overwrite: bool, verify: bool,
    progress: Callable[[int, int], None] | None, gap_budget: float | None,
) -> Manifest:
    prepare_directory(dst, overwrite)
    records: dict[str, FileRecord] = {}
    cpu = torch.device("cpu")
    total, done = sum(p.target_bytes for p in plans), 0
    if progress is not None:
        progress(done, total)
    for plan in plans:
        state = execute_reshard(src, manifest, plan, cpu, verify=verify, separate=True,
                                gap_budget=gap_budget)
        records.update({f.path: f for f in write_rank(dst, plan.rank, state, draft)})
        del state
        done += plan.target_bytes
        if progress is not None:
            progress(done, total)
    copied = copy_extra_files(dst, extras)
    for old, new in zip(manifest.extra_files, copied, strict=True):
        if old.checksums.get("sha256") != new.checksums["sha256"] or old.size != new.size:
            raise IntegrityError(Finding(
                code="checksum-mismatch", file=old.path,
                message="the extra file's size or sha256 differs from the source manifest's"))
    records.update({f.path: f for f in copied})
    finished = finish_manifest(draft, records)
    commit_checkpoint(dst, finished.to_json())
    return finished
