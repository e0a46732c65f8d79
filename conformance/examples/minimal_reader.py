#!/usr/bin/env python3
"""A minimal shardspec reader, written from SPEC.md alone: the worked example for implementers.

    python minimal_reader.py CHECKPOINT_DIR RANK OUTPUT_FILE

It reads format 1.3: tied tensors (SPEC 8.4) included, and a rank's several pieces of one
tensor, which it returns joined (7.2 rules 3, 6, 7; refused in a manifest older than 1.3, 4.2
rule 4). It loads one rank of a checkpoint the way SPEC section 11.1 says and writes the
tensors that rank loads (aliases as entries of their own) to OUTPUT_FILE as a plain
safetensors file: the conformance adapter protocol (conformance/README.md). On an invalid
checkpoint it prints ``error [code] message (SPEC x.y)`` to stderr, writes nothing and exits 1.
Warnings go to stderr and do not stop it. Checksums are always verified (SPEC 9.2).
``SHARDSPEC_IGNORE_EXTENSIONS`` (comma-separated names) lists must-understand extensions the
user allows ignoring (SPEC 4.4).

Only the Python standard library is used; numpy is imported lazily, by :func:`to_numpy` alone,
for callers that want arrays. Nothing here comes from the reference package: the manifest, the
JSON dialect and the safetensors headers are parsed and checked by hand. The code follows the
SPEC's sections in order, so each rule can be found next to the text that states it. It reads
each data file whole into memory, which keeps it short; a production reader would read the
header first and then the data in large chunks.

As a library::

    tensors, warnings = load_rank("ckpt", 0)    # name -> Tensor(dtype, shape, data)
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
import struct
import sys
from collections.abc import Collection, Iterator
from typing import Any, NamedTuple, NoReturn

__all__ = ["ReadError", "Tensor", "load_rank", "main", "read", "to_numpy", "write_safetensors"]

#: The digests this reader verifies (SPEC 9.2): sha256 is REQUIRED, blake2b OPTIONAL (it
#: declares it: --implements blake2b).
DIGESTS = ("sha256", "blake2b")

# --- 12. Limits ------------------------------------------------------------------------------

MANIFEST_NAME = "shardspec.json"
MAX_MANIFEST_BYTES = 268435456  # 256 MiB since format 1.1 (64 MiB in 1.0)
MAX_JSON_DEPTH = 64
MAX_SAFETENSORS_HEADER_BYTES = 100000000
MAX_DIMS = 64
MAX_NAME_BYTES = 1024
MAX_PATH_BYTES = 1024
MAX_WORLD_SIZE = 65536
MAX_SIZE = 2**63 - 1
#: 4.1: the version this reader implements.
SUPPORTED_MAJOR, SUPPORTED_MINOR = 1, 3

# --- 13. Error codes: the section of each error this reader can report ----------------------

SECTIONS = {
    "not-committed": "2.3", "file-missing": "2.1", "file-duplicate": "2.1",
    "path-unsafe": "2.2", "path-escapes": "2.2", "file-not-regular": "2.2",
    "json-encoding": "3.2", "json-syntax": "3.2", "json-duplicate-name": "3.3",
    "json-nonfinite": "3.3", "json-too-large": "3.4", "json-too-deep": "3.4", "schema": "3.5",
    "version-major": "4.2", "version-newer-minor": "4.2", "unknown-field": "4.3",
    "extension-unsupported": "4.4", "extension-ignored": "4.4", "layout-world-size": "5.1",
    "layout-rank-order": "5.2", "layout-ranks": "5.3", "file-rank": "6.1",
    "st-header-length": "6.3", "st-header-json": "6.3", "st-duplicate-key": "6.3",
    "st-entry": "6.3", "st-metadata": "6.3", "st-size": "6.3", "st-offsets": "6.3",
    "st-dtype": "6.4", "st-mismatch": "7.2", "st-missing-tensor": "7.2",
    "st-extra-tensor": "7.2", "piece-rank": "7.2", "piece-bounds": "7.2",
    "piece-duplicate": "7.2", "shape-overflow": "7.1", "coverage-gap": "7.3",
    "coverage-overlap": "7.3", "replica-mismatch": "7.4", "alias-target": "7.6",
    "tie-target": "8.4", "tie-shape": "8.4", "tie-split": "8.4",
    "file-size": "9.1", "checksum-mismatch": "9.2", "rank-out-of-range": "11.1",
}


class ReadError(Exception):
    """An error finding (1.1): the reader stops and returns no tensor."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"[{code}] {message} (SPEC {SECTIONS[code]})")
        self.code = code


def fail(code: str, message: str) -> NoReturn:
    raise ReadError(code, message)


class Tensor(NamedTuple):
    """What a rank loads for one name: spec dtype, shape in elements, raw bytes (6.3 rule 8)."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes


# --- 6.4 Dtypes: name -> bits per element ----------------------------------------------------

DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "I16": 16, "U16": 16, "I32": 32, "U32": 32, "I64": 64,
    "U64": 64, "F16": 16, "BF16": 16, "F32": 32, "F64": 64, "C64": 64, "F8_E4M3": 8,
    "F8_E5M2": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "F4": 4, "F6_E2M3": 6,
    "F6_E3M2": 6,
}


def element_count(shape: list[int] | tuple[int, ...]) -> int | None:
    """7.1 rule 4: the product of the dimensions, or None where it passes MAX_SIZE (so does
    any product of its dimensions taken in order: [2**62, 4, 0] is an overflow)."""
    count = 1
    for dim in shape:
        count *= dim
        if count > MAX_SIZE:
            return None
    return count


def bits_fit(dtype: str, shape: list[int] | tuple[int, ...]) -> bool:
    """7.1 rule 4: the element count and the bit count of a tensor's shape fit MAX_SIZE."""
    count = element_count(shape)
    return count is not None and count * DTYPE_BITS[dtype] <= MAX_SIZE


