"""Resharding, the byte runs: a box of a source piece -> reads into a target piece (SPEC 11.3).

A box's bytes in its source entry are runs at fixed strides. A run contiguous both in the source
and in the target (a column-parallel slice, a replicated tensor) is read straight into the
target's memory; others (a row-parallel slice) are read into a scratch buffer and copied with one
strided copy. From a local file, runs less than :data:`COALESCE_GAP` apart are read as one, and
reads that follow each other are gathered into one ``preadv``; from object storage every run of
an object is planned together into ranged requests (:func:`requests_for`), and so is every run
of a local file read through :class:`BudgetedFileReads`, which bounds the gap bytes read.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from numpy.lib.stride_tricks import as_strided

from ..format.dtypes import DTYPES
from ..format.errors import Finding, ShardspecError, error_for
from ..format.integrity import Digests
from ..format.safetensors_header import Header
from ..load.reads import pread_into
from ..storage.remote_files import RemoteObject
from .plan import SourcePiece, TargetPiece

__all__ = [
    "COALESCE_GAP",
    "BudgetedFileReads",
    "FileReads",
    "ReadStats",
    "RemoteReads",
    "Scratch",
    "read_box",
    "requests_for",
]

#: Runs of wanted bytes at most this far apart in a file are read with one read call: reading a
#: gap this small costs less than another request to the storage.
COALESCE_GAP = 1 << 20

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


class Scratch:
    """A reusable host buffer for reads that are copied, not read in place."""

    def __init__(self) -> None:
        self.buffer = torch.empty(0, dtype=torch.uint8)

    def get(self, size: int) -> torch.Tensor:
        if self.buffer.numel() < size:
            self.buffer = torch.empty(size, dtype=torch.uint8)
        return self.buffer[:size]


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


def read_box(
    reads: FileReads | BudgetedFileReads | RemoteReads,
    header: Header,
    name: str,
    target: TargetPiece,
    source: SourcePiece,
    out: torch.Tensor,
    scratch: Scratch,
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
    if isinstance(reads, BudgetedFileReads):  # many runs: positions computed in bulk
        positions = np.zeros(1, dtype=np.int64) + base
        for b, stride in zip(box[:level], src_strides[:level], strict=True):
            positions = (positions[:, None] + np.arange(b, dtype=np.int64) * stride).ravel()
        reads.add_runs(positions, buffer, chunk)
    else:
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


class FileReads:
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


class BudgetedFileReads:
    """One local file's reads, planned together as :class:`RemoteReads` plans an object's:
    every wanted run is gathered, the smallest gaps are bridged while the bytes read beyond the
    wanted ones, the file's header (``header_bytes``) included, stay within ``gap_budget`` x
    the wanted bytes, and each resulting span is one ``preadv`` (in groups of the system's
    IOV_MAX), its gaps landing in a discard buffer. A row-parallel slice of row-split pieces
    (FSDP -> TP) is then read row by row instead of whole; the rows are planned with numpy, so
    what a row costs is mostly its read call. Copies out of scratch buffers run after the
    reads."""

    #: Every gap is left to :meth:`flush`'s budget.
    coalesce_gap = 0

    def __init__(self, fd: int, stats: ReadStats, path: str, gap_budget: float,
                 header_bytes: int = 0) -> None:
        self.fd, self.stats, self.path, self.gap_budget = fd, stats, path, gap_budget
        self.header_bytes = header_bytes
        #: (file positions, buffer, run length): run i fills buffer[i * length : ...]
        self.groups: list[tuple[np.ndarray, memoryview, int]] = []
        self.copies: list[Callable[[], object]] = []

    def add(self, position: int, into: torch.Tensor) -> None:
        view = memoryview(into.numpy())  # type: ignore[arg-type]
        if len(view):
            self.groups.append((np.array([position], dtype=np.int64), view, len(view)))

    read = add

    def add_runs(self, positions: np.ndarray, buffer: torch.Tensor, length: int) -> None:
        """Fill ``buffer`` with runs of ``length`` bytes from each of ``positions``, in order."""
        if length and len(positions):
            view = memoryview(buffer.numpy())  # type: ignore[arg-type]
            self.groups.append((positions, view, length))

    def barrier(self) -> None:
        """Nothing: every run of the file is planned together in :meth:`flush`."""

    def then(self, copy: Callable[[], object]) -> None:
        self.copies.append(copy)

    def flush(self) -> None:
        groups, self.groups = self.groups, []
        if groups:
            self._read(groups)
        copies, self.copies = self.copies, []
        for copy in copies:
            copy()

    def _read(self, groups: list[tuple[np.ndarray, memoryview, int]]) -> None:
        starts = np.concatenate([positions for positions, _, _ in groups])
        lengths = np.concatenate([np.full(len(p), n, dtype=np.int64) for p, _, n in groups])
        owner = np.concatenate([np.full(len(p), g, dtype=np.int64)
                                for g, (p, _, _) in enumerate(groups)])
        index = np.concatenate([np.arange(len(p), dtype=np.int64) for p, _, _ in groups])
        order = np.argsort(starts, kind="stable")
        starts, lengths, owner, index = starts[order], lengths[order], owner[order], index[order]
        ends = starts + lengths
        gaps = starts[1:] - ends[:-1]
        if (gaps < 0).any():  # overlapping runs (never planned so): each read on its own
            gaps = np.full(len(gaps), -1, dtype=np.int64)
        allowance = max(0.0, self.gap_budget * float(lengths.sum()) - self.header_bytes)
        by_size = np.argsort(gaps, kind="stable")
        taken = by_size[(np.cumsum(gaps[by_size]) <= allowance) & (gaps[by_size] >= 0)]
        bridged = np.zeros(len(gaps), dtype=bool)
        bridged[taken] = True
        discard = memoryview(bytearray(int(gaps[bridged].max()) if bridged.any() else 0))
        bounds = [0, *(np.flatnonzero(~bridged) + 1).tolist(), len(starts)]
        starts_, lengths_ = starts.tolist(), lengths.tolist()
        owner_, index_ = owner.tolist(), index.tolist()
        for first, last in itertools.pairwise(bounds):
            views: list[memoryview] = []
            cursor = starts_[first]
            for run in range(first, last):
                position, length = starts_[run], lengths_[run]
                if position > cursor:
                    views.append(discard[: position - cursor])
                offset = index_[run] * length
                views.append(groups[owner_[run]][1][offset : offset + length])
                cursor = position + length
            at = starts_[first]
            for group in range(0, len(views), _IOV_MAX):
                batch = views[group : group + _IOV_MAX]
                self.stats.reads += pread_into(self.fd, batch, at, self.path)
                at += sum(map(len, batch))
            self.stats.data_bytes += at - starts_[first]


class RemoteReads:
    """One object's reads: every wanted run is gathered first, then fetched by ranged
    requests, :data:`~shardspec.storage.remote.REQUESTS_IN_FLIGHT` at once. Bytes that came with the
    header's request (``prefix``) are not asked again. Neighbouring runs share a request when
    the gap between them is among the smallest, while everything asked of the object, the
    header's request included, stays within ``gap_budget`` x the wanted bytes (a
    request costs a round trip, a gap only bytes). Copies out of scratch buffers run after the
    last request.

    With ``digests`` (the object is to be verified, SPEC 9.2: its digests, fed ``prefix``
    already), the rest of the object is streamed instead, in order, hashed as it comes, each
    wanted run copied out of it: every byte is fetched once, never a second time for the runs.
    """

    #: Every gap is left to :meth:`flush`'s budget.
    coalesce_gap = 0

    def __init__(self, source: RemoteObject, stats: ReadStats, prefix: bytes,
                 gap_budget: float, digests: Digests | None = None) -> None:
        self.source, self.stats, self.gap_budget = source, stats, gap_budget
        self.digests = digests
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
        if self.digests is not None:
            self._stream(rest)
        else:
            self._fetch(rest, wanted - sum(len(view) for _, view in rest), wanted)
        copies, self.copies = self.copies, []
        for copy in copies:
            copy()

    def _fetch(self, rest: list[tuple[int, memoryview]], from_prefix: int,
               wanted: int) -> None:
        """``rest`` by ranged requests, the gaps between them within the budget."""
        unwanted = len(self.prefix) - from_prefix
        allowance = max(0.0, self.gap_budget * wanted - unwanted)
        requests = requests_for(rest, allowance, self.source.root.link.request_bytes())

        def fetch(request: tuple[int, int, list[tuple[int, memoryview]]]) -> None:
            start, end, inside = request
            data = memoryview(self.source.read(start, end))
            for position, view in inside:
                low, high = max(position, start), min(position + len(view), end)
                view[low - position : high - position] = data[low - start : high - start]

        self.source.root.map(fetch, requests)
        self.stats.reads += len(requests)
        self.stats.data_bytes += sum(end - start for start, end, _ in requests)

    def _stream(self, rest: list[tuple[int, memoryview]]) -> None:
        """The object past the prefix in order, hashed, ``rest`` (sorted, disjoint) copied
        out of it as it comes."""
        assert self.digests is not None
        at, index, size = len(self.prefix), 0, self.source.size
        if at >= size:
            return
        for chunk in self.source.stream(at, size):
            data = memoryview(chunk)
            end = at + len(data)
            self.digests.update(data)
            while index < len(rest) and rest[index][0] + len(rest[index][1]) <= at:
                index += 1
            look = index
            while look < len(rest) and rest[look][0] < end:
                position, view = rest[look]
                low, high = max(position, at), min(position + len(view), end)
                view[low - position : high - position] = data[low - at : high - at]
                look += 1
            self.stats.reads += 1
            self.stats.data_bytes += len(data)
            at = end


def requests_for(
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
