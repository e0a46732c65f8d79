"""Positional reads that fill buffers exactly, whatever the kernel returns per call, from one
thread or from several at once; through the page cache, or around it (direct I/O)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from ..format.errors import Finding, SafetensorsError

__all__ = ["open_direct", "page_cache_share", "pread_direct", "pread_direct_span", "pread_into",
           "pread_parallel"]


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