def byte_count(dtype: str, shape: list[int] | tuple[int, ...]) -> int | None:
    """6.5 rule 2: count x bits must be a multiple of 8 and at most MAX_SIZE; else None."""
    count = element_count(shape)
    if count is None:
        return None
    bits = count * DTYPE_BITS[dtype]
    if bits > MAX_SIZE or bits % 8:
        return None
    return bits // 8


# --- 3.2-3.4 The JSON dialect (also used for safetensors headers, 6.3 rule 2) ----------------


class JSONProblem(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # encoding, syntax, duplicate, nonfinite, too-deep


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _max_depth(text: str) -> int:
    """3.4 rule 2: the deepest nesting, counted without recursion (strings removed first)."""
    depth = deepest = 0
    for bracket in _BRACKET.findall(_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """3.3 rule 1: no object may have two members with the same name."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise JSONProblem("duplicate", f"the name {key!r} appears twice in one object")
        out[key] = value
    return out


def _constant(token: str) -> NoReturn:
    raise JSONProblem("nonfinite", f"{token} is not allowed")  # 3.3 rule 2


def _float(token: str) -> float:
    value = float(token)
    if math.isinf(value):
        raise JSONProblem("nonfinite", f"{token} is too large for binary64")  # 3.3 rule 2
    return value


def _int(token: str) -> int:
    # Exact integers (3.3 rule 3); one too large for binary64 is a non-finite number (rule 2).
    if len(token) > 300 and math.isinf(float(token)):
        raise JSONProblem("nonfinite", "an integer too large for binary64")
    return int(token)


def _strings(value: Any) -> Iterator[str]:
    """Every name and string in a parsed JSON value (iteratively: depth is already bounded)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            yield from item.keys()
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def parse_json(data: bytes) -> Any:
    """Parse one strict JSON text: UTF-8 without BOM, RFC 8259, I-JSON, depth <= 64."""
    if data.startswith(b"\xef\xbb\xbf"):
        raise JSONProblem("encoding", "a UTF-8 byte order mark")  # 3.2 rule 1
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JSONProblem("encoding", f"not UTF-8: {exc.reason} at byte {exc.start}") from None
    if _max_depth(text) > MAX_JSON_DEPTH:
        raise JSONProblem("too-deep", f"nested deeper than {MAX_JSON_DEPTH}")
    try:  # Python's json: RFC 8259 (strict=True refuses control characters in strings)
        value = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant,
                           parse_float=_float, parse_int=_int)
    except json.JSONDecodeError as exc:
        raise JSONProblem("syntax", str(exc)) from None
    except RecursionError:
        raise JSONProblem("too-deep", "nested too deeply") from None
    if any(_SURROGATE.search(s) for s in _strings(value)):
        raise JSONProblem("encoding", "a string holds a lone surrogate")  # 3.2 rule 1
    return value


# --- 2.2 Paths: opening a listed file safely ------------------------------------------------


def path_rules_1_to_4(path: str) -> str | None:
    """2.2 rules 2-4 (the schema's path pattern); the reason a path breaks them, or None."""
    if not path:
        return "is empty"
    if path.startswith("/"):
        return "is absolute"
    if "\\" in path or "\0" in path:
        return "holds a backslash or NUL"
    if any(segment in ("", ".", "..") for segment in path.split("/")):
        return "has an empty, '.' or '..' segment"
    return None


def open_inside(root: str, relative: str) -> tuple[int, int]:
    """2.2 rules 5-7: resolve ``relative`` inside ``root`` and open it: (fd, size)."""
    resolved = os.path.realpath(os.path.join(root, *relative.split("/")))
    if os.path.commonpath([root, resolved]) != root:
        fail("path-escapes", f"{relative!r} resolves outside the checkpoint, to {resolved}")
    try:
        info = os.stat(resolved)
    except FileNotFoundError:
        fail("file-missing", f"{relative!r} does not exist")
    except OSError as exc:  # ELOOP: a loop of links reaches nothing (rule 6)
        fail("file-missing", f"{relative!r} reaches no file: {exc.strerror}")
    if not stat.S_ISREG(info.st_mode):
        fail("file-not-regular", f"{relative!r} is not a regular file")
    # O_NONBLOCK: a FIFO swapped in after the check cannot block us; O_NOFOLLOW: nor a link.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(resolved, flags)
    except FileNotFoundError:
        fail("file-missing", f"{relative!r} vanished while opened")
    except OSError as exc:
        fail("file-not-regular", f"{relative!r} cannot be opened: {exc.strerror}")
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        fail("file-not-regular", f"{relative!r} is not a regular file")
    return fd, info.st_size


def read_all(fd: int, size: int, relative: str) -> bytes:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 24))
        if not chunk:
            fail("file-size", f"{relative!r} ended early: it changed while read")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# --- 3.5 The schema, checked by hand (3.1, 4.3, 5.1, 6.4, 7.1, 8.1, 9.2) ---------------------


