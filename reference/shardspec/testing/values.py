"""A generated tensor's bytes and boxes: random values of any dtype, the boxes of a
``torch.tensor_split``, and boxes in elements turned into torch's units (sub-byte dtypes pack
several elements a byte along the last dimension, SPEC 6.5)."""

from __future__ import annotations

import random

import torch

from ..format.dtypes import DTYPES
from .handwritten import F6, torch_shape

__all__ = ["make_tensor", "tensor_split_boxes", "torch_index", "writer_units"]


def make_tensor(dtype: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """A tensor of random bytes (NaN payloads and all); BOOL holds only 0 and 1."""
    torch_dtype = torch.uint8 if dtype in F6 else DTYPES[dtype].torch_dtype
    assert torch_dtype is not None
    tshape = torch_shape(dtype, shape)
    count = 1
    for dim in tshape:
        count *= dim
    if count == 0:
        return torch.empty(tshape, dtype=torch_dtype)
    raw = random.Random(seed).randbytes(count * torch_dtype.itemsize)
    if dtype == "BOOL":
        raw = bytes(b & 1 for b in raw)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(torch_dtype).reshape(tshape)


def tensor_split_boxes(shape: tuple[int, ...], splits: list[tuple[int, int]]
            ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(offset, size) boxes from splitting ``shape`` by each (dim, parts) in turn, as
    ``torch.tensor_split`` divides (SPEC 11.3 rule 4), in row-major order of the splits."""
    boxes = [((0,) * len(shape), shape)]
    for dim, parts in splits:
        out = []
        for offset, size in boxes:
            quotient, remainder = divmod(size[dim], parts)
            start = offset[dim]
            for i in range(parts):
                length = quotient + (i < remainder)
                out.append((offset[:dim] + (start,) + offset[dim + 1:],
                            size[:dim] + (length,) + size[dim + 1:]))
                start += length
        boxes = out
    return boxes


def torch_index(dtype: str, offset: tuple[int, ...], size: tuple[int, ...]
                 ) -> tuple[slice, ...]:
    """The index of a box given in elements into a tensor held in torch's units (F4 packs two
    elements a byte, an F6 placeholder 4 in 3 bytes, along the last dimension)."""
    last = len(offset) - 1
    return tuple(slice(*(torch_shape(dtype, (n,))[0] if d == last else n for n in (o, o + s)))
                 for d, (o, s) in enumerate(zip(offset, size, strict=True)))


def writer_units(dtype: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape or offset in elements as the writer counts it: the writer takes an F6
    placeholder for U8 bytes (:func:`~.handwritten.write_f6` relabels it afterwards)."""
    return torch_shape(dtype, shape) if dtype in F6 else shape
