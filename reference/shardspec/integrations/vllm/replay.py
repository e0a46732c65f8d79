"""A placement plan (:mod:`.placements`) -> the bytes in the model's own parameters.

Each data file is opened inside the checkpoint, its size and header checked against the
manifest (and with ``verify`` its digests, before any of its bytes is used); then every read
goes from the file straight into the target's storage with ``preadv``, several at once:

- a contiguous run (a column-parallel weight, a whole tensor) in spans of
  :data:`SPAN_BYTES`, each one call;
- strided runs (a row-parallel weight: a part of every row) a block of the target
  (:data:`BLOCK_BYTES`) a job, from every file that holds a part of its rows in turn, their
  vectors built by numpy and handed to libc's ``preadv`` whole (a Python object a run cost
  more than the copy), the bytes between two runs read into a scratch buffer that is never
  looked at, as long as they are shorter than a page (:data:`GAP_BYTES`): every page read then
  holds wanted bytes, and one call beats many small ones; farther apart, a call a run.

Each call first faults in the target's pages it fills, in one ``madvise``: vLLM's parameters
are untouched memory, and faults taken inside the kernel's copy cost more.

A file the page cache mostly does not hold (cold) is read around the cache (``O_DIRECT``,
:data:`DIRECT_IN_FLIGHT` requests at once) into small page-aligned buffers, one a thread and
reused, and copied from there into the target: a direct read cannot land in a parameter that
does not start on a page, and the buffer stays in the processor's cache, where a read through
the page cache would first fill the cache from the device and then copy out of it. Strided
runs too, a block of the target at a time: each cold file's span of the block's rows is read
whole, gaps included, and its runs copied out of the buffer into the block.

Targets on another device (CUDA) are filled in host memory and copied over once each.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...format.errors import Finding, IntegrityError, SafetensorsError
from ...format.integrity import check_digests, digest_stream, known_algorithms
from ...format.manifest import Manifest
from ...format.safetensors_header import Header, read_header
from ...load.host_memory import PAGE_BYTES, advise_huge_pages, fresh_buffer, prefault, whole_pages
from ...load.host_reads import DIRECT_CHUNK_BYTES, DIRECT_READS_IN_FLIGHT, direct_descriptor
from ...load.plan import FilePlan, plan_ranks
from ...load.reads import pread_direct_span, pread_into, pread_runs
from ...reshard.boxes import ReadStats, RemoteReads
from ...reshard.load import REMOTE_GAP_BUDGET, read_remote_runs
from ...storage.paths import open_inside
from ...storage.remote import RemoteRoot
from .placements import PlacementPlan, Read

__all__ = ["BLOCK_BYTES", "DIRECT_IN_FLIGHT", "GAP_BYTES", "PARAM_HUGE_PAGES", "REPLAY_THREADS",
           "ROWS_PER_CALL", "SPAN_BYTES", "poison_", "replay"]


def _setting(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    return default if not value else value not in {"0", "false", "no", "off"}


#: Advise the parameters' memory for transparent huge pages before the first byte lands in it
#: (``SHARDSPEC_PARAM_HUGE_PAGES=1``). vLLM allocates the parameters and leaves them untouched,
#: so every 4 KiB page is faulted in and zeroed by the read that fills it, most of a warm
#: load's time; one fault per 2 MiB should cost less, but in vLLM CPU workers on the
#: benchmark's VM it made loads 3x slower (freed memory goes back to the host there, and each
#: fresh 2 MiB is faulted in from it; ``benchmarks/README.md``). Off unless asked for.
PARAM_HUGE_PAGES = _setting("SHARDSPEC_PARAM_HUGE_PAGES", False)

#: Reads in flight. A vLLM CPU worker is bound to its cores, but threads waiting on the disk
#: cost none, and out of a warm page cache they copy in parallel where there are cores.
REPLAY_THREADS = 4

#: Bytes per call of a contiguous run. Each call first faults in its span of the target
#: (:func:`~shardspec.load.host_memory.prefault`): a span small enough to stay in the
#: processor's cache between being zeroed and being written is faster (1 MiB: 0.71 s against
#: 0.76 s for 8 MiB in a warm vLLM load of 1.59 GiB on one core), and large enough that the
#: calls cost little (256 KiB: 1.1 s).
SPAN_BYTES = 1024 * 1024

#: Strided runs per job at most (each job faults in its block of the target first; a call
#: takes up to IOV_MAX vectors, two a run where the gaps between runs are read too).
ROWS_PER_CALL = 511

#: Bytes of a target a job of strided runs fills, from every file that holds a part of them:
#: small enough that the block stays in the processor's cache from its pages' fault-in to the
#: last file's runs.
BLOCK_BYTES = 2 * 1024 * 1024

#: Strided runs whose gaps are shorter than this are read in one call with their gaps: no page
#: of the file is then read that holds no wanted byte.
GAP_BYTES = 4096


#: Direct requests in flight for a cold file (threads waiting on the device use no core).
DIRECT_IN_FLIGHT = DIRECT_READS_IN_FLIGHT


def poison_(tensor: torch.Tensor) -> None:
    """Fill ``tensor`` with what no checkpoint byte that vLLM used could leave there unnoticed:
    NaN, or all bits set in an integer (every int4 value 15, every int8 -1)."""
    if tensor.is_floating_point():
        tensor.fill_(float("nan"))
    elif tensor.dtype == torch.bool:
        tensor.fill_(True)
    elif not tensor.is_complex():
        tensor.fill_(-1 if tensor.dtype.is_signed else torch.iinfo(tensor.dtype).max)


def replay(root: Path | RemoteRoot, manifest: Manifest, plan: PlacementPlan,
           targets: Mapping[str, torch.Tensor], *, verify: bool = False,
           stats: ReadStats | None = None, poison: bool = False) -> None:
    """Execute ``plan`` into ``targets`` (the model's parameters and buffers by name).

    ``poison`` first fills every target the plan writes with NaN (:func:`poison_`): a model
    that then computes correctly proves the plan wrote every byte it uses.
    """
    sinks = {name: _Sink(targets[name]) for name in {r.target for r in plan.reads}
             | {f.target for f in plan.fills}}
    if poison:
        for sink in sinks.values():
            sink.poison()
    by_file: dict[str, list[Read]] = {}
    for read in plan.reads:
        by_file.setdefault(read.file, []).append(read)
    file_plans = _file_plans(manifest, set(by_file))
    if isinstance(root, RemoteRoot):
        _replay_remote(root, by_file, file_plans, sinks, verify, stats)
    else:
        _replay_local(root, by_file, file_plans, sinks, verify, stats)
    for fill in plan.fills:
        sinks[fill.target].fill(fill.dst.offset, fill.dst.strides, fill.dst.shape, fill.value)
    for sink in sinks.values():
        sink.finish()


def _replay_remote(root: RemoteRoot, by_file: dict[str, list[Read]],
                   file_plans: dict[str, FilePlan], sinks: dict[str, _Sink], verify: bool,
                   stats: ReadStats | None) -> None:
    """The reads from objects: each object's runs fetched by ranged requests in parallel, at
    most :data:`~shardspec.storage.remote.REQUESTS_IN_FLIGHT` at once, each answer copied
    straight into the parameters' bytes as it comes (no tensor of the checkpoint is built),
    the header checked first and every answer's version compared (SPEC 9.3)."""
    stats = stats if stats is not None else ReadStats()
    for path, reads in sorted(by_file.items()):
        wanted = sum(read.count * read.length for read in reads)
        read_remote_runs(root, file_plans[path], wanted,
                         functools.partial(_add_runs, path, reads, sinks), stats, verify,
                         REMOTE_GAP_BUDGET)


def _add_runs(path: str, reads: list[Read], sinks: dict[str, _Sink], header: Header,
              fetch: RemoteReads) -> None:
    """Every run of ``reads`` (one object's), as a (position, target bytes) to fetch."""
    for read in sorted(reads, key=lambda one: header.entries[one.tensor].begin + one.src):
        sink = sinks[read.target]
        _check_bounds(path, header, read, sink)
        base = header.data_start + header.entries[read.tensor].begin + read.src
        if read.count == 1 or read.src_stride == read.length == read.dst_stride:
            fetch.add(base, sink.host[read.dst : read.dst + read.count * read.length])
            continue
        for i in range(read.count):
            at = read.dst + i * read.dst_stride
            fetch.add(base + i * read.src_stride, sink.host[at : at + read.length])


def _replay_local(root: Path, by_file: dict[str, list[Read]], file_plans: dict[str, FilePlan],
                  sinks: dict[str, _Sink], verify: bool, stats: ReadStats | None) -> None:
    """Every file the worker reads is opened and checked first, and stays open to the end: a
    target's strided runs from several files (a row-parallel weight resharded: a part of every
    row from each) are read a block of the target at a time, from each file in turn, while the
    block's just faulted-in pages are in the processor's cache (:func:`_block_jobs`); from cold
    files by direct reads of each file's span of the block (:func:`_direct_block`). Through
    the page cache, in each file's order, they were slower (in vLLM at TP 1 from a TP-4
    checkpoint, cold: 1.41 s against 1.23 s at the own layout, medians of 5; the replay alone
    on one core: 1.08x the own layout, now 1.00x, ``benchmarks/README.md``)."""
    with ExitStack() as stack, \
            ThreadPoolExecutor(REPLAY_THREADS, thread_name_prefix="shardspec-replay") as pool, \
            ThreadPoolExecutor(DIRECT_IN_FLIGHT, thread_name_prefix="shardspec-direct") as device:
        files = [_open_checked(stack, root, path, reads, file_plans[path], verify)
                 for path, reads in sorted(by_file.items())]
        futures = []
        strided: dict[str, list[tuple[_File, Read]]] = {}
        cold_strided: dict[str, list[tuple[_File, Read]]] = {}
        for file in files:
            runner = pool if file.direct is None else device
            for read in file.reads:
                if _contiguous(read):
                    futures += [runner.submit(job) for job in _jobs(file, read, sinks[read.target])]
                    continue
                _check_bounds(file.path, file.header, read, sinks[read.target])
                if file.direct is None:
                    strided.setdefault(read.target, []).append((file, read))
                elif _scatters(read):
                    cold_strided.setdefault(read.target, []).append((file, read))
                else:  # runs far apart in a cold file: in the file's order, as readahead likes
                    futures += [device.submit(job)
                                for job in _block_jobs(sinks[read.target], [(file, read)])]
        for target, reads in strided.items():
            futures += [pool.submit(job) for job in _block_jobs(sinks[target], reads)]
        for target, reads in cold_strided.items():
            futures += [device.submit(job)
                        for job in _block_jobs(sinks[target], reads, direct=True)]
        calls = sum(future.result() for future in futures)
    if stats is not None:
        for file in files:
            stats.files_opened.append(file.path)
            stats.header_bytes += file.header.data_start
            stats.data_bytes += sum(_span(r) for r in file.reads)
            stats.verify_bytes += file.size if verify else 0
        stats.reads += calls


@dataclass
class _File:
    """A data file open for the replay, its header checked, its reads in the file's order."""

    path: str
    fd: int
    size: int
    header: Header
    reads: list[Read]
    #: an ``O_DIRECT`` descriptor where the page cache mostly does not hold the file (cold)
    direct: int | None


def _open_checked(stack: ExitStack, root: Path, path: str, reads: list[Read], plan: FilePlan,
                  verify: bool) -> _File:
    handle, size = open_inside(root, path)
    stack.enter_context(handle)
    header = _checked_header(handle, size, plan)
    if verify:  # hashed through the page cache: the file is then read from there
        _verify(handle, plan)
    # In the file's order: a cold file is read front to back, as readahead likes.
    reads = sorted(reads, key=lambda r: header.entries[r.tensor].begin + r.src)
    direct = direct_descriptor(handle.fileno(), header.data_start, size - header.data_start)
    if direct is not None:
        stack.callback(os.close, direct)
    return _File(path, handle.fileno(), size, header, reads, direct)


class _Sink:
    """The bytes of one target's storage as a writable buffer (a host copy for a device)."""

    def __init__(self, target: torch.Tensor) -> None:
        self.target = target
        if PARAM_HUGE_PAGES:
            advise_huge_pages(target)
        storage = target.untyped_storage()
        host = storage if target.device.type == "cpu" else torch.empty(
            storage.nbytes(), dtype=torch.uint8, pin_memory=torch.cuda.is_available()
        ).untyped_storage()
        if target.device.type != "cpu":
            host.copy_(storage)  # bytes the plan does not write keep their value
        self.host = torch.empty(0, dtype=torch.uint8).set_(host)
        self.array = self.host.numpy()
        self.view = memoryview(self.array)  # type: ignore[arg-type]
        self.address: int = self.array.ctypes.data

    def poison(self) -> None:
        poison_(self._typed())

    def fill(self, offset: int, strides: tuple[int, ...], shape: tuple[int, ...],
             value: float) -> None:
        self._typed().as_strided(shape, strides, offset).fill_(value)

    def _typed(self) -> torch.Tensor:
        return torch.empty(0, dtype=self.target.dtype).set_(self.host.untyped_storage())

    def finish(self) -> None:
        if self.target.device.type != "cpu":
            self.target.untyped_storage().copy_(self.host.untyped_storage())


def _file_plans(manifest: Manifest, paths: set[str]) -> dict[str, FilePlan]:
    ranks = [r.rank for r in manifest.ranks if any(f.path in paths for f in r.files)]
    return {f.record.path: f for plan in plan_ranks(manifest, ranks) for f in plan.files
            if f.record.path in paths}


def _checked_header(handle: object, size: int, plan: FilePlan) -> Header:
    record = plan.record
    if size != record.size:
        raise IntegrityError(Finding(
            code="file-size", file=record.path,
            message=f"the file has {size} bytes, the manifest says {record.size}"))
    header = read_header(handle, size, record.path)  # type: ignore[arg-type]
    plan.check_header(header)
    return header


def _verify(handle: object, plan: FilePlan) -> None:
    record = plan.record
    os.lseek(handle.fileno(), 0, os.SEEK_SET)  # type: ignore[attr-defined]
    digests, _ = digest_stream(handle, known_algorithms(record.checksums))  # type: ignore[arg-type]
    check_digests(record.path, record.checksums, digests)


def _span(read: Read) -> int:
    """The bytes of the file a read covers, gaps read included."""
    if read.count == 1 or read.src_stride - read.length >= GAP_BYTES:
        return read.count * read.length
    return read.src_end - read.src


def _contiguous(read: Read) -> bool:
    return read.count == 1 or read.src_stride == read.length == read.dst_stride


def _jobs(file: _File, read: Read, sink: _Sink) -> list[Callable[[], int]]:
    """The read calls of one contiguous read, each a job for the pool; bounds checked first."""
    _check_bounds(file.path, file.header, read, sink)
    base = file.header.data_start + file.header.entries[read.tensor].begin + read.src
    total = read.count * read.length
    if file.direct is not None:
        return _direct_jobs(file.direct, file.fd, file.path, base, total, sink.array[read.dst :])
    view = sink.view
    return [_call(file.fd, [view[read.dst + a : read.dst + min(a + SPAN_BYTES, total)]],
                  base + a, file.path, fault=(sink.address + read.dst + a,
                                              min(SPAN_BYTES, total - a)))
            for a in range(0, total, SPAN_BYTES)]


def _block_jobs(sink: _Sink, reads: list[tuple[_File, Read]], *, direct: bool = False
                ) -> list[Callable[[], int]]:
    """Jobs that fill one target's strided runs (from one file or several), each a block of
    about :data:`BLOCK_BYTES` of the target: its pages faulted in, then every read's runs that
    start inside it (``direct``: read around the page cache, :func:`_direct_block`). File
    after file instead, each block would be written once per file, long after its pages were
    zeroed, out of the processor's cache (a 128 MiB weight from 4 files, warm: 85 ms, against
    58 ms a block at a time and 51 ms read whole from one file)."""
    lo = min(read.dst for _, read in reads)
    hi = max(read.dst_end for _, read in reads)
    step = max(1, min(ROWS_PER_CALL, BLOCK_BYTES // max(read.dst_stride for _, read in reads)))
    block = step * max(read.dst_stride for _, read in reads)
    if direct:
        return [functools.partial(_direct_block, sink, reads, start, min(start + block, hi))
                for start in range(lo, hi, block)]
    # the bytes between two runs of a file, never looked at; farther apart than a page, a call
    # a run
    scratch = {id(read): np.empty(read.src_stride - read.length, dtype=np.uint8)
               for _, read in reads if 0 < read.src_stride - read.length < GAP_BYTES}
    return [functools.partial(_block, sink, reads, scratch, start, min(start + block, hi))
            for start in range(lo, hi, block)]


def _block(sink: _Sink, reads: list[tuple[_File, Read]], scratch: dict[int, np.ndarray],
           lo: int, hi: int) -> int:
    """A job: the runs of ``reads`` that start in bytes ``[lo, hi)`` of the target, the pages
    they fill faulted in first."""
    calls = 0
    prefault(sink.address + lo, hi - lo)
    for file, read in reads:
        first, end = _rows_in(read, lo, hi)
        if end <= first:
            continue
        base = file.header.data_start + file.header.entries[read.tensor].begin + read.src
        calls += pread_runs(file.fd, sink.array, read.dst + first * read.dst_stride,
                            read.dst_stride, read.length, end - first,
                            base + first * read.src_stride, read.src_stride, file.path,
                            scratch.get(id(read)))
    return calls


def _scatters(read: Read) -> bool:
    """Whether a cold file's strided read goes through :func:`_direct_block`: its runs less
    than a page apart (no page read holds no wanted byte, as with :data:`GAP_BYTES`), and a
    run with its gap fits a thread's buffer with a page to spare (the read starts on one)."""
    return 0 < read.length <= read.src_stride < read.length + GAP_BYTES \
        and read.src_stride <= DIRECT_CHUNK_BYTES - PAGE_BYTES


def _direct_block(sink: _Sink, reads: list[tuple[_File, Read]], lo: int, hi: int) -> int:
    """A cold job: the runs of ``reads`` that start in bytes ``[lo, hi)`` of the target, the
    pages they fill faulted in first; each file's span of them read whole, gaps included, by
    direct reads of at most :data:`DIRECT_CHUNK_BYTES` into this thread's buffer, and its runs
    copied from there into the block while both are in the processor's cache."""
    calls = 0
    prefault(sink.address + lo, hi - lo)
    buffer = _bounce_buffer()
    view = memoryview(buffer)  # type: ignore[arg-type]
    for file, read in reads:
        assert file.direct is not None
        first, end = _rows_in(read, lo, hi)
        base = file.header.data_start + file.header.entries[read.tensor].begin + read.src
        per_read = (DIRECT_CHUNK_BYTES - PAGE_BYTES) // read.src_stride
        for row in range(first, end, per_read):
            rows = min(per_read, end - row)
            start = base + row * read.src_stride
            aligned = start - start % PAGE_BYTES
            want = start - aligned + (rows - 1) * read.src_stride + read.length
            calls += pread_direct_span(file.direct, file.fd, view[: whole_pages(want)], aligned,
                                       want, file.path)
            np.copyto(_strided(sink.array, read.dst + row * read.dst_stride, read.dst_stride,
                               read.length, rows),
                      _strided(buffer, start - aligned, read.src_stride, read.length, rows))
    return calls


def _rows_in(read: Read, lo: int, hi: int) -> tuple[int, int]:
    """The runs of ``read`` (first, end) that start in bytes ``[lo, hi)`` of its target."""
    first = max(0, -(-(lo - read.dst) // read.dst_stride))
    return first, max(first, min(read.count, -(-(hi - read.dst) // read.dst_stride)))


def _strided(array: np.ndarray, at: int, stride: int, length: int, rows: int) -> np.ndarray:
    """``rows`` runs of ``length`` bytes of ``array``, ``stride`` apart from byte ``at``."""
    return np.lib.stride_tricks.as_strided(array[at:], (rows, length), (stride, 1))


def _check_bounds(path: str, header: Header, read: Read, sink: _Sink) -> None:
    """A read inside its tensor's bytes and its target's: else the plan is not this
    checkpoint's (a stale cache)."""
    entry = header.entries[read.tensor]
    if read.src_end > entry.end - entry.begin or read.dst_end > len(sink.view):
        raise SafetensorsError(Finding(
            code="st-offsets", file=path, tensor=read.tensor,
            message=f"a cached placement reads bytes {read.src}..{read.src_end} of it into "
            f"{read.target!r}, past the tensor's {entry.end - entry.begin} bytes or the "
            f"target's {len(sink.view)}: the plan cache does not belong to this checkpoint",
            hint="delete the plan cache directory (model_loader_extra_config 'plan_cache')"))


def _direct_jobs(direct: int, fd: int, path: str, position: int, count: int,
                 target: np.ndarray) -> list[Callable[[], int]]:
    """Jobs that fill ``target[:count]`` from ``position`` with direct reads of whole pages,
    :data:`DIRECT_CHUNK_BYTES` at a time, through each thread's own aligned buffer."""
    first = position - position % PAGE_BYTES
    end = position + count

    def job(chunk: int) -> int:
        lo, hi = max(chunk, position), min(chunk + DIRECT_CHUNK_BYTES, end)
        buffer = _bounce_buffer()
        view = memoryview(buffer)  # type: ignore[arg-type]
        calls = pread_direct_span(direct, fd, view[: whole_pages(hi - chunk)], chunk, hi - chunk,
                                  path)
        prefault(target[lo - position :].ctypes.data, hi - lo)
        np.copyto(target[lo - position : hi - position], buffer[lo - chunk : hi - chunk])
        return calls

    return [functools.partial(job, chunk) for chunk in range(first, end, DIRECT_CHUNK_BYTES)]


_local = threading.local()


def _bounce_buffer() -> np.ndarray:
    """This thread's page-aligned buffer of DIRECT_CHUNK_BYTES, faulted in once and reused."""
    buffer: np.ndarray | None = getattr(_local, "buffer", None)
    if buffer is None or buffer.size != DIRECT_CHUNK_BYTES:
        buffer = _local.buffer = fresh_buffer(DIRECT_CHUNK_BYTES, page_aligned=True).numpy()
    return buffer


def _call(fd: int, vectors: list[Any], position: int, path: str, *,
          fault: tuple[int, int]) -> Callable[[], int]:
    """A job: fill ``vectors`` from ``position`` in one go; the target's pages they lie in
    (``fault``: address, bytes) are faulted in first."""
    def job() -> int:
        prefault(*fault)
        return pread_into(fd, list(vectors), position, path)
    return job