class Schema:
    """The checks of schema/manifest.schema.json that this reader needs, as plain code.

    ``newer`` is true for a manifest of a newer minor version (4.2 rule 3): unknown fields are
    then ignored with a warning instead of being errors (4.3).
    """

    def __init__(self, newer: bool, warnings: list[str]) -> None:
        self.newer = newer
        self.warnings = warnings

    @staticmethod
    def need(ok: bool, where: str, what: str) -> None:
        if not ok:
            fail("schema", f"{where} {what}")

    def members(self, value: Any, where: str, required: set[str], optional: set[str]) -> None:
        """An object with these members (additionalProperties false)."""
        self.need(isinstance(value, dict), where, "must be an object")
        for name in sorted(required - set(value)):
            fail("schema", f"{where} lacks the required member {name!r}")
        for name in value:
            if name not in required and name not in optional:
                self.need(self.newer, where, f"has the unknown member {name!r} (4.3)")
                self.warnings.append(f"[unknown-field] ignored {where}.{name} (SPEC 4.3)")

    def integer(self, value: Any, where: str, low: int, high: int) -> None:
        # 3.3 rule 3: an integer token parses to int (never float); bool is not an integer.
        self.need(type(value) is int and low <= value <= high, where,
                  f"must be an integer in {low}..{high}")

    def string(self, value: Any, where: str, pattern: str | None = None,
               max_length: int | None = None) -> None:
        self.need(isinstance(value, str), where, "must be a string")
        if max_length is not None:
            self.need(len(value) <= max_length, where, f"is over {max_length} characters")
        if pattern is not None:
            self.need(re.fullmatch(pattern, value) is not None, where, f"must match {pattern}")

    def shape(self, value: Any, where: str) -> None:
        self.need(isinstance(value, list) and len(value) <= MAX_DIMS, where,
                  f"must be an array of at most {MAX_DIMS} dimensions")
        for i, dim in enumerate(value):
            self.integer(dim, f"{where}[{i}]", 0, MAX_SIZE)

    def dtype(self, value: Any, where: str) -> None:
        self.need(isinstance(value, str) and value in DTYPE_BITS, where,
                  f"{value!r} is not a dtype of 6.4")

    def path(self, value: Any, where: str) -> None:
        self.string(value, where, max_length=1024)
        problem = path_rules_1_to_4(value)
        self.need(problem is None, where, f"{value!r} {problem} (2.2)")

    def name(self, value: Any, where: str) -> None:
        self.string(value, where, max_length=1024)
        self.need(value not in ("", "__metadata__"), where, "is empty or '__metadata__' (7.1)")
        self.need(len(value.encode()) <= MAX_NAME_BYTES, where,
                  f"is over {MAX_NAME_BYTES} UTF-8 bytes (7.1)")

    def file_record(self, value: Any, where: str) -> None:
        self.members(value, where, {"path", "size", "checksums"}, set())
        self.path(value["path"], where + ".path")
        self.integer(value["size"], where + ".size", 0, MAX_SIZE)
        sums = value["checksums"]
        self.need(isinstance(sums, dict) and "sha256" in sums, where + ".checksums",
                  "must be an object with sha256 (9.2)")
        for algorithm, digest in sums.items():
            self.string(algorithm, f"{where}.checksums key", r"[a-z0-9][a-z0-9_-]{0,31}")
            hexdigits = {"sha256": "{64}", "blake2b": "{128}"}.get(algorithm, "{8,256}")
            self.string(digest, f"{where}.checksums.{algorithm}", "[0-9a-f]" + hexdigits)

    def logical(self, value: Any, where: str) -> None:
        self.members(value, where, {"dtype", "shape"}, set())
        self.dtype(value["dtype"], where + ".dtype")
        self.shape(value["shape"], where + ".shape")

    def tie(self, value: Any, where: str) -> None:
        """8.4 rule 1: {"tensor", "block"?, "axes"?}; axes without block is a schema error."""
        self.members(value, where, {"tensor"}, {"block", "axes"})
        self.name(value["tensor"], where + ".tensor")
        for key, low, high in (("block", 1, MAX_SIZE), ("axes", 0, MAX_DIMS - 1)):
            if key in value:
                items = value[key]
                self.need(isinstance(items, list) and 1 <= len(items) <= MAX_DIMS,
                          f"{where}.{key}", f"must be an array of 1 to {MAX_DIMS} integers")
                for i, item in enumerate(items):
                    self.integer(item, f"{where}.{key}[{i}]", low, high)
        self.need("axes" not in value or "block" in value, where, "has axes without block")

    def tensor(self, record: Any, where: str) -> None:
        """7.1: the kind is decided by the members present (4.3 rule 2)."""
        self.need(isinstance(record, dict), where, "must be an object")
        if "alias_of" in record:
            self.members(record, where, {"alias_of"}, set())
            self.name(record["alias_of"], where + ".alias_of")
            return
        local = "rank_local" in record
        if local:
            self.members(record, where, {"dtype", "rank_local", "pieces"}, {"logical"})
            self.need(record["rank_local"] is True, where + ".rank_local", "must be true")
        else:
            self.members(record, where, {"dtype", "shape", "pieces"}, {"logical", "tied_to"})
            self.shape(record["shape"], where + ".shape")
            if "tied_to" in record:  # format 1.2
                self.tie(record["tied_to"], where + ".tied_to")
        self.dtype(record["dtype"], where + ".dtype")
        if "logical" in record:
            self.logical(record["logical"], where + ".logical")
        pieces = record["pieces"]
        self.need(isinstance(pieces, list) and len(pieces) >= 1, where + ".pieces",
                  "must be a non-empty array")
        for i, piece in enumerate(pieces):
            at = f"{where}.pieces[{i}]"
            if local:
                self.members(piece, at, {"rank", "file", "shape"}, set())
            else:
                self.members(piece, at, {"rank", "file", "offset", "shape"}, {"replica"})
                self.shape(piece["offset"], at + ".offset")
                if "replica" in piece:
                    self.integer(piece["replica"], at + ".replica", 0, 65535)
            self.integer(piece["rank"], at + ".rank", 0, 65535)
            self.path(piece["file"], at + ".file")
            self.shape(piece["shape"], at + ".shape")

    def manifest(self, m: Any) -> None:
        self.members(m, "$", {"format", "format_version", "layout", "ranks", "quantization",
                              "tensors"}, {"generator", "extra_files", "metadata", "extensions"})
        self.need(m["format"] == "shardspec", "$.format", "must be 'shardspec' (3.1)")
        self.string(m["format_version"], "$.format_version", _VERSION)  # 4.1
        if "generator" in m:
            self.string(m["generator"], "$.generator", max_length=256)
        layout = m["layout"]
        self.members(layout, "$.layout", {"tp_size", "pp_size", "ep_size", "world_size",
                                          "rank_order"}, set())
        for key in ("tp_size", "pp_size", "ep_size", "world_size"):
            self.integer(layout[key], f"$.layout.{key}", 1, MAX_WORLD_SIZE)
        self.need(isinstance(layout["rank_order"], str) and layout["rank_order"] in RANK_ORDERS,
                  "$.layout.rank_order",
                  "is not a rank order of 5.2")
        ranks = m["ranks"]
        self.need(isinstance(ranks, list) and len(ranks) >= 1, "$.ranks",
                  "must be a non-empty array")
        for i, rank in enumerate(ranks):
            at = f"$.ranks[{i}]"
            self.members(rank, at, {"rank", "tp_rank", "pp_rank", "ep_rank", "files"}, set())
            for key in ("rank", "tp_rank", "pp_rank", "ep_rank"):
                self.integer(rank[key], f"{at}.{key}", 0, 65535)
            self.need(isinstance(rank["files"], list), at + ".files", "must be an array")
            for j, record in enumerate(rank["files"]):
                self.file_record(record, f"{at}.files[{j}]")
        quantization = m["quantization"]
        self.members(quantization, "$.quantization", {"method"}, {"config"})
        self.string(quantization["method"], "$.quantization.method", r"[a-z0-9][a-z0-9_.-]{0,63}")
        if "config" in quantization:
            self.need(isinstance(quantization["config"], dict), "$.quantization.config",
                      "must be an object")
        self.need(isinstance(m["tensors"], dict), "$.tensors", "must be an object")
        for name, record in m["tensors"].items():
            self.name(name, f"$.tensors name {name!r}")
            self.tensor(record, f"$.tensors[{name!r}]")
        extra = m.get("extra_files", [])
        self.need(isinstance(extra, list), "$.extra_files", "must be an array")
        for j, record in enumerate(extra):
            self.file_record(record, f"$.extra_files[{j}]")
        metadata = m.get("metadata", {})
        self.need(isinstance(metadata, dict) and all(isinstance(v, str)
                                                     for v in metadata.values()),
                  "$.metadata", "must map strings to strings")
        extensions = m.get("extensions", {})
        self.need(isinstance(extensions, dict), "$.extensions", "must be an object")
        for name, record in extensions.items():
            self.string(name, "$.extensions name", r"[a-z0-9][a-z0-9_.-]{0,127}")
            self.need(isinstance(record, dict)
                      and isinstance(record.get("must_understand"), bool),
                      f"$.extensions[{name!r}]", "must be an object with boolean must_understand")


