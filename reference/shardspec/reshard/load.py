"""Resharding, the load: a :class:`~shardspec.reshard.plan.ReshardPlan` -> one rank's tensors.

Only the byte ranges of the source pieces that overlap a target piece are read
(:mod:`~shardspec.reshard.boxes`); gaps between them are fetched only while the bytes asked stay
within a budget of the bytes wanted: :data:`REMOTE_GAP_BUDGET` from object storage (SPEC 2.4),
:data:`LOCAL_GAP_BUDGET` from local files where a caller asks for a budget. Every source file is
opened by SPEC 2.2, its size checked against the manifest (9.1) and its header checked (6.3)
and compared with the manifest (7.2) before any of its data is read.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from ..format.dtypes import DTYPES, byte_size, torch_layout
from ..format.errors import Finding, IntegrityError
from ..format.heads import HeadCounts, HeadsError, head_counts
from ..format.integrity import (
    Digests,
    Readable,
    check_digests,
    digest_stream,
    known_algorithms,
)
from ..format.json_text import load_json
from ..format.manifest import FileRecord, Layout, Manifest
from ..format.safetensors_header import Header, read_header
from ..load.host_memory import fresh_buffer
from ..load.plan import FilePlan, plan_ranks
from ..storage.paths import open_inside
from ..storage.remote import RemoteRoot
from ..storage.remote_files import PARTIAL_HEADER_PROBE, RemoteObject, header_in
from .boxes import BudgetedFileReads, FileReads, ReadStats, RemoteReads, Scratch, read_box
from .plan import Resharder, ReshardPlan, SourcePiece, TargetPiece

__all__ = [
    "CONFIG_NAME",
    "LOCAL_GAP_BUDGET",
    "READ_THREADS",
    "REMOTE_GAP_BUDGET",
    "ReadStats",
    "checkpoint_heads",
    "execute_reshard",
    "load_resharded",
    "read_remote_runs",
]

#: From object storage, the gaps between wanted runs that are fetched anyway (one request
#: instead of two) add up to at most this fraction of the wanted bytes: at most twice the
#: wanted bytes asked. A row-parallel tensor split further (TP 4 -> 8) wants half of every row,
#: its gaps as long as its runs: this bridges them, a few requests per object instead of one
#: per row, each of which costs a round trip while a gap costs only its bytes.
REMOTE_GAP_BUDGET = 1.0

#: The same for local files, read by a caller that asks for a budget (the DCP reader, the vLLM
#: loader): a read call costs microseconds, not a round trip, so bytes are worth saving.
LOCAL_GAP_BUDGET = 0.1

#: Source files read at the same time.
READ_THREADS = 4

#: The smallest first request for a source object's header.
_LEAST_PROBE = 1024

#: Each target tensor starts at a multiple of this in the rank's buffer.
_ALIGN = 64


#: The extra file whose head counts cut attention tensors on head boundaries.
CONFIG_NAME = "config.json"

#: The most bytes of config.json read for its head counts.
_CONFIG_LIMIT = 16 * 1024 * 1024


def checkpoint_heads(root: Path | RemoteRoot, manifest: Manifest) -> HeadCounts | None:
    """The attention head counts of the checkpoint's ``config.json`` extra file (checked
    against its recorded size and sha256), or None where it has none it can tell."""
    record = next((f for f in manifest.extra_files if f.path == CONFIG_NAME), None)
    if record is None or record.size > _CONFIG_LIMIT:
        return None
    if isinstance(root, RemoteRoot):
        data = root.read_whole(CONFIG_NAME, record.size + 1)
    else:
        handle, _ = open_inside(root, CONFIG_NAME)
        with handle:
            data = handle.read(record.size + 1)
    if len(data) != record.size or \
            hashlib.sha256(data).hexdigest() != record.checksums.get("sha256"):
        raise IntegrityError(Finding(
            code="checksum-mismatch", file=CONFIG_NAME,
            message="the file's size or sha256 differs from the manifest's"))
    try:
        config = load_json(data)
        return head_counts(config) if isinstance(config, dict) else None
    except (ValueError, HeadsError):
        return None  # a config that says nothing usable: the pieces' own split applies


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
    resharder = resharder or Resharder(manifest, layout, heads=checkpoint_heads(root, manifest))
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
    verified: set[str] | None = None,
    on_read: Callable[[int], None] | None = None,
    local_gap_budget: float | None = None,
) -> dict[str, torch.Tensor]:
    """Read ``plan``'s pieces onto ``device``; aliases share their target's storage.

    The pieces are filled in one host buffer (``separate``: one allocation per tensor, as a
    writer wants them), moved to ``device`` at the end. ``gap_budget`` (from object storage;
    default :data:`REMOTE_GAP_BUDGET`) bounds the gap bytes fetched to save requests.
    ``verified``: with ``verify``, the source files already hashed by earlier calls (a writer
    resharding rank after rank hashes each file once); the files hashed now are added.
    ``on_read(n)`` is called as each source file's boxes are in, with their bytes.
    ``local_gap_budget`` bounds them the same way from local files (None: every gap under
    :data:`~shardspec.reshard.boxes.COALESCE_GAP` is read, fewer calls for more bytes).
    """
    budget = REMOTE_GAP_BUDGET if gap_budget is None else gap_budget
    stats = stats if stats is not None else ReadStats()
    stats.target_bytes += plan.target_bytes
    out = _allocate(plan, separate)
    jobs: dict[tuple[int, str], list[_Job]] = {}
    for name, part, piece in plan.every_piece():
        for source in piece.sources:
            jobs.setdefault((source.rank, source.file), []).append(
                _Job(name, (name, part), piece, source))
    file_plans = {f.record.path: f  # one pass over the manifest for every source rank
                  for rank_plan in plan_ranks(manifest, sorted({r for r, _ in jobs}))
                  for f in rank_plan.files}
    work = [(file_plans[path], file_jobs, ReadStats())
            for (_, path), file_jobs in sorted(jobs.items())]

    done = verified if verified is not None else set()
    lock = threading.Lock()

    def read(item: tuple[FilePlan, list[_Job], ReadStats]) -> None:
        path = item[0].record.path
        with lock:  # each file is hashed by one call only
            hash_it = verify and path not in done
            done.add(path)
        try:
            _read_file(root, item[0], item[1], out, Scratch(), item[2], hash_it, budget,
                       local_gap_budget)
        except BaseException:
            with lock:
                done.discard(path)  # not verified after all
            raise
        if on_read is not None:
            count = sum(byte_size(DTYPES[j.target.dtype], j.source.box_shape) or 0
                        for j in item[1])
            with lock:
                on_read(count)

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


@dataclass(frozen=True)
class _Job:
    """One source box of one target piece: the tensor's ``name`` (its entry in the source
    file) and the ``key`` of the target piece's buffer (name, part index or None)."""

    name: str
    key: _Key
    target: TargetPiece
    source: SourcePiece


