"""Positional reads that fill buffers exactly, whatever the kernel returns per call."""

from __future__ import annotations

import os

from ..format.errors import Finding, SafetensorsError

__all__ = ["pread_into"]


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
