"""A copy engine for tests: the staging pipeline's ordering, checked without a GPU.

A copy is only *started* by ``copy_async``; its bytes move when something waits for it (its
``synchronize``, or ``finish``). A pipeline that refills a staging buffer before waiting for
the copy that reads it therefore copies the wrong chunk, and the bytes come out wrong.
"""

from __future__ import annotations

import threading

import torch

from shardspec.load.host_memory import fresh_buffer


class LazyCopy:
    def __init__(self, engine: FakeEngine, dst: torch.Tensor, src: torch.Tensor) -> None:
        self.engine, self.dst, self.src, self.done = engine, dst, src, False

    def synchronize(self) -> None:
        with self.engine.lock:
            if not self.done:
                self.dst.copy_(self.src)
                self.done = True
                self.engine.pending -= 1


class FakeEngine:
    """Counts what it hands out, so tests can bound staging memory."""

    def __init__(self, *, page_aligned: bool = False) -> None:
        self.page_aligned = page_aligned  # staging memory direct reads can fill, as pinned is
        self.lock = threading.Lock()
        self.copies: list[LazyCopy] = []
        self.staging_bytes = 0
        self.staging_buffers = 0
        self.pending = 0
        self.finished = 0

    def staging_buffer(self, nbytes: int) -> torch.Tensor:
        self.staging_buffers += 1
        self.staging_bytes += nbytes
        if self.page_aligned:
            return fresh_buffer(nbytes, page_aligned=True).fill_(0xAB)
        return torch.full((nbytes,), 0xAB, dtype=torch.uint8)

    def output_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.full((nbytes,), 0xCD, dtype=torch.uint8)

    def copy_async(self, dst: torch.Tensor, src: torch.Tensor) -> LazyCopy:
        copy = LazyCopy(self, dst, src)
        with self.lock:
            self.copies.append(copy)
            self.pending += 1
        return copy

    def finish(self) -> None:
        for copy in list(self.copies):
            copy.synchronize()
        self.finished += 1
