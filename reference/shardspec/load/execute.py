"""A plan of reads -> tensors on a device.

Each data file's data region becomes one buffer and its tensors are views of it:

- ``cpu``, copying (the default): large reads into one fresh host buffer per file, several at
  once, through the page cache where it holds the file and around it where it does not
  (:mod:`shardspec.load.host_reads`);
- ``cpu`` with ``mmap``: the file mapped copy-on-write, read by the kernel only where touched;
- ``cuda``: reads through a bounded ring of pinned staging buffers, each chunk's host-to-device
  copy overlapping the next reads (:mod:`shardspec.load.staging`), around the page cache where
  it does not hold the file; no full-size host copy;
- a checkpoint in object storage: ranged requests into one host buffer per file, moved to the
  device whole (:mod:`shardspec.load.remote`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch

from ..format.dtypes import DTYPES, DType, torch_layout
from ..format.errors import Finding, IntegrityError, SafetensorsError
from ..format.integrity import Digests, Readable, check_digests
from ..format.joins import Join
from ..format.safetensors_header import Entry, read_header
from ..storage.paths import open_inside
from ..storage.remote import RemoteRoot
from .host_memory import fresh_buffer, map_file
from .host_reads import direct_descriptor, read_region
from .plan import FilePlan, RankPlan
from .remote import read_remote_files
from .staging import CopyEngine, CudaCopyEngine, staged_read

__all__ = ["CHUNK_BYTES", "READ_CHUNK_BYTES", "READ_THREADS", "STAGING_BUFFERS",
           "STAGING_READERS", "execute_plan"]

#: Bytes per read call and per pinned staging buffer: large enough for sequential throughput,
#: small enough that several reads in flight stage little pinned memory.
CHUNK_BYTES = 16 * 1024 * 1024


def _read_threads() -> int:
    """``SHARDSPEC_READ_THREADS`` when it is a positive integer, else the cores this process
    may use, at most 8 (a GPU node's loaders run one process per GPU)."""
    setting = os.environ.get("SHARDSPEC_READ_THREADS", "")
    if setting.isdigit() and int(setting) > 0:
        return int(setting)
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(8, usable or 1)


#: Reads in flight at once for a copying load into host memory: one thread cannot keep the page
#: cache's copies or a fast disk's queue busy.
READ_THREADS = _read_threads()

#: The span each thread reads at a time; a data region of one span or less is read by the
#: calling thread alone.
READ_CHUNK_BYTES = 16 * 1024 * 1024

#: Reads in flight at once while staging a CUDA load: as many as a load into host memory makes,
#: since one core's copies out of a warm page cache (about 5 GB/s) are a tenth of what a pinned
#: host-to-device copy moves.
STAGING_READERS = READ_THREADS

#: Pinned staging buffers of CHUNK_BYTES each for a CUDA load, the bound on pinned memory: two
#: per read in flight, so that a buffer waiting for its copy to the device holds no reader up.
STAGING_BUFFERS = 2 * STAGING_READERS


def execute_plan(
    root: Path | RemoteRoot,
    plan: RankPlan,
    device: torch.device,
    *,
    verify: bool = False,
    mmap: bool = False,
    engine: CopyEngine | None = None,
) -> dict[str, torch.Tensor]:
    """Read every file of ``plan`` onto ``device``; aliases share their target's storage.

    ``mmap`` (cpu only) maps the files instead of reading them. ``engine`` overrides the copy
    engine of a non-cpu device (tests drive the staging logic through it on a CPU-only machine).
    """
    tensors: dict[str, torch.Tensor] = {}
    pieces: dict[str, dict[str, torch.Tensor]] = {}  # file -> the pieces it holds of joins
    if isinstance(root, RemoteRoot):
        for file_plan, header, data in read_remote_files(root, plan.files, verify):
            data = data if device.type == "cpu" else data.to(device)
            _gather(_views(data, header.entries, device), file_plan, plan, tensors, pieces)
    else:
        if engine is None and device.type == "cuda":
            engine = CudaCopyEngine(device)
        for file_plan in plan.files:
            _gather(_load_file(root, file_plan, device, engine, verify, mmap), file_plan, plan,
                    tensors, pieces)
    for name, join in plan.joins.items():  # SPEC 7.2 rule 7, 11.1 step 10
        tensors[name] = _join([pieces[p.file][name] for p in join.pieces], join,
                              DTYPES[plan.dtype_of(name)])
    for alias, target in plan.aliases.items():
        tensors[alias] = tensors[target]
    return tensors


def _join(parts: list[torch.Tensor], join: Join, dtype: DType) -> torch.Tensor:
    """The pieces one after the other along the join's dimension. A sub-byte dtype's torch
    shape need not follow its element shape (F6, odd widths: flat bytes), so those are joined
    as bytes: each piece's run at each index before the dimension is whole bytes (SPEC 7.2
    rule 7)."""
    if dtype.bits >= 8:
        return torch.cat(parts, dim=join.dim)
    torch_dtype, shape = torch_layout(dtype, join.shape)
    if not math.prod(join.shape):  # no elements (SPEC 7.7): no rows of bytes to lay out
        return torch.empty(shape, dtype=torch_dtype, device=parts[0].device)
    outer = math.prod(join.shape[:join.dim])
    rows = [p.contiguous().reshape(-1).view(torch.uint8).reshape(outer, -1) for p in parts]
    return torch.cat(rows, dim=1).reshape(-1).view(torch_dtype).reshape(shape)


def _gather(read: dict[str, torch.Tensor], file_plan: FilePlan, plan: RankPlan,
            tensors: dict[str, torch.Tensor], pieces: dict[str, dict[str, torch.Tensor]]) -> None:
    """File the tensors of one file: whole values, or pieces of a join kept by file."""
    if plan.joins:
        pieces[file_plan.record.path] = {n: read.pop(n) for n in list(read) if n in plan.joins}
    tensors.update(read)


def _load_file(
    root: Path, plan: FilePlan, device: torch.device, engine: CopyEngine | None, verify: bool,
    mmap: bool,
) -> dict[str, torch.Tensor]:
    record = plan.record
    handle, size = open_inside(root, record.path)
    with handle:
        if size != record.size:
            raise IntegrityError(Finding(
                code="file-size", file=record.path,
                message=f"the file has {size} bytes, the manifest says {record.size}"))
        header = read_header(handle, size, record.path)
        plan.check_header(header)
        digest = Digests(record.checksums) if verify else None
        if digest is not None:
            digest.update(header.header_bytes)
        count = size - header.data_start
        if mmap:
            data = map_file(handle, size, record.path)[header.data_start:]
            if digest is not None:
                digest.update(memoryview(data.numpy()))  # type: ignore[arg-type]
        elif engine is not None:
            direct = direct_descriptor(handle.fileno(), header.data_start, count)
            try:
                data = staged_read(engine, handle.fileno(), header.data_start, count,
                                   record.path, digest, chunk=CHUNK_BYTES,
                                   depth=STAGING_BUFFERS, readers=STAGING_READERS,
                                   direct=direct)
            finally:
                if direct is not None:
                    os.close(direct)
        elif digest is None:
            data = read_region(handle.fileno(), header.data_start, count, record.path,
                               threads=READ_THREADS, chunk=READ_CHUNK_BYTES)
        else:  # digests are fed in order, so one reader
            data = _read_into(handle, fresh_buffer(count), record.path, digest)
    if digest is not None:
        check_digests(record.path, record.checksums, digest.hexdigests())
    return _views(data, header.entries, device)


def _read_into(
    handle: Readable, buffer: torch.Tensor, path: str, digest: Any | None
) -> torch.Tensor:
    """Fill ``buffer`` (host memory) from ``handle``'s position in large reads."""
    view = memoryview(buffer.numpy())  # type: ignore[arg-type]
    position, total = 0, len(view)
    while position < total:
        try:
            got = handle.readinto(view[position : position + CHUNK_BYTES])
        except OSError as exc:
            raise SafetensorsError(Finding(code="st-offsets", file=path,
                                           message=f"the file cannot be read: {exc}")) from None
        if not got:
            raise SafetensorsError(Finding(code="st-offsets", file=path,
                                           message="the file ended early: it changed while read"))
        if digest is not None:
            digest.update(view[position : position + got])
        position += got
    return buffer


def _views(data: torch.Tensor, entries: dict[str, Entry], device: torch.device
           ) -> dict[str, torch.Tensor]:
    """Each entry's tensor as a view of ``data``, its file's data region.

    One strided view each of the whole storage, read as the entry's dtype (one torch call a
    tensor, not a slice, a dtype view and a reshape: a rank holds hundreds of tensors).
    """
    storage, base = data.untyped_storage(), data.storage_offset()
    as_dtype: dict[torch.dtype, torch.Tensor] = {}  # the storage read as each dtype
    out: dict[str, torch.Tensor] = {}
    for name, entry in entries.items():
        dtype, shape = torch_layout(entry.dtype, entry.shape)
        if entry.begin == entry.end:
            out[name] = _empty(shape, dtype, device)
            continue
        start, size = base + entry.begin, dtype.itemsize
        if start % size:  # an unaligned offset is legal (SPEC 6.3) but torch cannot view it
            out[name] = data[entry.begin : entry.end].clone().view(dtype).reshape(shape)
            continue
        whole = as_dtype.get(dtype)
        if whole is None:
            whole = as_dtype[dtype] = torch.empty(0, dtype=dtype, device=data.device).set_(
                storage)
        out[name] = whole.as_strided(shape, _contiguous_strides(shape), start // size)
    return out


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    try:
        return torch.empty(shape, dtype=dtype, device=device)
    except RuntimeError:
        # No element, but other dimensions so large ([0, 2**40, 2**40]) that contiguous
        # strides overflow int64; a tensor without elements needs no strides.
        return torch.empty_strided(shape, (0,) * len(shape), dtype=dtype, device=device)
