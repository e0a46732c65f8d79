"""What the reference writer cannot write, done by hand on a written checkpoint: F6 data, files
moved into folders, a newer minor version's unknown members, and the file records kept true.

Used by the strategies (valid checkpoints) and the mutations (broken ones) alike.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..format.limits import MANIFEST_NAME

__all__ = [
    "F6",
    "SUB_BYTE",
    "UNKNOWN_PLACES",
    "file_records",
    "move_into",
    "newer_minor",
    "read_st",
    "refresh_record",
    "spec_shape",
    "st_bytes",
    "torch_shape",
    "write_f6",
]

F6 = ("F6_E2M3", "F6_E3M2")


SUB_BYTE = ("F4", *F6)


def torch_shape(dtype: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The torch shape holding a spec shape: F4 packs two elements a byte, F6 (which torch
    lacks) is held as its packed bytes, 4 elements in 3 bytes, until written."""
    if dtype == "F4":
        return (*shape[:-1], shape[-1] // 2)
    if dtype in F6:
        return (*shape[:-1], shape[-1] * 3 // 4)
    return shape


def spec_shape(dtype: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    if dtype == "F4":
        return (*shape[:-1], shape[-1] * 2)
    if dtype in F6:
        return (*shape[:-1], shape[-1] * 4 // 3)
    return shape


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def file_records(data: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for rank in data["ranks"]:
        yield from rank["files"]
    yield from data.get("extra_files", [])


def refresh_record(root: Path, data: dict[str, Any], path: str) -> None:
    for record in file_records(data):
        if record["path"] == path:
            record["size"] = (root / path).stat().st_size
            record["checksums"] = {"sha256": _sha256(root / path)}


def read_st(path: Path) -> tuple[dict[str, Any], bytes]:
    blob = path.read_bytes()
    (length,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8 : 8 + length]), blob[8 + length :]


def st_bytes(header: dict[str, Any] | bytes, data: bytes, pad: bytes = b" ") -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(
        header, separators=(",", ":"), ensure_ascii=False).encode()
    text += pad * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + data


def write_f6(root: Path, data: dict[str, Any], f6: dict[str, str]) -> None:
    """Relabel the uint8 placeholders of F6 tensors with their dtype and element shapes and
    offsets (the writer counted bytes along the last dimension: 3 bytes hold 4 elements)."""
    files: set[str] = set()
    for name, record in data["tensors"].items():
        if name not in f6 or "alias_of" in record:
            continue
        record["dtype"] = f6[name]
        if "shape" in record:
            record["shape"] = list(spec_shape(f6[name], tuple(record["shape"])))
        for piece in record["pieces"]:
            piece["shape"] = list(spec_shape(f6[name], tuple(piece["shape"])))
            if piece.get("offset"):
                piece["offset"] = list(spec_shape(f6[name], tuple(piece["offset"])))
            files.add(piece["file"])
    for path in sorted(files):
        header, blob = read_st(root / path)
        for name, entry in header.items():
            if name in f6:
                entry["dtype"] = f6[name]
                entry["shape"] = list(spec_shape(f6[name], tuple(entry["shape"])))
        (root / path).write_bytes(st_bytes(header, blob))
        refresh_record(root, data, path)


def move_into(root: Path, data: dict[str, Any], directory: str) -> None:
    """Move every data file into ``directory`` (SPEC 2.2 allows any relative path)."""
    (root / directory).mkdir(parents=True, exist_ok=True)
    moved = {}
    for rank in data["ranks"]:
        for record in rank["files"]:
            new = f"{directory}/{record['path']}"
            os.replace(root / record["path"], root / new)
            moved[record["path"]] = new
            record["path"] = new
    for record in data["tensors"].values():
        for piece in record.get("pieces", []):
            piece["file"] = moved[piece["file"]]


def newer_minor(root: Path, data: dict[str, Any], minor: int,
                 fields: list[tuple[str, str, Any]]) -> None:
    """Rewrite the manifest as format 1.<minor> with fields the writer's version does not know,
    which a reader of that version must ignore (4.3)."""
    data = copy.deepcopy(data)
    data["format_version"] = f"1.{minor}"
    for where, name, value in fields:
        for target in _places(data, where):
            target[name] = value
    text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    (root / MANIFEST_NAME).write_bytes(text.encode())


def _places(data: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The objects of a kind (SPEC 4.3 rule 1) that can hold unknown fields."""
    records = [r for r in data["tensors"].values()]
    if where == "manifest":
        return [data]
    if where == "layout":
        return [data["layout"]]
    if where == "quantization":
        return [data["quantization"]]
    if where == "rank":
        return list(data["ranks"])
    if where == "file":
        return list(file_records(data))
    if where == "tensor":
        return records
    if where == "piece":
        return [p for r in records for p in r.get("pieces", [])]
    if where == "logical":
        return [r["logical"] for r in records if "logical" in r]
    raise ValueError(where)


UNKNOWN_PLACES = ("manifest", "layout", "quantization", "rank", "file", "tensor", "piece",
                   "logical")
