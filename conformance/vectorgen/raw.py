"""Bytes made by hand, deterministically: values from fixed seeds, safetensors files, and
manifest text laid out the way the vectors show it."""

from __future__ import annotations

import json
import math
import random
import struct
from collections.abc import Iterable
from typing import Any

import torch

from shardspec.format.dtypes import spec_shape

TensorData = tuple[str, tuple[int, ...], bytes]  # spec dtype, spec shape (elements), raw bytes


def values(shape: Iterable[int], dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    """A tensor of ``shape`` and ``dtype`` with small values from ``random.Random(seed)``."""
    shape = tuple(shape)
    rng = random.Random(seed)
    n = math.prod(shape)
    if dtype == torch.bool:
        return torch.tensor([rng.random() < 0.5 for _ in range(n)], dtype=torch.bool).reshape(shape)
    if dtype == torch.float8_e8m0fnu:
        powers = [2.0 ** rng.randint(-4, 4) for _ in range(n)]
        return torch.tensor(powers, dtype=torch.float32).to(dtype).reshape(shape)
    if dtype.is_complex:
        re = torch.tensor([rng.randint(-16, 16) / 4 for _ in range(n)], dtype=torch.float32)
        im = torch.tensor([rng.randint(-16, 16) / 4 for _ in range(n)], dtype=torch.float32)
        return torch.complex(re, im).to(dtype).reshape(shape)
    if dtype.is_floating_point:
        floats = [rng.randint(-32, 32) / 8 for _ in range(n)]
        return torch.tensor(floats, dtype=torch.float32).to(dtype).reshape(shape)
    low = 0 if dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64) else -100
    ints = [rng.randint(low, 100) for _ in range(n)]
    return torch.tensor(ints, dtype=torch.int64).to(dtype).reshape(shape)


def random_bytes(count: int, seed: int) -> bytes:
    rng = random.Random(seed)
    return bytes(rng.randrange(256) for _ in range(count))


def f4(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """An F4 tensor of ``shape`` elements (torch float4_e2m1fn_x2 packs two per byte)."""
    packed = (*shape[:-1], shape[-1] // 2)
    raw = torch.tensor(list(random_bytes(math.prod(packed), seed)), dtype=torch.uint8)
    return raw.reshape(packed).view(torch.float4_e2m1fn_x2)


def raw(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes()


def triple(tensor: torch.Tensor) -> TensorData:
    dtype, shape = spec_shape(tensor)
    return dtype.name, tuple(shape), raw(tensor)


def st_header_text(header: dict[str, Any]) -> bytes:
    return json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def st_assemble(header: bytes, data: bytes, *, pad_to: int = 8, length: int | None = None) -> bytes:
    """8-byte little-endian length, the header (space-padded to ``pad_to``), the data region."""
    header += b" " * ((-(8 + len(header))) % pad_to)
    return struct.pack("<Q", len(header) if length is None else length) + header + data


def st_file(
    entries: Iterable[tuple[str, str, Iterable[int], bytes]],
    *,
    metadata: dict[str, str] | None = None,
    pad_to: int = 8,
) -> bytes:
    """A safetensors file of ``(name, dtype, shape, bytes)``, data laid out in the given order."""
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    data = b""
    for name, dtype, shape, payload in entries:
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    return st_assemble(st_header_text(header), data, pad_to=pad_to)


def st_split(blob: bytes) -> tuple[dict[str, Any], bytes]:
    """A well-formed safetensors file's header (parsed, in file order) and data region."""
    (length,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8 : 8 + length]), blob[8 + length :]


def st_tensors(blob: bytes) -> dict[str, TensorData]:
    """Every tensor of a well-formed safetensors file: name -> (dtype, shape, bytes)."""
    header, data = st_split(blob)
    header.pop("__metadata__", None)
    return {name: (e["dtype"], tuple(e["shape"]), data[e["data_offsets"][0] : e["data_offsets"][1]])
            for name, e in header.items()}


def st_entries(blob: bytes) -> list[tuple[str, str, tuple[int, ...], bytes]]:
    """The tensors of a file as ``st_file`` entries, in data order."""
    header, data = st_split(blob)
    header.pop("__metadata__", None)
    ordered = sorted(header.items(), key=lambda item: item[1]["data_offsets"])
    return [(name, e["dtype"], tuple(e["shape"]),
             data[e["data_offsets"][0] : e["data_offsets"][1]]) for name, e in ordered]


class Pairs(list):  # type: ignore[type-arg]
    """A JSON object given as ``(name, value)`` pairs, so a name can appear twice."""


class Raw(str):
    """Text written into the JSON verbatim (``NaN``, ``4.0``, ``1e400``)."""

    __slots__ = ()


def _flat(value: Any) -> bool:
    if isinstance(value, dict | Pairs):
        items = value.items() if isinstance(value, dict) else value
        return all(not isinstance(v, dict | list) or _scalars(v) for _, v in items)
    return _scalars(value)


def _scalars(value: Any) -> bool:
    return isinstance(value, list) and not isinstance(value, Pairs) and not any(
        isinstance(v, dict | list) for v in value)


def dump(value: Any, *, ascii_only: bool = False, depth: int = 0) -> str:
    """JSON like ``Manifest.to_json``: nested records indented, flat records on one line."""
    def scalar(v: Any) -> str:
        return str(v) if isinstance(v, Raw) else json.dumps(v, ensure_ascii=ascii_only)

    def one_line(v: Any) -> str:
        if isinstance(v, dict | Pairs):
            items = v.items() if isinstance(v, dict) else v
            return "{" + ", ".join(f"{scalar(k)}: {one_line(x)}" for k, x in items) + "}"
        if isinstance(v, list):
            return "[" + ", ".join(one_line(x) for x in v) + "]"
        return scalar(v)

    if not isinstance(value, dict | list) or _flat(value):
        return one_line(value)
    pad, inner = " " * depth, " " * (depth + 1)
    if isinstance(value, dict | Pairs):
        items = list(value.items() if isinstance(value, dict) else value)
        body = [f"{inner}{scalar(k)}: {dump(v, ascii_only=ascii_only, depth=depth + 1)}"
                for k, v in items]
        return "{\n" + ",\n".join(body) + "\n" + pad + "}"
    body = [inner + dump(v, ascii_only=ascii_only, depth=depth + 1) for v in value]
    return "[\n" + ",\n".join(body) + "\n" + pad + "]"


def manifest_text(data: Any, *, ascii_only: bool = False) -> bytes:
    return (dump(data, ascii_only=ascii_only) + "\n").encode("utf-8", "surrogatepass")
