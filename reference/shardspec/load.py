"""A plan of reads -> tensors on a device.

Each data file's data region is read with large sequential reads into one buffer on the target
device; tensors are views of that buffer. On CUDA the reads go through two pinned staging
buffers so that reading chunk i+1 overlaps the host-to-device copy of chunk i.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch

from .dtypes import torch_layout
from .errors import Finding, IntegrityError, SafetensorsError
from .integrity import Readable
from .paths import open_inside
from .plan import FilePlan, RankPlan
from .safetensors_header import Entry, read_header

__all__ = ["CHUNK_BYTES", "execute_plan"]

#: Bytes per read call: large enough for sequential throughput, small enough to stage in pinned
#: memory and to overlap with host-to-device copies.
CHUNK_BYTES = 64 * 1024 * 1024


def execute_plan(
    root: Path, plan: RankPlan, device: torch.device, *, verify: bool = False
) -> dict[str, torch.Tensor]:
    """Read every file of ``plan`` onto ``device``; aliases share their target's storage."""
    stager = _CudaStager(device) if device.type == "cuda" else None
    tensors: dict[str, torch.Tensor] = {}
    for file_plan in plan.files:
        tensors.update(_load_file(root, file_plan, device, stager, verify))
    for alias, target in plan.aliases.items():
        tensors[alias] = tensors[target]
    return tensors


def _load_file(
    root: Path, plan: FilePlan, device: torch.device, stager: _CudaStager | None, verify: bool
) -> dict[str, torch.Tensor]:
    record = plan.record
    handle, size = open_inside(root, record.path)
    with handle:
        if size != record.size:
            raise IntegrityError(Finding(
                code="file-size", file=record.path,
                message=f"the file has {size} bytes, the manifest says {record.size}"))
        header = read_header(handle, size, record.path)
        plan.check_header(header)
        digest = hashlib.sha256(header.header_bytes) if verify else None
        count = size - header.data_start
        if stager is not None:
            data = stager.read(handle, count, record.path, digest)
        else:
            data = _read_into(handle, torch.empty(count, dtype=torch.uint8), record.path, digest)
    if digest is not None and digest.hexdigest() != record.checksums["sha256"]:
        raise IntegrityError(Finding(
            code="checksum-mismatch", file=record.path,
            message="the file's sha256 differs from the manifest's: it is corrupt or was changed"))
    return {name: _view(data, entry, device) for name, entry in header.entries.items()}


def _read_into(
    handle: Readable, buffer: torch.Tensor, path: str, digest: Any | None
) -> torch.Tensor:
    """Fill ``buffer`` (host memory) from ``handle`` in large reads."""
    view = memoryview(buffer.numpy())  # type: ignore[arg-type]
    position, total = 0, len(view)
    while position < total:
        got = handle.readinto(view[position : position + CHUNK_BYTES])
        if not got:
            raise SafetensorsError(Finding(code="st-offsets", file=path,
                                           message="the file ended early: it changed while read"))
        if digest is not None:
            digest.update(view[position : position + got])
        position += got
    return buffer


class _CudaStager:
    """Double-buffered pinned staging for reads that end on a CUDA device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        self.buffers: list[torch.Tensor] = []
        self.events = [torch.cuda.Event(), torch.cuda.Event()]  # type: ignore[no-untyped-call]

    def _staging(self, index: int, size: int) -> torch.Tensor:
        while len(self.buffers) < 2:
            self.buffers.append(torch.empty(CHUNK_BYTES, dtype=torch.uint8, pin_memory=True))
        return self.buffers[index][:size]

    def read(
        self, handle: Readable, count: int, path: str, digest: Any | None
    ) -> torch.Tensor:
        out = torch.empty(count, dtype=torch.uint8, device=self.device)
        # ``out`` may reuse memory that work queued on the current stream still uses; the copies
        # run on a side stream, so they must wait for that work first.
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        position, turn = 0, 0
        while position < count:
            size = min(CHUNK_BYTES, count - position)
            self.events[turn].synchronize()  # the copy that last used this buffer is done
            staging = _read_into(handle, self._staging(turn, size), path, digest)
            with torch.cuda.stream(self.stream):
                out[position : position + size].copy_(staging, non_blocking=True)
                self.events[turn].record(self.stream)
            position += size
            turn ^= 1
        self.stream.synchronize()
        return out


def _view(data: torch.Tensor, entry: Entry, device: torch.device) -> torch.Tensor:
    dtype, shape = torch_layout(entry.dtype, entry.shape)
    if entry.begin == entry.end:
        try:
            return torch.empty(shape, dtype=dtype, device=device)
        except RuntimeError:
            # No element, but other dimensions so large ([0, 2**40, 2**40]) that contiguous
            # strides overflow int64; a tensor without elements needs no strides.
            return torch.empty_strided(shape, (0,) * len(shape), dtype=dtype, device=device)
    raw = data[entry.begin : entry.end]
    if entry.begin % dtype.itemsize:
        raw = raw.clone()  # an unaligned offset is legal (SPEC 6.3) but torch cannot view it
    return raw.view(dtype).reshape(shape)
