"""Positional reads that fill buffers exactly, whatever the kernel returns per call, from one
thread or from several at once; through the page cache, or around it (direct I/O)."""

from __future__ import annotations

import ctypes
import errno
import os
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any

import numpy as np

from ..format.errors import Finding, SafetensorsError

__all__ = ["IOV_MAX", "open_direct", "page_cache_share", "pread_direct", "pread_direct_span",
           "pread_into", "pread_parallel", "pread_runs"]


def pread_into(fd: int, views: list[memoryview], position: int, path: str) -> int:
    """Fill ``views`` in order from ``position`` of ``fd`` with ``preadv``; return the calls made.

    A read may return fewer bytes than asked (signals, some filesystems): it continues where it
    stopped. End of file before the views are full means the file changed while it was read.
    Safe to call from several threads on one descriptor: nothing depends on the file position.
    """
    calls = 0
    while views:
        got = os.preadv(fd, views, position)
        calls += 1
        if got <= 0:
            raise SafetensorsError(Finding(
                code="st-offsets", file=path,
                message="the file ended early: it changed while it was read"))
        position += got
        done = 0
        while done < len(views) and got >= len(views[done]):
            got -= len(views[done])
            done += 1
        views = views[done:]
        if got:
            views[0] = views[0][got:]
    return calls


#: Vectors per ``preadv`` call (Linux's IOV_MAX).
IOV_MAX = 1024


def pread_runs(fd: int, target: np.ndarray, dst: int, dst_stride: int, length: int, count: int,
               position: int, src_stride: int, path: str, scratch: np.ndarray | None = None
               ) -> int:
    """Fill ``count`` runs of ``length`` bytes of ``target`` (uint8), the i-th at byte
    ``dst + i * dst_stride``, from byte ``position + i * src_stride`` of ``fd``; return the
    calls made. The bytes between two runs in the file (``src_stride - length``, fewer than
    ``scratch`` holds) are read into ``scratch``, so that each call reads one span.

    The vectors are built by numpy and handed to libc's ``preadv`` whole, up to
    :data:`IOV_MAX` a call, with the GIL released: a row-parallel weight read from several
    files comes in thousands of 1 KiB runs, and a Python object a run would cost more than
    the copy (``benchmarks/README.md``). Where libc cannot be called, or a call returns short
    (a signal; the file changed), the runs go through :func:`pread_into`.
    """
    gap = src_stride - length
    libc = _libc()
    if libc is None or count < 2 or gap < 0 or (gap and (scratch is None or scratch.size < gap)):
        return _pread_runs_slowly(fd, target, dst, dst_stride, length, count, position,
                                  src_stride, path, scratch)
    base = target.ctypes.data + dst
    starts = base + np.arange(count, dtype=np.uint64) * np.uint64(dst_stride)
    step = 1 if not gap else 2
    vectors = np.empty((count * step - (step - 1), 2), dtype=np.uint64)
    vectors[::step, 0] = starts
    vectors[::step, 1] = length
    if gap:
        assert scratch is not None
        vectors[1::2, 0] = scratch.ctypes.data
        vectors[1::2, 1] = gap
    per_call = IOV_MAX if step == 1 else IOV_MAX - 2  # each call starts on a run
    calls = 0
    for first in range(0, len(vectors), per_call):
        chunk = vectors[first : first + per_call]
        run = first // step
        runs = (len(chunk) + step - 1) // step
        wanted = runs * length + (len(chunk) - runs) * gap
        offset = position + run * src_stride
        got = libc.preadv(fd, chunk.ctypes.data, len(chunk), offset)
        calls += 1
        if got != wanted:  # short or failed: these runs again, one careful call at a time
            if got < 0 and ctypes.get_errno() not in (errno.EINTR, errno.EAGAIN):
                code = ctypes.get_errno()
                raise OSError(code, f"{os.strerror(code)}: {path}")
            calls += _pread_runs_slowly(fd, target, dst + run * dst_stride, dst_stride, length,
                                        runs, offset, src_stride, path, scratch)
    return calls


