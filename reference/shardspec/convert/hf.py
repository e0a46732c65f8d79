"""Hugging Face checkpoint directories, and safetensors files written as a stream.

Reading: :class:`HFSource` finds a directory's weights (``model.safetensors``, or the shards a
``model.safetensors.index.json`` names), checks every file's header by the rules of SPEC 6.3
and reads any rectangular slice of a tensor along one dimension with ``pread`` into a bounded
buffer, so only the slice's bytes (or, for a slice across rows, blocks of whole rows) pass
through memory. safetensors' own ``get_slice`` was measured and not used here: in 0.8 it
returns views of a whole-file memory map (whose touched pages count as resident memory) or,
with ``backend="pread"``, reads the whole tensor before slicing along a later dimension.

Writing: :func:`write_safetensors` writes a safetensors file whose tensors arrive as chunks of
bytes, computing size and sha256 as it goes, under a temporary name renamed into place once
synced (SPEC 10.1). Peak memory is one chunk, whatever the file's size. Tensors are laid out
like safetensors does (larger element sizes first, then by name) after a header padded with
spaces to a multiple of 8 bytes, so every tensor's data is aligned to its element size.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..format.dtypes import DTYPES, DType
from ..format.errors import ShardspecError
from ..format.json_text import load_json
from ..format.limits import MANIFEST_NAME
from ..format.safetensors_header import Entry, read_header
from ..storage.commit import fsync_dir, write_durably

__all__ = [
    "BLOCK_BYTES",
    "DEFAULT_MAX_SHARD_SIZE",
    "HF_INDEX",
    "HF_SINGLE",
    "HFError",
    "HFSource",
    "OutTensor",
    "SourceTensor",
    "hf_shard_names",
    "iter_region",
    "iter_box",
    "iter_slice",
    "plan_hf_shards",
    "read_config",
    "write_hf_index",
    "write_safetensors",
]

HF_SINGLE = "model.safetensors"
HF_INDEX = "model.safetensors.index.json"
#: Hugging Face's historical default shard cap: "5GB", i.e. 5 * 10**9 bytes.
DEFAULT_MAX_SHARD_SIZE = 5 * 10**9
#: The most bytes one read brings into memory (a single row larger than this is read in parts).
BLOCK_BYTES = 16 * 1024 * 1024


class HFError(ValueError):
    """A Hugging Face directory that cannot be read as one checkpoint."""


@dataclass(frozen=True)
class SourceTensor:
    """A tensor of a safetensors file: where its bytes are and what they hold."""

    name: str
    path: Path
    data_start: int
    entry: Entry

    @property
    def dtype(self) -> DType:
        return self.entry.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.entry.shape

    @property
    def nbytes(self) -> int:
        return self.entry.end - self.entry.begin

    @property
    def offset(self) -> int:
        """Absolute file offset of the first byte."""
        return self.data_start + self.entry.begin


def read_config(root: Path) -> dict[str, Any] | None:
    """``root/config.json`` as a dict, or None where there is none."""
    path = root / "config.json"
    if not path.is_file():
        return None
    try:
        data = load_json(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise HFError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise HFError(f"{path}: not a JSON object")
    return data


def scan_safetensors(path: Path, label: str | None = None) -> dict[str, SourceTensor]:
    """Every tensor of one safetensors file (header checked by SPEC 6.3), in data order."""
    label = label or path.name
    size = path.stat().st_size
    try:
        with path.open("rb") as handle:
            header = read_header(handle, size, label)
    except ShardspecError as exc:
        raise HFError(f"{label}: not a valid safetensors file: {exc}") from None
    ordered = sorted(header.entries.values(), key=lambda e: (e.begin, e.end, e.name))
    return {e.name: SourceTensor(e.name, path, header.data_start, e) for e in ordered}


class HFSource:
    """A Hugging Face model directory: its weight files, their tensors, its config.

    ``model.safetensors`` is used when present (as transformers does), else the shards listed
    by ``model.safetensors.index.json``, whose ``weight_map`` must agree with the shards'
    headers exactly. ``.bin``/``.pt`` weights are not read.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        if not os.path.lexists(self.root):
            raise HFError(f"{self.root}: no such directory")
        if not self.root.is_dir():
            raise HFError(f"{self.root}: not a directory")
        self.config = read_config(self.root)
        self.weight_files = self._weight_files()
        self.tensors: dict[str, SourceTensor] = {}
        for file in self.weight_files:
            for name, tensor in scan_safetensors(self.root / file, file).items():
                if name in self.tensors:
                    raise HFError(f"tensor {name!r} is in both {self.tensors[name].path.name} "
                                  f"and {file}")
                self.tensors[name] = tensor
        if self.index is not None:
            self._check_index()

    def _weight_files(self) -> list[str]:
        self.index: dict[str, str] | None = None
        if (self.root / HF_SINGLE).is_file():
            return [HF_SINGLE]
        index_path = self.root / HF_INDEX
        if not index_path.is_file():
            if (self.root / MANIFEST_NAME).is_file():
                raise HFError(f"{self.root} is a shardspec checkpoint, not a Hugging Face one: "
                              "change its layout with shardspec reshard, or turn it back into "
                              "a Hugging Face directory with shardspec merge")
            found = sorted(p.name for p in self.root.glob("*.safetensors"))
            hint = f" (found {found} without an index)" if found else ""
            raise HFError(f"{self.root}: no {HF_SINGLE} and no {HF_INDEX}{hint}")
        try:
            data = load_json(index_path.read_text(encoding="utf-8"))
            weight_map = data["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:
            raise HFError(f"{index_path}: not a safetensors index ({exc})") from None
        if not isinstance(weight_map, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
            raise HFError(f"{index_path}: weight_map must map tensor names to file names")
        files = list(dict.fromkeys(weight_map.values()))
        for file in files:
            if "/" in file or "\\" in file or file in ("", ".", ".."):
                raise HFError(f"{index_path}: {file!r} is not a file name in the directory")
            if not (self.root / file).is_file():
                raise HFError(f"{index_path} names {file}, which does not exist")
        self.index = dict(weight_map)
        return sorted(files)

    def _check_index(self) -> None:
        assert self.index is not None
        for name, file in self.index.items():
            tensor = self.tensors.get(name)
            if tensor is None or tensor.path.name != file:
                raise HFError(f"{HF_INDEX} places {name!r} in {file}, but that file's header "
                              "does not hold it")
        extra = sorted(set(self.tensors) - set(self.index))
        if extra:
            raise HFError(f"tensors {extra} are in the shards but not in {HF_INDEX}")


def _pread_into(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):
        if hasattr(os, "preadv"):
            got = os.preadv(fd, [view[done:]], offset + done)
        else:  # pragma: no cover - platforms without preadv
            data = os.pread(fd, len(view) - done, offset + done)
            view[done:done + len(data)] = data
            got = len(data)
        if got <= 0:
            raise HFError("the file ended before the tensor's data")
        done += got


def _byte_count(elements: int, bits: int, name: str) -> int:
    if elements * bits % 8:
        raise HFError(f"tensor {name!r}: a slice of {elements} elements of {bits} bits is not "
                      "whole bytes; split sub-byte dtypes only where pieces are whole bytes")
    return elements * bits // 8


def iter_region(
    fd: int, offset: int, size: int, block: int = BLOCK_BYTES
) -> Iterator[bytearray]:
    """The ``size`` bytes at ``offset``, in chunks of at most ``block`` bytes."""
    position = 0
    while position < size:
        count = min(block, size - position)
        buffer = bytearray(count)
        _pread_into(fd, memoryview(buffer), offset + position)
        yield buffer
        position += count


def iter_slice(
    tensor: SourceTensor,
    dim: int | None,
    start: int = 0,
    stop: int | None = None,
    *,
    block: int = BLOCK_BYTES,
) -> Iterator[bytes | bytearray]:
    """The bytes of ``tensor[..., start:stop, ...]`` (slicing ``dim``; None: all of it), in
    row-major order, read in chunks of at most about ``block`` bytes."""
    shape, bits, name = tensor.shape, tensor.dtype.bits, tensor.name
    fd = os.open(tensor.path, os.O_RDONLY)
    try:
        if dim is None:
            yield from iter_region(fd, tensor.offset, tensor.nbytes, block)
            return
        stop = shape[dim] if stop is None else stop
        outer = int(np.prod(shape[:dim], dtype=np.int64)) if dim else 1
        inner = int(np.prod(shape[dim + 1:], dtype=np.int64)) if dim + 1 < len(shape) else 1
        row = _byte_count(shape[dim] * inner, bits, name)
        skip = _byte_count(start * inner, bits, name)
        chunk = _byte_count((stop - start) * inner, bits, name)
        if chunk == 0 or outer == 0:
            return
        if outer == 1 or chunk == row:
            yield from iter_region(fd, tensor.offset + skip, outer * chunk if chunk == row
                                   else chunk, block)
            return
        if row > block:  # rows too large to read whole: read each row's piece alone
            for i in range(outer):
                yield from iter_region(fd, tensor.offset + i * row + skip, chunk, block)
            return
        rows = max(1, block // row)  # read blocks of whole rows and keep each row's piece
        for first in range(0, outer, rows):
            count = min(rows, outer - first)
            buffer = np.empty((count, row), dtype=np.uint8)
            _pread_into(fd, buffer.data.cast("B"), tensor.offset + first * row)
            yield buffer[:, skip:skip + chunk].tobytes()
    finally:
        os.close(fd)


@dataclass(frozen=True)
class OutTensor:
    """A tensor to write: its header entry and a function giving its bytes as chunks."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    chunks: Callable[[], Iterable[bytes | bytearray | memoryview]]


def _layout_order(tensors: Sequence[OutTensor]) -> list[OutTensor]:
    """safetensors' own order: larger elements first, then by name (keeps data aligned)."""
    return sorted(tensors, key=lambda t: (-DTYPES[t.dtype].bits, t.name))


def write_safetensors(
    path: Path,
    tensors: Sequence[OutTensor],
    *,
    metadata: Mapping[str, str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[int, str]:
    """Write a safetensors file durably from streamed tensors; return (size, sha256 hex)."""
    ordered = _layout_order(tensors)
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    position = 0
    for t in ordered:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape),
                          "data_offsets": [position, position + t.nbytes]}
        position += t.nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)
    head = len(text).to_bytes(8, "little") + text
    result: dict[str, Any] = {}

    def write(temp: Path) -> None:
        digest = hashlib.sha256(head)
        size = len(head)
        with temp.open("wb") as handle:
            handle.write(head)
            for t in ordered:
                written = 0
                for chunk in t.chunks():
                    handle.write(chunk)
                    digest.update(chunk)
                    written += len(chunk)
                    if progress is not None:
                        progress(len(chunk))
                if written != t.nbytes:
                    raise RuntimeError(f"tensor {t.name!r}: produced {written} bytes, "
                                       f"expected {t.nbytes}")
                size += written
        result.update(size=size, sha256=digest.hexdigest())

    write_durably(path, write)
    return result["size"], result["sha256"]


def plan_hf_shards(sizes: Sequence[tuple[str, int]], max_shard_size: int) -> list[list[str]]:
    """Hugging Face's greedy split: a new shard when the next tensor would pass the cap."""
    shards: list[list[str]] = [[]]
    total = 0
    for name, size in sizes:
        if shards[-1] and total + size > max_shard_size:
            shards.append([])
            total = 0
        shards[-1].append(name)
        total += size
    return shards


def hf_shard_names(count: int) -> list[str]:
    """``model.safetensors`` for one shard, else ``model-00001-of-00003.safetensors``..."""
    if count == 1:
        return [HF_SINGLE]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def write_hf_index(root: Path, weight_map: Mapping[str, str], total_size: int) -> None:
    """``model.safetensors.index.json`` as transformers writes it (sorted keys, indent 2)."""
    data = {"metadata": {"total_size": total_size}, "weight_map": dict(weight_map)}
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"

    def write(temp: Path) -> None:
        temp.write_text(text, encoding="utf-8")

    write_durably(root / HF_INDEX, write)
    fsync_dir(root)


def iter_box(tensor: SourceTensor, offset: tuple[int, ...], shape: tuple[int, ...],
             *, block: int = BLOCK_BYTES) -> Iterator[bytes | bytearray]:
    """The bytes of the box ``offset``/``shape`` of ``tensor`` in row-major order.

    A box cut along one dimension is :func:`iter_slice`; one cut along several (a stacked
    expert tensor split by expert and tensor parallelism) is read as the cut of each slab
    below its first cut dimension, one slab after the other."""
    full = tensor.shape
    cut = [d for d, (o, s, n) in enumerate(zip(offset, shape, full, strict=True))
           if o != 0 or s != n]
    if len(cut) <= 1:
        dim = cut[0] if cut else None
        start = offset[dim] if dim is not None else 0
        stop = start + shape[dim] if dim is not None else None
        yield from iter_slice(tensor, dim, start, stop, block=block)
        return
    first = cut[0]
    bits = tensor.dtype.bits
    slab_elements = int(np.prod(full[first + 1:], dtype=np.int64))
    slab = _byte_count(slab_elements, bits, tensor.name)
    begin = tensor.entry.begin
    for index in itertools.product(*(range(offset[d], offset[d] + shape[d])
                                     for d in range(first + 1))):
        flat = 0
        for d, i in enumerate(index):
            flat = flat * full[d] + i
        entry = tensor.entry._replace(shape=full[first + 1:], begin=begin + flat * slab,
                                      end=begin + (flat + 1) * slab)
        part = SourceTensor(tensor.name, tensor.path, tensor.data_start, entry)
        yield from iter_box(part, offset[first + 1:], shape[first + 1:], block=block)
