"""A data file's safetensors header, parsed and checked by the rules of SPEC 6.3-6.5.

The header is read and checked before any tensor byte is: no allocation is sized from a claim
that has not been checked against the file's real size.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, NamedTuple

from .dtypes import DTYPES, DType, byte_size
from .errors import Finding, SafetensorsError
from .integrity import Readable
from .json_dialect import JSONProblem, decode_fast, parse_strict_json
from .limits import MAX_DIMS, MAX_JSON_DEPTH, MAX_SAFETENSORS_HEADER_BYTES, MAX_SIZE

__all__ = ["SHARDING_INFO_KEY", "Entry", "Header", "read_header"]

#: The ``__metadata__`` key of torch's per-entry offsets (``_hf_utils.CUSTOM_METADATA_KEY``): a
#: distributed save of Hugging Face files writes it, ``convert`` writes it where pieces are
#: global (SPEC 6.3, informative), and ``import`` reads it.
SHARDING_INFO_KEY = "DCP_SHARDING_INFO"

_ENTRY_KEYS = {"dtype", "shape", "data_offsets"}

#: Whether a header is first decoded by msgspec (off: benchmarks of the strict path).
_FAST_PATH = True


class Entry(NamedTuple):
    """One tensor of a data file; ``begin``/``end`` are relative to the data region.

    A named tuple, not a dataclass: a header may hold tens of thousands of entries, and a
    tuple is built several times faster.
    """

    name: str
    dtype: DType
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class Header:
    """The checked header: where the data region starts and every tensor in it."""

    header_bytes: bytes  # the 8-byte length prefix and the JSON header, as on disk
    data_start: int
    entries: dict[str, Entry]
    metadata: dict[str, str]


def _fail(file: str, code: str, message: str, tensor: str | None = None) -> SafetensorsError:
    return SafetensorsError(Finding(code=code, file=file, tensor=tensor, message=message))


def _read_exact(handle: Readable, count: int, file: str) -> bytes:
    """Up to ``count`` bytes (fewer only at the end of the file); a failed read is a finding."""
    chunks = []
    try:
        while count:
            chunk = handle.read(count)
            if not chunk:
                break
            chunks.append(chunk)
            count -= len(chunk)
    except OSError as exc:
        raise _fail(file, "st-header-length", f"the header cannot be read: {exc.strerror or exc}"
                    ) from None
    return b"".join(chunks)


def read_header(handle: Readable, file_size: int, file: str) -> Header:
    """Read and check the header at the start of ``handle``; SafetensorsError if it breaks 6.3."""
    if file_size < 8:
        raise _fail(file, "st-header-length", f"the file has {file_size} bytes, fewer than the "
                    "8-byte header length")
    prefix = _read_exact(handle, 8, file)
    if len(prefix) != 8:  # the size was taken before: the file shrank since
        raise _fail(file, "st-header-length", "the file ended inside its 8-byte header length: "
                    "it changed while it was read")
    (length,) = struct.unpack("<Q", prefix)
    if length > MAX_SAFETENSORS_HEADER_BYTES:
        raise _fail(file, "st-header-length", f"header length {length} is over the limit of "
                    f"{MAX_SAFETENSORS_HEADER_BYTES}")
    if 8 + length > file_size:
        raise _fail(file, "st-header-length", f"header length {length} runs past the end of "
                    f"the {file_size}-byte file")
    text = _read_exact(handle, length, file)
    if len(text) != length:
        raise _fail(file, "st-header-length", "the file ended inside its header")
    body = text.rstrip(b" ")  # SPEC 6.3: only spaces may pad the header
    if not (body.startswith(b"{") and body.endswith(b"}")):
        raise _fail(file, "st-header-json", "the header must be a JSON object from its first "
                    "byte, followed by nothing but space padding")
    data_size = file_size - 8 - length
    checked = _checked_fast(body, data_size, file) if _FAST_PATH else None
    metadata, entries = checked if checked is not None else _checked(
        _strict_json(body, file), data_size, file)
    return Header(
        header_bytes=struct.pack("<Q", length) + text,
        data_start=8 + length,
        entries=entries,
        metadata=metadata,
    )


def _strict_json(body: bytes, file: str) -> Any:
    try:
        return parse_strict_json(body, max_bytes=MAX_SAFETENSORS_HEADER_BYTES,
                                 max_depth=MAX_JSON_DEPTH)
    except JSONProblem as problem:
        code = "st-duplicate-key" if problem.kind == "duplicate-name" else "st-header-json"
        raise _fail(file, code, f"header: {problem.message}") from None


def _checked(raw: Any, data_size: int, file: str) -> tuple[dict[str, str], dict[str, Entry]]:
    """The metadata and entries of a parsed header, every rule of SPEC 6.3-6.5 checked."""
    if not isinstance(raw, dict):
        raise _fail(file, "st-header-json", "the header is not a JSON object")
    metadata = _parse_metadata(raw.pop("__metadata__", {}), file)
    entries = {name: _parse_entry(name, value, file) for name, value in raw.items()}
    _check_offsets(entries, data_size, file)
    return metadata, entries


def _checked_fast(body: bytes, data_size: int,
                  file: str) -> tuple[dict[str, str], dict[str, Entry]] | None:
    """:func:`_checked` of the header decoded by msgspec, or None where the strict parser must
    decide (see :func:`shardspec.format.json_dialect.decode_fast`): a header may hold 100,000
    entries.

    Once every entry has passed, the header's objects are known: the header, each entry's three
    members and the metadata's strings. A name written twice shows as one member fewer than the
    text's count. Any failure is left to the strict path, which reports the first problem in
    its own order (a duplicate name before a bad entry).
    """
    decoded = decode_fast(body, max_bytes=MAX_SAFETENSORS_HEADER_BYTES, max_depth=MAX_JSON_DEPTH)
    if decoded is None:
        return None
    raw, members = decoded
    if not isinstance(raw, dict):
        return None
    count = len(raw)
    try:
        metadata, entries = _checked(raw, data_size, file)
    except SafetensorsError:
        return None
    if count + len(_ENTRY_KEYS) * len(entries) + len(metadata) != members:
        return None
    return metadata, entries


def _parse_metadata(value: Any, file: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise _fail(file, "st-metadata", "__metadata__ must map strings to strings")
    return value


def _is_size(value: Any) -> bool:
    # type() rather than isinstance(): JSON true/false are bools, which are ints to isinstance.
    return type(value) is int and 0 <= value <= MAX_SIZE


def _parse_entry(name: str, value: Any, file: str) -> Entry:
    if type(value) is not dict or value.keys() != _ENTRY_KEYS:
        raise _fail(file, "st-entry", "an entry must have exactly dtype, shape and "
                    "data_offsets", tensor=name)
    dtype_name, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    if type(dtype_name) is not str:  # a string naming no dtype is st-dtype (SPEC 6.3 rule 5)
        raise _fail(file, "st-entry", f"dtype {dtype_name!r} is not a string", tensor=name)
    dtype = DTYPES.get(dtype_name)
    if dtype is None:
        raise _fail(file, "st-dtype", f"unknown dtype {dtype_name!r}", tensor=name)
    if type(shape) is not list or len(shape) > MAX_DIMS or not all(map(_is_size, shape)):
        raise _fail(file, "st-entry", f"shape must be a list of at most {MAX_DIMS} "
                    "non-negative integers", tensor=name)
    if not (type(offsets) is list and len(offsets) == 2 and type(offsets[0]) is int
            and type(offsets[1]) is int and 0 <= offsets[0] <= offsets[1] <= MAX_SIZE):
        raise _fail(file, "st-entry", "data_offsets must be [begin, end] with begin <= end",
                    tensor=name)
    expected = byte_size(dtype, shape)
    if expected is None:
        raise _fail(file, "st-size", f"shape {shape} in {dtype_name} overflows or does not fill "
                    "whole bytes", tensor=name)
    if offsets[1] - offsets[0] != expected:
        raise _fail(file, "st-size", f"data_offsets span {offsets[1] - offsets[0]} bytes but "
                    f"shape {shape} in {dtype_name} needs {expected}", tensor=name)
    return Entry(name, dtype, tuple(shape), offsets[0], offsets[1])


_BY_OFFSETS = attrgetter("begin", "end")


def _check_offsets(entries: dict[str, Entry], data_size: int, file: str) -> None:
    """Entries sorted by offset tile the data region exactly: no overlap, hole or trailing byte."""
    position = 0
    for entry in sorted(entries.values(), key=_BY_OFFSETS):
        if entry.begin != position:
            kind = "overlaps the previous tensor" if entry.begin < position else "leaves a hole"
            raise _fail(file, "st-offsets", f"data starting at {entry.begin} {kind} (expected "
                        f"{position})", tensor=entry.name)
        position = entry.end
    if position != data_size:
        kind = "trailing bytes follow" if position < data_size else "data runs past the file"
        raise _fail(file, "st-offsets", f"tensors end at {position} but the data region has "
                    f"{data_size} bytes: {kind}")