#: A target piece's buffer: (tensor name, part index or None for a tensor held in one piece).
_Key = tuple[str, "int | None"]


def _allocate(plan: ReshardPlan, separate: bool) -> dict[_Key, torch.Tensor]:
    """Key -> a flat uint8 host tensor of the piece's bytes (uninitialised). A tensor's parts
    lie one after the other, so a join along its first dimension is a view of them."""
    sizes = {(name, part): p.nbytes for name, part, p in plan.every_piece() if p.nbytes}
    if separate:
        return {key: fresh_buffer(size) for key, size in sizes.items()}
    offsets, total = {}, 0
    for key, size in sizes.items():
        offsets[key] = total
        total += size if key[1] is not None else -(-size // _ALIGN) * _ALIGN
    buffer = fresh_buffer(total)
    return {key: buffer[offsets[key] : offsets[key] + size] for key, size in sizes.items()}


def _finish(
    plan: ReshardPlan, out: dict[_Key, torch.Tensor], device: torch.device
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
        tensors[name] = _as_tensor(piece, out.get((name, None)), device)
    for name, held in plan.parts.items():
        dim = plan.joined_along[name]
        views = [_as_tensor(piece, out.get((name, part)), device)
                 for part, piece in enumerate(held)]
        tensors[name] = _joined(views, dim)
    for alias, target in plan.aliases.items():
        tensors[alias] = tensors[target]
    return tensors


def _as_tensor(piece: TargetPiece, data: torch.Tensor | None, device: torch.device
               ) -> torch.Tensor:
    dtype, shape = torch_layout(DTYPES[piece.dtype], piece.shape)
    if data is None:
        return torch.empty(shape, dtype=dtype, device=device)
    return data.view(dtype).reshape(shape)


def _joined(views: list[torch.Tensor], dim: int) -> torch.Tensor:
    """The join of a rank's pieces along ``dim`` (SPEC 7.2 rule 7): a view of their bytes
    where they lie one after the other and ``dim`` is outermost, else a copy."""
    outer = math.prod(views[0].shape[:dim])
    if outer <= 1 and all(v.is_contiguous() for v in views) and all(
            a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            and a.storage_offset() + a.numel() == b.storage_offset()
            for a, b in zip(views, views[1:], strict=False)):
        shape = list(views[0].shape)
        shape[dim] = sum(v.shape[dim] for v in views)
        return views[0].as_strided(shape, torch.empty(shape, device="meta").stride(),
                                   views[0].storage_offset())
    return torch.cat(views, dim=dim)


def _read_file(
    root: Path | RemoteRoot,
    plan: FilePlan,
    jobs: list[_Job],
    out: dict[_Key, torch.Tensor],
    scratch: Scratch,
    stats: ReadStats,
    verify: bool,
    gap_budget: float,
    local_gap_budget: float | None = None,
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
        jobs = sorted(jobs, key=lambda job: header.entries[job.name].begin)
        if local_gap_budget is None:
            reads: FileReads | BudgetedFileReads = FileReads(handle.fileno(), stats, record.path)
        else:  # reads wait for flush: each box gets a scratch buffer of its own
            reads = BudgetedFileReads(handle.fileno(), stats, record.path, local_gap_budget,
                                      header.data_start)
        for job in jobs:
            read_box(reads, header, job.name, job.target, job.source, out[job.key],
                     scratch if local_gap_budget is None else Scratch())
        reads.flush()


def _read_remote_file(
    root: RemoteRoot,
    plan: FilePlan,
    jobs: list[_Job],
    out: dict[_Key, torch.Tensor],
    stats: ReadStats,
    verify: bool,
    gap_budget: float,
) -> None:
    """:func:`_read_file` of an object: the same checks, then every box's runs as ranged
    requests, each answer's version compared with the first's (SPEC 9.3)."""
    wanted = sum(byte_size(DTYPES[j.target.dtype], j.source.box_shape) or 0 for j in jobs)

    def add(header: Header, reads: RemoteReads) -> None:
        for job in sorted(jobs, key=lambda job: header.entries[job.name].begin):
            # Boxes read through a scratch buffer are copied after every request is in: each
            # box gets a scratch buffer of its own.
            read_box(reads, header, job.name, job.target, job.source, out[job.key], Scratch())

    read_remote_runs(root, plan, wanted, add, stats, verify, gap_budget)


def read_remote_runs(
    root: RemoteRoot,
    plan: FilePlan,
    wanted: int,
    add: Callable[[Header, RemoteReads], None],
    stats: ReadStats,
    verify: bool,
    gap_budget: float,
) -> None:
    """Read ``wanted`` bytes of one object: its header checked against ``plan`` (SPEC 6.3,
    7.2), then ``add(header, reads)`` names every run wanted, which are fetched by ranged
    requests in parallel (the gaps between them within ``gap_budget``), each answer's version
    compared with the first's (SPEC 9.3); with ``verify``, or where the store gives no
    version, the object is streamed whole and its digests checked (9.2)."""
    record = plan.record
    stats.files_opened.append(record.path)
    source = RemoteObject(root, record.path, record.size)
    if record.size <= (1 + gap_budget) * wanted and len(root.link.ranges(0, record.size)) == 1:
        # Fetching the whole object with one GET asks no more than the budget allows: every
        # box is then copied out of it, no request per run.
        prefix = source.read(0, record.size)
        header = header_in(prefix, record.size, record.path)
    else:
        # The probe's bytes past the header count against the budget too: a rank that wants
        # little asks a small probe (and a second request for a longer header).
        header, prefix = source.header(
            min(PARTIAL_HEADER_PROBE, max(int(gap_budget * wanted), _LEAST_PROBE)))
    stats.header_bytes += len(prefix)
    plan.check_header(header)
    assert source.version is not None
    digests = None
    if verify or not source.version.tag:  # no version to compare: the checksum decides
        # 9.2 digests cover the whole object: it is streamed once, hashed, and the boxes are
        # copied out of it as it goes (never fetched a second time for the boxes)
        digests = Digests(record.checksums)
        digests.update(prefix)
    reads = RemoteReads(source, stats, prefix, gap_budget, digests)
    add(header, reads)
    reads.flush()
    if digests is not None:
        check_digests(record.path, record.checksums, digests.hexdigests(), "object")
    source.finish()


def _verify(readable: Readable, record: FileRecord, stats: ReadStats) -> None:
    """Hash everything left in ``readable`` (a whole file): 9.2 digests cover whole files."""
    digests, count = digest_stream(readable, known_algorithms(record.checksums))
    stats.verify_bytes += count
    check_digests(record.path, record.checksums, digests)
