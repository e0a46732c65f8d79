"""Host memory for a rank's bytes: fresh buffers, optionally huge-page backed, and file mappings.

A loader that copies into new memory pays for first touch: with 4 KiB pages the kernel takes a
fault and zeroes a page for every 4 KiB written. Transparent huge pages take one fault per
2 MiB instead, and on the benchmark's VM that made reading a 148 MB file into fresh memory 4x
faster in one session (14 ms against 62 ms, page cache warm) -- and 4x to 5x *slower* in
another (a TP=8 rank 330 ms against 84 ms; TP=1 cold 4.9 s against 0.84 s), where the VM's
freed memory had been handed back to its host and every fresh 2 MiB block had to be faulted
in from there. So huge pages are opt-in (:data:`USE_HUGE_PAGES`): measure on the machine
that serves (``benchmarks/load/bench_load.py`` reports both).

Tensors made here keep their memory alive (``torch.frombuffer`` holds a reference to the
mapping); it is returned when the last view is gone. They are not resizable.
"""

from __future__ import annotations

import io
import mmap
import sys
from contextlib import suppress
from functools import cache
from typing import Any

import torch

from ..format.errors import Finding, SafetensorsError

__all__ = ["HUGE_PAGE_BYTES", "PAGE_BYTES", "USE_HUGE_PAGES", "advise_huge_pages", "fresh_buffer",
           "map_file", "prefault", "whole_pages"]

#: The address alignment :func:`fresh_buffer` can be asked for: a page (direct I/O needs it).
PAGE_BYTES = mmap.PAGESIZE


def whole_pages(nbytes: int) -> int:
    """``nbytes`` rounded up to whole pages."""
    return -(-nbytes // PAGE_BYTES) * PAGE_BYTES

#: Below this, a buffer is ordinary allocator memory: huge pages cannot help a smaller one.
HUGE_PAGE_BYTES = 2 * 1024 * 1024

#: Advise fresh buffers of HUGE_PAGE_BYTES or more for transparent huge pages (Linux, THP in
#: ``madvise`` or ``always`` mode). Off by default: whether it pays depends on the machine
#: (see the module docstring); False gives torch.empty's memory.
USE_HUGE_PAGES = False

# Absent on Windows (and MADV_HUGEPAGE on other non-Linux systems): then plain memory is used.
_PRIVATE_ANONYMOUS = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)
# Linux 5.14 and later; Python's mmap module names it from 3.13 on.
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23 if sys.platform == "linux" else None)


def fresh_buffer(nbytes: int, *, page_aligned: bool = False, huge_pages: bool | None = None
                 ) -> torch.Tensor:
    """``nbytes`` of new, writable host memory as a uint8 tensor.

    ``page_aligned``: the first byte starts a page, as reads that bypass the page cache need.
    ``huge_pages``: advise the memory for huge pages (None: :data:`USE_HUGE_PAGES`).
    """
    huge = USE_HUGE_PAGES if huge_pages is None else huge_pages
    if nbytes < HUGE_PAGE_BYTES or not huge or not hasattr(mmap, "MAP_ANONYMOUS"):
        return _torch_buffer(nbytes, page_aligned)
    try:
        mapping = mmap.mmap(-1, nbytes, flags=_PRIVATE_ANONYMOUS)
    except (OSError, ValueError):  # address space or overcommit limits: let torch try
        return _torch_buffer(nbytes, page_aligned)
    if _MADV_HUGEPAGE is not None:
        # Transparent huge pages set to "never", or a kernel without them: 4 KiB pages, as
        # torch.empty would give.
        with suppress(OSError):
            mapping.madvise(_MADV_HUGEPAGE)
    return torch.frombuffer(mapping, dtype=torch.uint8)


def advise_huge_pages(tensor: torch.Tensor) -> bool:
    """Advise the whole huge pages inside ``tensor``'s storage (host memory someone else
    allocated, not yet touched) for transparent huge pages; False where nothing was advised
    (too small, not Linux, THP off)."""
    if _MADV_HUGEPAGE is None or tensor.device.type != "cpu":
        return False
    storage = tensor.untyped_storage()
    start = -(-storage.data_ptr() // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    end = (storage.data_ptr() + storage.nbytes()) // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    if end <= start:
        return False
    return _madvise(start, end - start, _MADV_HUGEPAGE)


def prefault(address: int, nbytes: int) -> bool:
    """Fault in the pages of ``[address, address + nbytes)`` for writing, in one call, without
    changing a byte; False where the kernel cannot (before Linux 5.14, not Linux).

    Memory someone else allocated and never touched (vLLM's parameters) is faulted in page by
    page by whatever first writes it. When that writer is the kernel's copy of a ``preadv``,
    each 4 KiB page costs an exception inside the copy; populating the range first is cheaper
    (10% of a warm vLLM load on the benchmark's VM, ``benchmarks/README.md``).
    """
    if _MADV_POPULATE_WRITE is None or nbytes <= 0:
        return False
    first = address - address % PAGE_BYTES  # an older kernel fails it fast with EINVAL
    return _madvise(first, address + nbytes - first, _MADV_POPULATE_WRITE)


@cache
def _libc() -> Any:
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def _madvise(address: int, length: int, advice: int) -> bool:
    libc = _libc()
    return libc is not None and bool(libc.madvise(address, length, advice) == 0)


def _torch_buffer(nbytes: int, page_aligned: bool) -> torch.Tensor:
    if not page_aligned:
        return torch.empty(nbytes, dtype=torch.uint8)
    spare = torch.empty(nbytes + PAGE_BYTES, dtype=torch.uint8)  # a page more, to start on one
    skip = -spare.data_ptr() % PAGE_BYTES
    return spare[skip : skip + nbytes]


def map_file(handle: io.FileIO, size: int, path: str) -> torch.Tensor:
    """The whole open file as a copy-on-write uint8 tensor: no byte is read until touched.

    Writes to the tensor (or views of it) go to private pages and never reach the file. The
    mapping is made from the descriptor the caller already opened and checked, not from the
    path, so a file swapped in after the checks cannot be mapped instead.
    """
    try:
        mapping = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_COPY)  # MAP_PRIVATE
    except (ValueError, OSError) as exc:  # the file shrank after its size was taken
        raise SafetensorsError(Finding(
            code="st-offsets", file=path,
            message=f"the file cannot be mapped ({exc}): it changed while it was read")) from None
    return torch.frombuffer(mapping, dtype=torch.uint8)
