"""Positional reads that fill buffers exactly, whatever the kernel returns per call, from one
thread or from several at once."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from ..format.errors import Finding, SafetensorsError

__all__ = ["pread_into", "pread_parallel"]


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
