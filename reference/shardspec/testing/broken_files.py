"""Broken data files: sizes, checksums, missing, not regular or escaping files, and safetensors
headers that are too long, not JSON, duplicated, mistyped, mis-sized, mis-placed or that
disagree with the manifest (SPEC 6, 7.2, 9).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from .handwritten import read_st, st_bytes
from .mutations import (
    Context,
    Mutation,
    data_files,
    element_count,
    file_level,
    mutation,
    pick_entry,
    rewrite_file,
)
from .strategies import tensor_names

__all__ = []


@mutation("file-size", lambda ctx: bool(ctx.files))
def _file_size(draw: st.DrawFn, ctx: Context) -> Mutation:
    file, extra = draw(st.sampled_from(ctx.files)), draw(st.integers(1, 16))

    def append(path: Path) -> None:
        with path.open("ab") as handle:
            handle.write(bytes(extra))

    return file_level("file-size", "file-size", "9.1",
                       f"{extra} bytes appended; the manifest keeps the old size", file, append,
                       refresh=False)


@mutation("checksum-mismatch", lambda ctx: any(f.data_size for f in ctx.files))
def _checksum(draw: st.DrawFn, ctx: Context) -> Mutation:
    file = draw(st.sampled_from([f for f in ctx.files if f.data_size]))
    back, bit = draw(st.integers(1, file.data_size)), draw(st.integers(0, 7))

    def flip(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[-back] ^= 1 << bit
        path.write_bytes(bytes(data))

    return file_level("checksum-mismatch", "checksum-mismatch", "9.2",
                       f"bit {bit} of data byte -{back} flipped (same size)", file, flip,
                       refresh=False)


@mutation("file-missing", lambda ctx: bool(ctx.files))
def _file_missing(draw: st.DrawFn, ctx: Context) -> Mutation:
    file = draw(st.sampled_from(ctx.files))
    return file_level("file-missing", "file-missing", "2.1", "the file is missing", file,
                       lambda path: path.unlink(), refresh=False)


@mutation("file-not-regular", lambda ctx: bool(ctx.files))
def _not_regular(draw: st.DrawFn, ctx: Context) -> Mutation:
    file = draw(st.sampled_from(ctx.files))

    def directory(path: Path) -> None:
        path.unlink()
        path.mkdir()

    return file_level("file-not-regular", "file-not-regular", "2.2", "the file is a directory",
                       file, directory, refresh=False)


@mutation("path-escapes", lambda ctx: bool(ctx.files))
def _path_escapes(draw: st.DrawFn, ctx: Context) -> Mutation:
    file = draw(st.sampled_from(ctx.files))
    depth = file.path.count("/")

    def link_outside(path: Path) -> None:
        outside = path.parents[depth].parent / "outside" / path.name
        outside.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(path), outside)
        os.symlink(os.path.relpath(outside, path.parent), path)

    return file_level("path-escapes", "path-escapes", "2.2",
                       "a symbolic link to a file outside the checkpoint", file, link_outside,
                       refresh=False)


@mutation("st-header-length", lambda ctx: bool(ctx.files))
def _header_length(draw: st.DrawFn, ctx: Context) -> Mutation:
    file = draw(st.sampled_from(ctx.files))
    how = draw(st.sampled_from(["past the end", "over the limit", "truncated file"]))

    def edit(path: Path) -> None:
        blob = path.read_bytes()
        if how == "past the end":
            blob = struct.pack("<Q", len(blob)) + blob[8:]
        elif how == "over the limit":
            blob = struct.pack("<Q", 100_000_001) + blob[8:]
        else:
            blob = blob[:5]
        path.write_bytes(blob)

    return file_level("st-header-length", "st-header-length", "6.3",
                       f"the header length is {how}", file, edit)


@mutation("st-header-json", lambda ctx: bool(ctx.files))
def _header_json(draw: st.DrawFn, ctx: Context) -> Mutation:
    file = draw(st.sampled_from(ctx.files))
    how = draw(st.sampled_from(["tab padding", "a leading space", "trailing garbage"]))

    def edit(path: Path) -> None:
        header, data = read_st(path)
        text = json.dumps(header, separators=(",", ":")).encode()
        if how == "a leading space":
            text = b" " + text
        elif how == "trailing garbage":
            text += b"\x00garbage"
        else:  # at least one tab, whatever the alignment
            text += b"\t"
        path.write_bytes(st_bytes(text, data, b"\t" if how == "tab padding" else b" "))

    return file_level("st-header-json", "st-header-json", "6.3", f"the header has {how}",
                       file, edit)


@mutation("st-duplicate-key", lambda ctx: bool(ctx.files))
def _duplicate_key(draw: st.DrawFn, ctx: Context) -> Mutation:
    file = draw(st.sampled_from(ctx.files))

    def edit(path: Path) -> None:
        header, data = read_st(path)
        key = "__metadata__" if "__metadata__" in header else next(iter(header), None)
        if key is None:
            text = b'{"__metadata__":{},"__metadata__":{}}'
        else:
            text = json.dumps(header, separators=(",", ":")).encode()[:-1] + b"," + \
                json.dumps({key: header[key]}, separators=(",", ":")).encode()[1:]
        path.write_bytes(st_bytes(text, data))

    return file_level("st-duplicate-key", "st-duplicate-key", "6.3",
                       "the header names a member twice", file, edit)


@mutation("st-dtype", lambda ctx: bool(data_files(ctx, entries=True)))
def _st_dtype(draw: st.DrawFn, ctx: Context) -> Mutation:
    file = draw(st.sampled_from(data_files(ctx, entries=True)))
    name = pick_entry(draw, file)
    dtype = file.header[name]["dtype"]
    wrong = draw(st.sampled_from([dtype.lower(), {"F8_E4M3": "F8_E4M3FN"}.get(dtype, "FP32")]))
    return file_level("st-dtype", "st-dtype", "6.4", f"{name!r} has the dtype {wrong!r}", file,
                       rewrite_file(lambda h: h[name].__setitem__("dtype", wrong)))


@mutation("st-size", lambda ctx: bool(data_files(ctx, entries=True)))
def _st_size(draw: st.DrawFn, ctx: Context) -> Mutation:
    file = draw(st.sampled_from(data_files(ctx, entries=True)))
    name = pick_entry(draw, file)
    old = list(file.header[name]["shape"])
    if old and element_count(old):
        shape = [old[0] + 1, *old[1:]]  # more elements in the same bytes
    else:  # a scalar gets two elements; an empty tensor some
        shape = [max(d, 1) for d in old] if old else [2]
    return file_level("st-size", "st-size", "6.3",
                       f"{name!r} claims shape {shape} but keeps its byte span", file,
                       rewrite_file(lambda h: h[name].__setitem__("shape", shape)))


@mutation("st-offsets", lambda ctx: bool(ctx.files))
def _st_offsets(draw: st.DrawFn, ctx: Context) -> Mutation:
    file, extra = draw(st.sampled_from(ctx.files)), draw(st.integers(1, 16))

    def append(path: Path) -> None:
        with path.open("ab") as handle:
            handle.write(b"PK" + bytes(extra))

    return file_level("st-offsets", "st-offsets", "6.3",
                       f"{extra + 2} bytes follow the last tensor", file, append)


@mutation("st-extra-tensor", lambda ctx: bool(ctx.files))
def _extra_tensor(draw: st.DrawFn, ctx: Context) -> Mutation:
    file = draw(st.sampled_from(ctx.files))
    name = draw(tensor_names().filter(lambda n: n not in file.header))

    def edit(path: Path) -> None:
        header, data = read_st(path)
        header[name] = {"dtype": "U8", "shape": [3], "data_offsets": [len(data), len(data) + 3]}
        path.write_bytes(st_bytes(header, data + b"\x01\x02\x03"))

    return file_level("st-extra-tensor", "st-extra-tensor", "7.2",
                       f"the file also holds {name!r}, which the manifest does not place there",
                       file, edit)


@mutation("st-missing-tensor", lambda ctx: bool(data_files(ctx, entries=True)))
def _missing_tensor(draw: st.DrawFn, ctx: Context) -> Mutation:
    file = draw(st.sampled_from(data_files(ctx, entries=True)))
    name = pick_entry(draw, file)

    def edit(path: Path) -> None:
        header, data = read_st(path)
        entries = sorted(((n, e) for n, e in header.items() if n not in ("__metadata__", name)),
                         key=lambda item: item[1]["data_offsets"])
        rebuilt: dict[str, Any] = {"__metadata__": header.get("__metadata__", {})}
        blob = b""
        for n, e in entries:
            begin, end = e["data_offsets"]
            rebuilt[n] = {**e, "data_offsets": [len(blob), len(blob) + end - begin]}
            blob += data[begin:end]
        path.write_bytes(st_bytes(rebuilt, blob))

    return file_level("st-missing-tensor", "st-missing-tensor", "7.2",
                       f"{name!r} is missing from the file", file, edit)


@mutation("st-mismatch", lambda ctx: bool(data_files(ctx, entries=True)))
def _mismatch(draw: st.DrawFn, ctx: Context) -> Mutation:
    file = draw(st.sampled_from(data_files(ctx, entries=True)))
    name = pick_entry(draw, file)
    shape = [*file.header[name]["shape"], 1]
    return file_level("st-mismatch", "st-mismatch", "7.2",
                       f"{name!r} is stored with shape {shape}", file,
                       rewrite_file(lambda h: h[name].__setitem__("shape", shape)))