def _pread_runs_slowly(fd: int, target: np.ndarray, dst: int, dst_stride: int, length: int,
                       count: int, position: int, src_stride: int, path: str,
                       scratch: np.ndarray | None) -> int:
    gap = src_stride - length
    rows = list(np.lib.stride_tricks.as_strided(target[dst:], (count, length), (dst_stride, 1)))
    if gap == 0 or (scratch is not None and 0 < gap <= scratch.size):
        filler = memoryview(scratch)[:gap] if gap else None  # type: ignore[arg-type]
        calls = 0
        for first in range(0, count, IOV_MAX // 2 - 1):
            vectors: list[Any] = []
            for row in rows[first : first + IOV_MAX // 2 - 1]:
                if vectors and filler is not None:
                    vectors.append(filler)
                vectors.append(row)
            calls += pread_into(fd, vectors, position + first * src_stride, path)
        return calls
    return sum(pread_into(fd, [row], position + i * src_stride, path)
               for i, row in enumerate(rows))


@cache
def _libc() -> Any:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        preadv = libc.preadv
    except (OSError, AttributeError):
        return None
    preadv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong]
    preadv.restype = ctypes.c_ssize_t
    return libc


_pools: dict[int, ThreadPoolExecutor] = {}


def _pool(threads: int) -> ThreadPoolExecutor:
    # Kept for the process: starting threads for every file would cost more than a small read.
    if threads not in _pools:
        _pools[threads] = ThreadPoolExecutor(threads, thread_name_prefix="shardspec-read")
    return _pools[threads]


def pread_parallel(fd: int, view: memoryview, position: int, path: str, *, threads: int,
                   chunk: int) -> int:
    """Fill ``view`` from ``position`` of ``fd`` with up to ``threads`` reads in flight.

    The view is cut into contiguous spans of ``chunk`` bytes (the last shorter), handed out in
    order: one thread copying out of the page cache (or waiting on one request to the disk)
    leaves cores and the device's queue idle. ``preadv`` releases the GIL and uses no file
    position, so the threads share the descriptor. Returns the read calls made.
    """
    spans = [(start, min(start + chunk, len(view))) for start in range(0, len(view), chunk)]
    if threads <= 1 or len(spans) <= 1:
        return sum(pread_into(fd, [view[a:b]], position + a, path) for a, b in spans)
    futures = [_pool(threads).submit(pread_into, fd, [view[a:b]], position + a, path)
               for a, b in spans]
    return sum(future.result() for future in futures)  # the first failure, raised in order


# Absent where the kernel has no such flags (not Linux): then every read goes through the cache.
_NOWAIT = getattr(os, "RWF_NOWAIT", None)
_DIRECT = getattr(os, "O_DIRECT", None)


def page_cache_share(fd: int, position: int, count: int, *, samples: int) -> float | None:
    """The share of ``samples`` pages spread over ``count`` bytes from ``position`` that the page
    cache holds; None where the kernel cannot say (no ``RWF_NOWAIT`` for this file or system).

    Each probe is a one-byte read that the kernel refuses rather than waits for the disk; a
    refused probe has the kernel read that one page. A page the cache holds is refused too
    while it carries a readahead mark, so one refusal does not make a region cold.
    """
    if _NOWAIT is None or count <= 0:
        return None
    probe = bytearray(1)
    held = 0
    for i in range(samples):
        try:
            # Midpoints of equal parts: the region's start is cached by reading the header.
            os.preadv(fd, [probe], position + count * (2 * i + 1) // (2 * samples), _NOWAIT)
        except BlockingIOError:
            continue
        except OSError:  # EOPNOTSUPP: a file system that cannot read without waiting
            return None
        held += 1
    return held / samples


def open_direct(fd: int) -> int | None:
    """A second descriptor on ``fd``'s open file that reads around the page cache (``O_DIRECT``),
    or None where that cannot be had (no such flag, no ``/proc``, a file system without it).

    Reopened through ``/proc/self/fd``, which names the open file itself, not a path, and
    checked to be the same file: nothing but the file already opened and checked is read.
    """
    if _DIRECT is None:
        return None
    try:
        direct = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | _DIRECT | os.O_CLOEXEC)
    except OSError:
        return None
    first, second = os.fstat(fd), os.fstat(direct)
    if (first.st_dev, first.st_ino) != (second.st_dev, second.st_ino):
        os.close(direct)
        return None
    return direct


def pread_direct(direct: int, fd: int, view: memoryview, position: int, end: int, path: str, *,
                 threads: int, chunk: int) -> int:
    """Fill ``view`` from ``position`` with direct reads from ``direct``, ``threads`` at a time.

    The caller aligns ``view``'s address, ``position`` and ``chunk`` to a page; the file's bytes
    end at ``end`` (relative to ``position``), which the view may pass by less than a page.
    Whatever a direct read does not deliver (a refused alignment, a short read) is read through
    the page cache from ``fd``, so the view is filled exactly or the file ended early. Returns
    the read calls made.
    """
    starts = range(0, min(len(view), end), chunk)
    futures = [_pool(threads).submit(pread_direct_span, direct, fd, view[a : a + chunk],
                                     position + a, min(chunk, end - a), path) for a in starts]
    return sum(future.result() for future in futures)  # the first failure, raised in order


def pread_direct_span(direct: int, fd: int, view: memoryview, position: int, want: int,
                      path: str) -> int:
    """Fill the first ``want`` bytes of ``view`` from ``position`` with one direct read of the
    whole (page-aligned) view, the rest through the page cache from ``fd``: what the direct
    read did not deliver (a refused alignment, a short read). Returns the read calls made."""
    try:
        got = os.preadv(direct, [view], position)
    except OSError:  # EINVAL: this file or device needs another alignment
        got = 0
    if got >= want:
        return 1
    return 1 + pread_into(fd, [view[got:want]], position + got, path)