# --- 4. Versioning ---------------------------------------------------------------------------

_VERSION = r"(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})"


def check_version(m: Any, warnings: list[str]) -> bool:
    """4.2: True for a newer minor version. A missing or malformed version is left to the
    schema check (rule 1); another major version is refused before anything else (rule 2)."""
    version = m.get("format_version") if isinstance(m, dict) else None
    match = re.fullmatch(_VERSION, version) if isinstance(version, str) else None
    if match is None:
        return False
    major, minor = int(match[1]), int(match[2])
    if major != SUPPORTED_MAJOR:
        fail("version-major", f"format version {version}; this reader reads {SUPPORTED_MAJOR}.x")
    if minor > SUPPORTED_MINOR:
        warnings.append(f"[version-newer-minor] format version {version}: unknown fields are "
                        "ignored (SPEC 4.2)")
        return True
    return False


def manifest_minor(m: dict[str, Any]) -> int:
    """4.2 rule 4: a manifest is read by the rules of its own version, so what a later minor
    version first allows is refused in an earlier one (the schema has checked the pattern)."""
    return int(m["format_version"].split(".")[1])


def check_extensions(m: dict[str, Any], ignore: Collection[str], warnings: list[str]) -> None:
    """4.4: this reader understands no extension."""
    for name, record in m.get("extensions", {}).items():
        if record["must_understand"] and name not in ignore:
            fail("extension-unsupported", f"extension {name!r} must be understood")
        warnings.append(f"[extension-ignored] extension {name!r} was ignored (SPEC 4.4)")


# --- 5. Parallel layout ----------------------------------------------------------------------

RANK_ORDERS = ("pp-ep-tp", "pp-tp-ep", "ep-pp-tp", "ep-tp-pp", "tp-pp-ep", "tp-ep-pp")


def coordinates(layout: dict[str, int], rank: int) -> dict[str, int]:
    """5.2 rule 2: for rank_order A-B-C, c = rank mod S_C, b = (rank div S_C) mod S_B, ..."""
    coords = {}
    for axis in reversed(layout["rank_order"].split("-")):
        size = layout[f"{axis}_size"]
        coords[f"{axis}_rank"] = rank % size
        rank //= size
    return coords


def check_layout(m: dict[str, Any]) -> None:
    layout, ranks = m["layout"], m["ranks"]
    product = layout["tp_size"] * layout["pp_size"] * layout["ep_size"]
    if layout["world_size"] != product or len(ranks) != product:  # 5.1 rule 2
        fail("layout-world-size", f"world_size {layout['world_size']}, sizes multiply to "
             f"{product}, {len(ranks)} rank records")
    for i, record in enumerate(ranks):  # 5.3 rule 1
        if record["rank"] != i:
            fail("layout-ranks", f"ranks[{i}] is rank {record['rank']}")
    for i, record in enumerate(ranks):  # 5.2 rule 4
        expected = coordinates(layout, i)
        if any(record[key] != value for key, value in expected.items()):
            fail("layout-rank-order", f"rank {i} should have coordinates {expected}")


# --- 2.1, 2.2, 6.1 Paths and files -----------------------------------------------------------


