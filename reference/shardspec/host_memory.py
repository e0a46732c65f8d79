"""Host memory for a rank's bytes: fresh buffers that fault in cheaply, and file mappings.

A loader that copies into new memory pays for first touch: with 4 KiB pages the kernel takes a
fault and zeroes a page for every 4 KiB written. On the benchmark's VM that made reading a
148 MB file into ``torch.empty`` memory 4x slower than reading it into memory already touched
(62 ms against 14 ms, page cache warm). One anonymous mapping per file, advised for
transparent huge pages, takes one fault per 2 MiB instead and runs at the reused-memory rate.

Tensors made here keep their mapping alive (``torch.frombuffer`` holds a reference); the
memory is returned when the last view is gone. They are not resizable.
"""

from __future__ import annotations

import io
import mmap
from contextlib import suppress

import torch

__all__ = ["HUGE_PAGE_BYTES", "USE_HUGE_PAGES", "fresh_buffer", "map_file"]

#: Below this, a buffer is ordinary allocator memory: huge pages cannot help a smaller one.
HUGE_PAGE_BYTES = 2 * 1024 * 1024

#: Advise fresh buffers for transparent huge pages. Where THP's ``defrag`` setting makes the
#: kernel compact memory on fault, a fragmented machine can stall a fault for milliseconds
#: (seen as rare outliers on the benchmark VM); set False to get torch.empty's 4 KiB pages.
USE_HUGE_PAGES = True

# Absent on Windows (and MADV_HUGEPAGE on other non-Linux systems): then plain memory is used.
_PRIVATE_ANONYMOUS = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)


def fresh_buffer(nbytes: int) -> torch.Tensor:
    """``nbytes`` of new, writable host memory as a uint8 tensor, advised for huge pages."""
    if nbytes < HUGE_PAGE_BYTES or not USE_HUGE_PAGES or not hasattr(mmap, "MAP_ANONYMOUS"):
        return torch.empty(nbytes, dtype=torch.uint8)
    try:
        mapping = mmap.mmap(-1, nbytes, flags=_PRIVATE_ANONYMOUS)
    except (OSError, ValueError):  # address space or overcommit limits: let torch try
        return torch.empty(nbytes, dtype=torch.uint8)
    if _MADV_HUGEPAGE is not None:
        # Transparent huge pages set to "never", or a kernel without them: 4 KiB pages, as
        # torch.empty would give.
        with suppress(OSError):
            mapping.madvise(_MADV_HUGEPAGE)
    return torch.frombuffer(mapping, dtype=torch.uint8)


def map_file(handle: io.FileIO, size: int) -> torch.Tensor:
    """The whole open file as a copy-on-write uint8 tensor: no byte is read until touched.

    Writes to the tensor (or views of it) go to private pages and never reach the file. The
    mapping is made from the descriptor the caller already opened and checked, not from the
    path, so a file swapped in after the checks cannot be mapped instead.
    """
    mapping = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_COPY)  # MAP_PRIVATE
    return torch.frombuffer(mapping, dtype=torch.uint8)
