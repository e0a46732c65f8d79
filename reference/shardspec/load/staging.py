"""Reads that end on an accelerator: a bounded ring of pinned host buffers between file and device.

Chunk k of a file's data region is read into staging buffer k mod ``depth`` while the copies
of earlier chunks run on the device's copy engine; a buffer is refilled only after the copy
that last read it has completed. Pinned memory stays at ``depth`` x ``chunk`` bytes whatever
the file's size, and no full-size host copy of the rank is made. Up to ``readers`` reads are
in flight at once (``preadv`` releases the GIL), so a fast disk or a warm page cache is not
held to one core's copy rate. Where the page cache does not hold the file, each chunk is read
around it (``O_DIRECT``) straight into its pinned buffer: no copy into the cache and out.

The copy engine is an interface: :class:`CudaCopyEngine` on a GPU, and any object with the same
four methods in tests, so that the ordering can be checked without a GPU.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import torch

from .host_memory import PAGE_BYTES, whole_pages
from .reads import pread_direct_span, pread_into

__all__ = ["Completion", "CopyEngine", "CudaCopyEngine", "staged_read"]


class Completion(Protocol):
    """Something that can be waited for: a CUDA event, in practice."""

    def synchronize(self) -> None: ...


class CopyEngine(Protocol):
    """Where staged bytes go, and how they get there."""

    def staging_buffer(self, nbytes: int) -> torch.Tensor:
        """A host uint8 buffer the engine can copy from asynchronously (pinned, on CUDA)."""
        ...

    def output_buffer(self, nbytes: int) -> torch.Tensor:
        """The uint8 destination for a whole data region, on the device."""
        ...

    def copy_async(self, dst: torch.Tensor, src: torch.Tensor) -> Completion:
        """Start copying ``src`` into ``dst``; the result completes once ``src`` may be reused."""
        ...

    def finish(self) -> None:
        """Wait for every copy started so far."""
        ...


class CudaCopyEngine:
    """Host-to-device copies on a side stream, from pinned buffers."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]

    def staging_buffer(self, nbytes: int) -> torch.Tensor:
        # torch's caching host allocator keeps freed pinned blocks, so later loads reuse them
        # instead of paying cudaHostAlloc again.
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def output_buffer(self, nbytes: int) -> torch.Tensor:
        out = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        # ``out`` may reuse memory that work queued on the current stream still uses; the
        # copies run on the side stream, so it waits for that work first.
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        return out

    def copy_async(self, dst: torch.Tensor, src: torch.Tensor) -> Completion:
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)
            event.record(self.stream)
        return event

    def finish(self) -> None:
        self.stream.synchronize()


def staged_read(
    engine: CopyEngine,
    fd: int,
    start: int,
    count: int,
    path: str,
    digest: Any | None,
    *,
    chunk: int,
    depth: int = 2,
    readers: int = 1,
    direct: int | None = None,
) -> torch.Tensor:
    """``count`` bytes of ``fd`` from offset ``start``, on the engine's device.

    ``digest`` (a hashlib object or None) is updated with the bytes in file order. ``direct``,
    a descriptor of the same file opened for direct I/O, reads each chunk around the page cache
    straight into its (page-aligned) staging buffer; the chunks then start on a page boundary
    of the file, so the first one holds a little of the header too, which is not copied.
    """
    if chunk < 1 or depth < 1 or readers < 1:
        raise ValueError("chunk, depth and readers must be positive")
    if direct is not None and chunk % PAGE_BYTES:
        raise ValueError("chunks read directly must be whole pages")
    out = engine.output_buffer(count)
    # The window read: from ``lead`` bytes before ``start`` (a page boundary when direct).
    lead = start % PAGE_BYTES if direct is not None else 0
    window = lead + count
    spans = [(position, min(chunk, window - position))
             for position in range(0, window if count else 0, chunk)]
    if not spans:
        return out
    size = min(chunk, window if direct is None else whole_pages(window))
    buffers = [engine.staging_buffer(size) for _ in range(min(depth, len(spans)))]

    def fill(index: int, previous_copy: Completion | None) -> None:
        if previous_copy is not None:
            previous_copy.synchronize()  # the copy that last read this buffer is done
        position, length = spans[index]
        buffer = buffers[index % len(buffers)]
        if direct is None:
            view = memoryview(buffer[:length].numpy())  # type: ignore[arg-type]
            pread_into(fd, [view], start + position, path)
        else:  # whole pages: the last chunk's may pass the end of the file
            view = memoryview(buffer[: whole_pages(length)].numpy())  # type: ignore[arg-type]
            pread_direct_span(direct, fd, view, start - lead + position, length, path)

    reads: dict[int, Future[None]] = {}
    with ThreadPoolExecutor(min(readers, len(buffers)), thread_name_prefix="shardspec-stage") \
            as pool:
        try:
            for index in range(len(buffers)):
                reads[index] = pool.submit(fill, index, None)
            for index, (position, length) in enumerate(spans):
                reads.pop(index).result()
                skip = max(0, lead - position)  # header bytes before ``start``
                staged = buffers[index % len(buffers)][skip:length]
                if digest is not None:
                    digest.update(memoryview(staged.numpy()))  # type: ignore[arg-type]
                at = position + skip - lead
                done = engine.copy_async(out[at : at + length - skip], staged)
                refill = index + len(buffers)
                if refill < len(spans):
                    reads[refill] = pool.submit(fill, refill, done)
        finally:
            # On an error, reads already queued still finish (the pool waits for them) and
            # copies already started must end before their buffers can be freed.
            for pending in reads.values():
                pending.cancel()
            engine.finish()
    return out