def check_paths(m: dict[str, Any]) -> None:
    seen: set[str] = set()
    records = [f for rank in m["ranks"] for f in rank["files"]] + m.get("extra_files", [])
    for record in records:
        path = record["path"]
        if path in seen:
            fail("file-duplicate", f"{path!r} is listed twice")  # 2.1 rule 3
        seen.add(path)
        if path == MANIFEST_NAME:
            fail("path-unsafe", f"a listed path is {MANIFEST_NAME}")  # 2.1 rule 3
        if len(path.encode()) > MAX_PATH_BYTES:
            fail("path-unsafe", f"a path is over {MAX_PATH_BYTES} UTF-8 bytes")  # 2.2 rule 1
    for path in seen:  # 2.1 rule 6: no listed path under another, nor under the manifest
        segments = path.split("/")
        for end in range(1, len(segments)):
            folder = "/".join(segments[:end])
            if folder in seen or folder == MANIFEST_NAME:
                fail("path-unsafe", f"{path!r} lies under {folder!r}, a listed file")
    for record in m["tensors"].values():
        for piece in record.get("pieces", []):
            if len(piece["file"].encode()) > MAX_PATH_BYTES:
                fail("path-unsafe", f"a path is over {MAX_PATH_BYTES} UTF-8 bytes")


# --- 7. Tensors ------------------------------------------------------------------------------


def overlap(a: tuple[list[int], list[int]], b: tuple[list[int], list[int]]) -> bool:
    """7.3 rule 2: boxes overlap iff they overlap in every dimension (scalars always do)."""
    return all(max(o1, o2) < min(o1 + s1, o2 + s2)
               for o1, s1, o2, s2 in zip(a[0], a[1], b[0], b[1], strict=True))


def check_coverage(name: str, shape: list[int], pieces: list[dict[str, Any]]) -> None:
    """7.3: replica-0 pieces cover every element exactly once (none needed when E = 0)."""
    total = element_count(shape)
    if not total:
        return
    primary = [(p["offset"], p["shape"]) for p in pieces if p.get("replica", 0) == 0]
    # A sweep along dimension 0 (scalars: one dimension-less group) avoids most pair tests.
    primary.sort(key=lambda box: box[0][:1])
    for i, box in enumerate(primary):
        for other in primary[i + 1:]:
            if shape and other[0][0] >= box[0][0] + box[1][0]:
                break
            if overlap(box, other):
                fail("coverage-overlap", f"tensor {name!r}: pieces at {box[0]} and {other[0]} "
                     "overlap")
    covered = sum(element_count(s) or 0 for _, s in primary)
    if covered != total:
        fail("coverage-gap", f"tensor {name!r}: pieces cover {covered} of {total} elements")


def join_dimension(pieces: list[dict[str, Any]], dtype: str) -> int | None:
    """7.2 rule 7: the dimension d along which k >= 2 pieces of one rank are joinable, else
    None: offsets and sizes equal in every other dimension, offsets pairwise distinct along d
    (a piece of size 0 along d too) and, in increasing order, each piece ending no later than
    the next begins; for a dtype of fewer than 8 bits, each piece's run (its elements from
    dimension d on) a whole number of bytes. These are conditions of offsets and shapes alone:
    they hold pieces with no elements too, so an empty piece inside another's run, or empty
    pieces whose sub-byte runs end inside a byte, do not join. A scalar never joins."""
    first, n = pieces[0], len(pieces[0]["offset"])
    differ = [d for d in range(n) if any(p["offset"][d] != first["offset"][d] for p in pieces)]
    if len(differ) != 1:
        return None
    d = differ[0]
    if any(p["shape"][e] != first["shape"][e] for p in pieces for e in range(n) if e != d):
        return None
    runs = sorted((p["offset"][d], p["shape"][d]) for p in pieces)
    if any(o1 == o2 or o1 + s1 > o2 for (o1, s1), (o2, _) in zip(runs, runs[1:], strict=False)):
        return None
    if any(math.prod(p["shape"][d:]) * DTYPE_BITS[dtype] % 8 for p in pieces):
        return None  # a sub-byte run that ends inside a byte
    return d


def check_several(name: str, record: dict[str, Any], held: list[dict[str, Any]],
                  bases: set[str], minor: int) -> None:
    """7.2 rule 3: several pieces of one tensor on one rank, only in a manifest of format 1.3
    or later (4.2 rule 4), in different files, joinable; never for a rank-local tensor, a tied
    tensor or the base of one (8.4 rule 1). Files are told apart by their listed paths, as
    strings: a path that links to another listed one is another file (2.1 rule 3)."""
    rank = held[0]["rank"]
    if minor < 3:
        fail("piece-duplicate", f"tensor {name!r}: rank {rank} holds {len(held)} pieces, which "
             f"format 1.{minor} does not allow (1.3 first does; 4.2 rule 4)")
    if "rank_local" in record or "tied_to" in record or name in bases:
        fail("piece-duplicate", f"tensor {name!r}: rank {rank} holds {len(held)} pieces of a "
             "tensor that has one per rank (rank-local, tied, or the base of a tie)")
    if len({p["file"] for p in held}) != len(held):
        fail("piece-duplicate", f"tensor {name!r}: rank {rank} holds two pieces in one file")
    if join_dimension(held, record["dtype"]) is None:
        fail("piece-duplicate", f"tensor {name!r}: rank {rank}'s {len(held)} pieces cannot "
             "be joined along one dimension (7.2 rule 7)")


