"""A file's data region -> one fresh host buffer, read the way that suits where the bytes are.

- In the page cache (warm): positional reads through it, several threads at once, each copying
  a span out of the cache.
- Not in the page cache (cold), on Linux: direct reads (``O_DIRECT``) into page-aligned memory,
  many requests in flight. A buffered read of a cold file fills the cache at the pace of the
  kernel's readahead and then copies out of it; a direct read goes from the device into the
  buffer, with neither (a quarter to three quarters of the CPU time on the benchmark's VM),
  into memory advised for huge pages (:data:`DIRECT_HUGE_PAGES`). A direct
  read cannot use what the cache holds, which is why a warm file is not read so. Figures:
  ``benchmarks/README.md``.

:data:`DIRECT_READS` turns the second way off (``SHARDSPEC_DIRECT_READS=0`` too).
"""

from __future__ import annotations

import os

import torch

from .host_memory import PAGE_BYTES, fresh_buffer, whole_pages
from .reads import open_direct, page_cache_share, pread_direct, pread_parallel

__all__ = ["DIRECT_BELOW_CACHED_SHARE", "DIRECT_CHUNK_BYTES", "DIRECT_HUGE_PAGES",
           "DIRECT_MIN_BYTES", "DIRECT_READS", "DIRECT_READS_IN_FLIGHT", "direct_descriptor",
           "read_region"]


def _direct_reads_setting() -> bool:
    """False when ``SHARDSPEC_DIRECT_READS`` is ``0``, ``false``, ``no`` or ``off``, else True."""
    return os.environ.get("SHARDSPEC_DIRECT_READS", "").strip().lower() not in {
        "0", "false", "no", "off"}


#: Read data regions the page cache does not hold with direct I/O (Linux; elsewhere, or on a
#: file system that refuses it, every read goes through the cache).
DIRECT_READS = _direct_reads_setting()

#: Advise the buffers that direct reads fill for huge pages: the kernel then faults them in
#: 2 MiB at a time as it pins them. On the benchmark's VM this made cold loads faster in 17 of
#: 18 side-by-side medians, where huge pages for warm loads (``host_memory.USE_HUGE_PAGES``)
#: cost up to 3.4x (``benchmarks/README.md``).
DIRECT_HUGE_PAGES = True

#: Smaller regions are read through the cache: a few requests gain nothing from bypassing it.
DIRECT_MIN_BYTES = 8 * 1024 * 1024

#: Direct requests in flight at once (threads waiting on the device, not using cores).
DIRECT_READS_IN_FLIGHT = 16

#: Bytes per direct request (a multiple of the page size).
DIRECT_CHUNK_BYTES = 1024 * 1024

#: Pages of a region probed to decide whether the page cache holds it.
CACHE_PROBES = 8

#: A region is read directly when the cache holds less than this share of its probed pages.
#: A file the cache holds can miss a page here and there (reclaimed under memory pressure, or
#: refused while it carries a readahead mark), and reading such a file from the device took
#: up to twice as long as through the cache (``benchmarks/README.md``).
DIRECT_BELOW_CACHED_SHARE = 0.5


def read_region(fd: int, position: int, count: int, path: str, *, threads: int,
                chunk: int) -> torch.Tensor:
    """``count`` bytes from ``position`` of ``fd`` in a fresh uint8 tensor.

    ``threads`` and ``chunk`` shape the reads through the page cache.
    """
    direct = direct_descriptor(fd, position, count)
    if direct is None:
        data = fresh_buffer(count)
        pread_parallel(fd, memoryview(data.numpy()), position, path,  # type: ignore[arg-type]
                       threads=threads, chunk=chunk)
        return data
    try:
        # Whole pages around the region: direct reads start and end on page boundaries.
        first = position - position % PAGE_BYTES
        lead, end = position - first, position + count - first
        # DIRECT_HUGE_PAGES off leaves the choice to host_memory.USE_HUGE_PAGES (None).
        buffer = fresh_buffer(whole_pages(end), page_aligned=True,
                              huge_pages=DIRECT_HUGE_PAGES or None)
        pread_direct(direct, fd, memoryview(buffer.numpy()), first, end,  # type: ignore[arg-type]
                     path, threads=DIRECT_READS_IN_FLIGHT, chunk=DIRECT_CHUNK_BYTES)
    finally:
        os.close(direct)
    return buffer[lead : lead + count]


def direct_descriptor(fd: int, position: int, count: int) -> int | None:
    """A direct descriptor of ``fd``'s file when its region of ``count`` bytes from
    ``position`` is large and mostly not in the page cache, else None. The caller closes it."""
    if not DIRECT_READS or count < DIRECT_MIN_BYTES:
        return None
    share = page_cache_share(fd, position, count, samples=CACHE_PROBES)
    if share is None or share >= DIRECT_BELOW_CACHED_SHARE:
        return None
    return open_direct(fd)