def check_tensors(m: dict[str, Any]) -> None:
    world = m["layout"]["world_size"]
    owned = [{f["path"] for f in rank["files"]} for rank in m["ranks"]]
    tensors, minor = m["tensors"], manifest_minor(m)
    bases = {r["tied_to"]["tensor"] for r in tensors.values()  # 8.4 rule 1
             if "tied_to" in r and "alias_of" not in r and "rank_local" not in r}
    for name, record in tensors.items():
        if "alias_of" in record:  # 7.6 rule 1
            target = tensors.get(record["alias_of"])
            if target is None or "alias_of" in target:
                fail("alias-target", f"alias {name!r} names {record['alias_of']!r}, which is "
                     "not a tensor with data")
            continue
        dtype, shape = record["dtype"], record.get("shape")
        local = "rank_local" in record
        if not local and not bits_fit(dtype, shape):  # 7.1 rule 4
            fail("shape-overflow", f"tensor {name!r}: shape {shape} has too many elements "
                 "or bits")
        logical = record.get("logical")
        if logical is not None and not bits_fit(logical["dtype"], logical["shape"]):
            fail("shape-overflow", f"tensor {name!r}: logical shape has too many elements "
                 "or bits")
        holders: dict[int, list[dict[str, Any]]] = {}
        for piece in record["pieces"]:  # 7.2
            rank = piece["rank"]
            if rank >= world:
                fail("piece-rank", f"tensor {name!r}: a piece on rank {rank} of {world}")
            if piece["file"] not in owned[rank]:  # 6.1 rule 2
                fail("file-rank", f"tensor {name!r}: rank {rank}'s piece is in "
                     f"{piece['file']!r}, which rank {rank} does not own")
            holders.setdefault(rank, []).append(piece)
            if not local:
                offset, size = piece["offset"], piece["shape"]
                if not (len(offset) == len(size) == len(shape) and all(
                        o + s <= g for o, s, g in zip(offset, size, shape, strict=True))):
                    fail("piece-bounds", f"tensor {name!r}: rank {rank}'s piece at {offset} of "
                         f"shape {size} is not inside {shape}")
            if byte_count(dtype, piece["shape"]) is None:  # 7.1 rule 4, 6.5 rule 2
                fail("st-size", f"tensor {name!r}: a {dtype} piece of shape {piece['shape']} "
                     "is not a whole number of bytes")
        for held in holders.values():  # 7.2 rule 3, once every piece is inside its tensor
            if len(held) > 1:
                check_several(name, record, held, bases, minor)
        if local:
            continue
        check_coverage(name, shape, record["pieces"])
        primaries = [(p["offset"], p["shape"]) for p in record["pieces"]
                     if p.get("replica", 0) == 0]
        for piece in record["pieces"]:  # 7.4 rule 1
            if piece.get("replica", 0) and (piece["offset"], piece["shape"]) not in primaries:
                fail("replica-mismatch", f"tensor {name!r}: rank {piece['rank']}'s replica "
                     "copies no replica-0 piece")


# --- 8.4 Tied tensors ------------------------------------------------------------------------


def tie_grid(name: str, base_name: str, base: dict[str, Any]) -> tuple[list[int], list[int]]:
    """8.4 rule 2: the base's grid L and how many grid elements it packs into one stored
    element along each grid dimension."""
    stored = base["shape"]
    grid = base["logical"]["shape"] if "logical" in base else stored
    if len(stored) < len(grid):
        fail("tie-shape", f"tensor {name!r}: its base {base_name!r} has shape {stored}, fewer "
             f"dimensions than its grid {grid}")
    packs = []
    for d, (size, extent) in enumerate(zip(stored, grid, strict=False)):
        if size == extent == 0:
            packs.append(1)
        elif size == 0 or extent == 0 or extent % size:
            fail("tie-shape", f"tensor {name!r}: dimension {d} of its base {base_name!r} "
                 f"({size}) does not divide its grid's ({extent})")
        else:
            packs.append(extent // size)
    return grid, packs


def check_ties(m: dict[str, Any]) -> None:
    tensors = m["tensors"]
    for name, record in tensors.items():
        tie = record.get("tied_to")
        if tie is None or "alias_of" in record or "rank_local" in record:
            continue  # only a global tensor has a tie (an unknown field elsewhere, 4.3)
        base_name = tie["tensor"]
        base = tensors.get(base_name)  # rule 1
        if base_name == name or base is None or "alias_of" in base or "rank_local" in base \
                or "tied_to" in base:
            fail("tie-target", f"tensor {name!r} is tied to {base_name!r}, which is not another "
                 "global tensor without a tie")
        grid, packs = tie_grid(name, base_name, base)  # rule 2
        shape, block = record["shape"], tie.get("block")
        axes = tie.get("axes", list(range(len(block or ()))))
        if block is None:  # rule 3
            if element_count(shape) != 1:
                fail("tie-shape", f"tensor {name!r} is tied without block, so it is one value, "
                     f"but its shape is {shape}")
        elif len(axes) != len(block) or len(set(axes)) != len(axes) \
                or any(a >= len(grid) for a in axes):
            fail("tie-shape", f"tensor {name!r}: axes {axes} are not {len(block)} distinct "
                 f"dimensions of the grid {grid}")
        elif len(shape) < len(block) or any(shape[j] != -(-grid[a] // block[j])
                                            for j, a in enumerate(axes)):
            fail("tie-shape", f"tensor {name!r}: shape {shape} is not ceil(grid / block) for "
                 f"the grid {grid}, block {block} on axes {axes}")
        mine = {p["rank"]: p for p in record["pieces"]}  # rule 4
        theirs = {p["rank"]: p for p in base["pieces"]}
        if set(mine) != set(theirs):
            fail("tie-split", f"tensor {name!r} is held by ranks {sorted(mine)}, its base "
                 f"{base_name!r} by ranks {sorted(theirs)}")
        for rank, piece in sorted(theirs.items()):
            offset, size = piece["offset"], piece["shape"]
            if any(offset[d] or size[d] != base["shape"][d]
                   for d in range(len(grid), len(offset))):
                fail("tie-split", f"tensor {name!r}: rank {rank}'s piece of {base_name!r} "
                     "splits an inner dimension")
            want_offset, want_shape = [0] * len(shape), list(shape)  # inner dims: whole
            for j, (a, b) in enumerate(zip(axes, block or (), strict=True)):
                lo, hi = offset[a] * packs[a], (offset[a] + size[a]) * packs[a]
                if lo % b or (hi % b and hi != grid[a]):
                    fail("tie-split", f"tensor {name!r}: rank {rank}'s piece of {base_name!r} "
                         f"spans grid elements {lo}..{hi} of dimension {a}, which cut a block "
                         f"of {b}")
                want_offset[j], want_shape[j] = lo // b, -(-hi // b) - lo // b
            held = mine[rank]
            if (held["offset"], held["shape"]) != (want_offset, want_shape):
                fail("tie-split", f"tensor {name!r}: rank {rank} holds offset "
                     f"{held['offset']}, shape {held['shape']}; its piece of {base_name!r} "
                     f"needs offset {want_offset}, shape {want_shape}")


# --- 6.3 The safetensors container -----------------------------------------------------------


def read_header(blob: bytes, path: str) -> tuple[int, dict[str, tuple[str, list[int], int, int]]]:
    """6.3 rules 1-7 for one file: the data region's start and name -> (dtype, shape, begin,
    end), offsets relative to the data region."""
    if len(blob) < 8:
        fail("st-header-length", f"{path!r} has fewer than 8 bytes")
    (length,) = struct.unpack("<Q", blob[:8])
    if length > MAX_SAFETENSORS_HEADER_BYTES or 8 + length > len(blob):
        fail("st-header-length", f"{path!r}: header length {length} is over the limit or "
             "the file")
    header = blob[8 : 8 + length]
    body = header.rstrip(b" ")  # rule 2: only spaces may follow the object
    if not (header.startswith(b"{") and body.endswith(b"}")):
        fail("st-header-json", f"{path!r}: the header is not one JSON object padded by spaces")
    try:
        entries = parse_json(body)
    except JSONProblem as problem:
        code = "st-duplicate-key" if problem.kind == "duplicate" else "st-header-json"
        fail(code, f"{path!r}: header: {problem}")
    metadata = entries.pop("__metadata__", {})  # rule 4
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        fail("st-metadata", f"{path!r}: __metadata__ must map strings to strings")
    out = {}
    for name, entry in entries.items():  # rule 5
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            fail("st-entry", f"{path!r}: entry {name!r} must have exactly dtype, shape and "
                 "data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str):
            fail("st-entry", f"{path!r}: entry {name!r} has a dtype that is not a string")
        if dtype not in DTYPE_BITS:
            fail("st-dtype", f"{path!r}: entry {name!r} has the unknown dtype {dtype!r}")
        if not (isinstance(shape, list) and len(shape) <= MAX_DIMS
                and all(type(d) is int and 0 <= d <= MAX_SIZE for d in shape)):
            fail("st-entry", f"{path!r}: entry {name!r} has a malformed shape")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(type(o) is int and 0 <= o <= MAX_SIZE for o in offsets)
                and offsets[0] <= offsets[1]):
            fail("st-entry", f"{path!r}: entry {name!r} has malformed data_offsets")
        nbytes = byte_count(dtype, shape)  # rule 6
        if nbytes is None or offsets[1] - offsets[0] != nbytes:
            fail("st-size", f"{path!r}: entry {name!r} spans {offsets[1] - offsets[0]} bytes, "
                 f"not what {dtype} {shape} takes")
        out[name] = (dtype, shape, offsets[0], offsets[1])
    position = 0  # rule 7: sorted by (begin, end), the entries tile the data region
    for _, _, begin, end in sorted(out.values(), key=lambda e: (e[2], e[3])):
        if begin != position:
            fail("st-offsets", f"{path!r}: data at {begin}, expected {position}")
        position = end
    if position != len(blob) - 8 - length:
        fail("st-offsets", f"{path!r}: tensors end at {position}, the data region has "
             f"{len(blob) - 8 - length} bytes")
    return 8 + length, out


# --- 7.2 rule 7 Joining ------------------------------------------------------------------------


def join(pieces: list[tuple[list[int], Tensor]]) -> Tensor:
    """A rank's value of a tensor: its one piece, or the join of its several pieces (checked
    joinable by check_several): one after the other along the one dimension d where their
    offsets differ, in increasing offset. In row-major order that is, for each index of the
    dimensions before d, each piece's run (its block of rows) in turn. Every run is whole
    bytes, for sub-byte dtypes too (7.2 rule 7), so the join lays bytes one after the other.
    The order is the offsets' alone, not the manifest's nor the files' part order."""
    if len(pieces) == 1:
        return pieces[0][1]
    pieces = sorted(pieces, key=lambda p: p[0])  # offsets differ only along d
    first = pieces[0][0]
    d = next(e for e in range(len(first)) if pieces[-1][0][e] != first[e])
    dtype, shape = pieces[0][1].dtype, list(pieces[0][1].shape)
    shape[d] = sum(tensor.shape[d] for _, tensor in pieces)
    outer = element_count(shape[:d]) or 0
    if not outer:  # no element at all
        return Tensor(dtype, tuple(shape), b"")
    runs = [[t.data[i * len(t.data) // outer:(i + 1) * len(t.data) // outer]
             for i in range(outer)] for _, t in pieces]
    return Tensor(dtype, tuple(shape), b"".join(b for row in zip(*runs, strict=True)
                                                for b in row))


# --- 11.1 The reader procedure ---------------------------------------------------------------


def read_manifest(root: str, ignore: Collection[str], warnings: list[str]) -> dict[str, Any]:
    """Steps 1-7: everything that does not depend on the rank."""
    if not os.path.lexists(os.path.join(root, MANIFEST_NAME)):  # 1. commit (2.3)
        fail("not-committed", f"{root} has no {MANIFEST_NAME}")
    fd, size = open_inside(root, MANIFEST_NAME)
    try:
        if size > MAX_MANIFEST_BYTES:  # 2. size, before parsing (3.4 rule 1)
            fail("json-too-large", f"{MANIFEST_NAME} has {size} bytes")
        data = read_all(fd, size, MANIFEST_NAME)
    finally:
        os.close(fd)
    try:  # 3. parse (3.2-3.4)
        m = parse_json(data)
    except JSONProblem as problem:
        code = {"duplicate": "json-duplicate-name"}.get(problem.kind, f"json-{problem.kind}")
        fail(code, f"{MANIFEST_NAME}: {problem}")
    newer = check_version(m, warnings)  # 4. version (4.2)
    if not isinstance(m, dict):
        fail("schema", f"{MANIFEST_NAME} is not a JSON object (3.2 rule 3)")
    Schema(newer, warnings).manifest(m)  # 5. schema (3.5)
    check_extensions(m, ignore, warnings)  # 6. extensions (4.4)
    check_paths(m)  # 7. semantics
    check_layout(m)
    check_tensors(m)
    check_ties(m)
    return m


def load_rank(
    directory: str | os.PathLike[str], rank: int, *, ignore_extensions: Collection[str] = (),
) -> tuple[dict[str, Tensor], list[str]]:
    """Load ``rank``'s tensors (11.1), verifying every checksum; raise ReadError if invalid."""
    warnings: list[str] = []
    root = os.path.realpath(directory)
    m = read_manifest(root, ignore_extensions, warnings)
    if not 0 <= rank < m["layout"]["world_size"]:  # 8. request
        fail("rank-out-of-range", f"rank {rank} is not in 0..{m['layout']['world_size'] - 1}")
    wanted: dict[str, dict[str, tuple[str, list[int]]]] = {}  # file -> name -> dtype, shape
    offsets: dict[tuple[str, str], list[int]] = {}  # (file, name) -> the piece's offset
    for name, record in m["tensors"].items():
        for piece in record.get("pieces", []):
            if piece["rank"] == rank:
                wanted.setdefault(piece["file"], {})[name] = (record["dtype"], piece["shape"])
                offsets[piece["file"], name] = piece.get("offset", [])
    held: dict[str, list[tuple[list[int], Tensor]]] = {}  # name -> (offset, piece's array)
    for record in m["ranks"][rank]["files"]:  # 9. files, in part order
        path = record["path"]
        fd, size = open_inside(root, path)  # (a)
        try:
            if size != record["size"]:  # (b) 9.1
                fail("file-size", f"{path!r} has {size} bytes, the manifest says "
                     f"{record['size']}")
            blob = read_all(fd, size, path)
        finally:
            os.close(fd)
        start, entries = read_header(blob, path)  # (c)
        pieces = wanted.get(path, {})
        for name, (dtype, shape) in pieces.items():  # (d) 7.2 rule 5
            if name not in entries:
                fail("st-missing-tensor", f"{path!r} lacks {name!r}")
            if entries[name][:2] != (dtype, shape):
                fail("st-mismatch", f"{path!r}: {name!r} is {entries[name][:2]}, the manifest "
                     f"says {dtype} {shape}")
        for name in entries:
            if name not in pieces:
                fail("st-extra-tensor", f"{path!r} holds {name!r}, which the manifest does "
                     "not place there")
        for algorithm, expected in record["checksums"].items():  # (f) 9.2, before any return
            if algorithm in DIGESTS and \
                    hashlib.new(algorithm, blob).hexdigest() != expected:
                fail("checksum-mismatch", f"{path!r}: {algorithm} differs from the manifest")
        for name, (dtype, shape, begin, end) in entries.items():  # (e) each piece's array
            array = Tensor(dtype, tuple(shape), blob[start + begin : start + end])
            held.setdefault(name, []).append((offsets[path, name], array))
    tensors = {name: join(pieces) for name, pieces in held.items()}  # 10. joins (7.2 rule 6)
    for name, record in m["tensors"].items():  # 11. aliases (7.6 rule 3): the same object
        if "alias_of" in record and record["alias_of"] in tensors:
            tensors[name] = tensors[record["alias_of"]]
    return tensors, warnings


# --- Output: a plain safetensors file (6.3), and numpy arrays for callers ---------------------


def write_safetensors(path: str, tensors: dict[str, Tensor]) -> None:
    """Entries sorted by name, data back to back, header padded with spaces to 8 bytes."""
    header, offset = {}, 0
    for name in sorted(tensors):
        tensor = tensors[name]
        header[name] = {"dtype": tensor.dtype, "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(tensor.data)]}
        offset += len(tensor.data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    temp = f"{path}.partial"
    with open(temp, "wb") as handle:
        handle.write(struct.pack("<Q", len(text)) + text)
        for name in sorted(tensors):
            handle.write(tensors[name].data)
    os.replace(temp, path)  # never a half-written output


_NUMPY = {"BOOL": "bool", "U8": "<u1", "I8": "<i1", "I16": "<i2", "U16": "<u2", "I32": "<i4",
          "U32": "<u4", "I64": "<i8", "U64": "<u8", "F16": "<f2", "F32": "<f4", "F64": "<f8",
          "C64": "<c8"}


def to_numpy(tensor: Tensor) -> Any:
    """The tensor as a numpy array; dtypes numpy lacks (BF16, F8, F4, F6) come back as their
    packed bytes (uint8), as SPEC 6.5 stores them."""
    import numpy as np

    if tensor.dtype in _NUMPY:
        return np.frombuffer(tensor.data, dtype=_NUMPY[tensor.dtype]).reshape(tensor.shape)
    return np.frombuffer(tensor.data, dtype=np.uint8)


# --- The adapter protocol --------------------------------------------------------------------


def ignored_extensions() -> list[str]:
    return [n for item in os.environ.get("SHARDSPEC_IGNORE_EXTENSIONS", "").split(",")
            if (n := item.strip(" \t"))]


def read(directory: str, rank: int, output: str, ignore_extensions: Collection[str] = ()) -> None:
    """Load ``rank`` and write its tensors to ``output``; ReadError (no output) if invalid."""
    tensors, warnings = load_rank(directory, rank, ignore_extensions=ignore_extensions)
    for warning in warnings:
        print(f"warning {warning}", file=sys.stderr)
    write_safetensors(output, tensors)


def main(argv: list[str]) -> int:
    if len(argv) != 3 or not re.fullmatch(r"[0-9]{1,9}", argv[1]):
        print("usage: minimal_reader.py CHECKPOINT_DIR RANK OUTPUT_FILE", file=sys.stderr)
        return 2
    try:
        read(argv[0], int(argv[1]), argv[2], ignored_extensions())
    except ReadError as exc:
        print(f"error {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
