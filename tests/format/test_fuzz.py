"""Fuzzing: mutated checkpoints never crash, hang or escape validate, the reader or the CLI.

Every example copies a small valid TP=2 checkpoint (bf16 and other dtypes, a replicated norm, a
rank-local tensor, an alias, a scalar, a zero-size tensor, an extra file) into a fresh temporary
directory, then mutates it: bytes of the manifest or of a data file (bit flips, overwrites,
truncation, insertions, deletions, spliced-in nasty tokens, the safetensors length prefix), or
parsed fields of the manifest or of a safetensors header (replaced, deleted, added, duplicated,
swapped, renamed, re-typed values, re-encoded with a right or wrong length prefix). Each
property then checks that:

* ``shardspec.validate(path, checksums=True)`` returns a Report (it never raises) whose
  ``to_dict()`` is JSON;
* ``shardspec.open(path)`` and ``load_rank(r, "cpu", verify=True)`` for every rank return or
  raise a :class:`shardspec.ShardspecError`, nothing else;
* validate and the reader agree: a valid report means every rank loads, and every error the
  reader raises is one the validator reports too;
* nothing outside the checkpoint directory is opened (``os.open``/``open`` are recorded).

The run in ``make test`` is derandomized, so CI is reproducible, and small:
``SHARDSPEC_FUZZ_EXAMPLES`` examples per property (default 60, the CLI property a quarter of
that). Setting the variable also randomizes the run, for a long bug hunt::

    SHARDSPEC_FUZZ_EXAMPLES=5000 pytest tests/format/test_fuzz.py

Settings are explicit on each test, so the ``SHARDSPEC_HYPOTHESIS_PROFILE`` of conftest.py does
not change them.
"""

from __future__ import annotations

import builtins
import copy
import hashlib
import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import shardspec
from checkpoints import make_tiny
from shardspec.cli import app
from shardspec.format.dtypes import DTYPES, element_count
from shardspec.format.limits import SUPPORTED_MINOR
from shardspec.validate import _HASH_WORKERS

REPO = Path(__file__).resolve().parents[2]
MANIFEST = "shardspec.json"

_LONG_RUN = "SHARDSPEC_FUZZ_EXAMPLES" in os.environ
EXAMPLES = max(1, int(os.environ.get("SHARDSPEC_FUZZ_EXAMPLES", "60")))
CLI_EXAMPLES = max(2, EXAMPLES // 4)
#: A hang guard: generous for the bounded run, scaled for a long one.
TIMEOUT_S = max(300, 2 * EXAMPLES)
#: Ranks loaded per example (a mutated layout could claim many).
MAX_RANKS = 8


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        derandomize=not _LONG_RUN,
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
            HealthCheck.large_base_example,
        ],
    )


Draw = Callable[..., Any]
Files = dict[str, bytes]  # relative path -> contents, the manifest included


# --- the base checkpoint -----------------------------------------------------------------------


class Base:
    """The base checkpoint on disk and its files' bytes (a plain class: Hypothesis prints the
    repr of every argument of a failing example, and a dataclass's would print every byte)."""

    def __init__(self, path: Path, files: Files, data_files: tuple[str, ...]) -> None:
        self.path = path
        self.files = files  # the listed files and the manifest
        self.data_files = data_files

    def __repr__(self) -> str:
        return f"Base({str(self.path)!r})"


#: Unlisted things placed in every copy, so that a mutated path can point at them.
DECOYS = ("escape.safetensors", "inside-link.safetensors", "dangling", "fifo", "subdir",
          "subdir/inner.safetensors")


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    parent = tmp_path_factory.mktemp("fuzz-base")
    config = parent / "config.json"
    config.write_text('{"hidden_size": 4}\n', encoding="utf-8")
    tiny = make_tiny(parent / "ckpt", extra_files={"config.json": config})
    return with_decoys(tiny.path, tiny.manifest)


@pytest.fixture(scope="module")
def joined_base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    """Format 1.3 (issue 49): each of two ranks holds two pieces of a fused weight, in F32 and
    in F4, joined along dimension 0 (SPEC 7.2 rule 7), each piece in a file of its own."""
    fused = torch.arange(64, dtype=torch.float32).reshape(16, 4)
    packed = torch.arange(64, dtype=torch.uint8).reshape(16, 4).view(torch.float4_e2m1fn_x2)
    states: dict[int, dict[str, torch.Tensor]] = {}
    sharding: dict[int, dict[str, Any]] = {}
    for rank in range(2):
        starts = (4 * rank, 8 + 4 * rank)
        states[rank] = {"fused": torch.cat([fused[s:s + 4] for s in starts]),
                        "packed": torch.cat([packed[s:s + 4] for s in starts])}
        sharding[rank] = {
            "fused": [shardspec.Shard((16, 4), (s, 0), shape=(4, 4)) for s in starts],
            "packed": [shardspec.Shard((16, 8), (s, 0), shape=(4, 8)) for s in starts]}
    parent = tmp_path_factory.mktemp("fuzz-joined")
    config = parent / "config.json"
    config.write_text('{"hidden_size": 4}\n', encoding="utf-8")
    manifest = shardspec.save(states, parent / "ckpt", layout=shardspec.Layout(tp_size=2),
                              sharding=sharding, extra_files={"config.json": config})
    return with_decoys(parent / "ckpt", manifest)


def with_decoys(root: Path, manifest: shardspec.Manifest) -> Base:
    """The base at ``root``, with the :data:`DECOYS` beside its files."""
    data_files = tuple(f.path for r in manifest.ranks for f in r.files)
    (root / "subdir").mkdir()
    shutil.copyfile(root / data_files[0], root / "subdir" / "inner.safetensors")
    os.symlink("../outside.safetensors", root / "escape.safetensors")
    os.symlink(data_files[0], root / "inside-link.safetensors")
    os.symlink("nowhere", root / "dangling")
    files = {name: (root / name).read_bytes() for name in (MANIFEST, "config.json", *data_files)}
    # Warm every cache (the schema file, lazy imports) before opens are recorded, and make sure
    # the base itself is sound.
    assert shardspec.validate(root, checksums=True).ok
    for rank in range(manifest.world_size):
        shardspec.load_rank(root, rank, "cpu", verify=True)
    return Base(root, files, data_files)


@contextmanager
def checkpoint_copy(base: Base) -> Iterator[Path]:
    """A fresh copy of the base (function fixtures would be shared by Hypothesis' examples)."""
    with tempfile.TemporaryDirectory(prefix="shardspec-fuzz-") as tmp:
        root = Path(tmp) / "ckpt"
        shutil.copytree(base.path, root, symlinks=True)
        # What a path escaping the checkpoint would find, so an escape would not go unnoticed.
        shutil.copyfile(root / base.data_files[0], Path(tmp) / "outside.safetensors")
        (Path(tmp) / "x").write_bytes(b"outside")
        if hasattr(os, "mkfifo"):
            os.mkfifo(root / "fifo")
        yield root


def write_files(root: Path, files: Files) -> None:
    for name, blob in files.items():
        (root / name).write_bytes(blob)


# --- recording opens ---------------------------------------------------------------------------


def _allowed_prefixes() -> tuple[str, ...]:
    """Interpreter and library files a lazy import may read; never checkpoint data."""
    import site

    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, *site.getsitepackages(),
                site.getusersitepackages(), str(Path(shardspec.__file__).parent),
                str(REPO / "schema")}
    return tuple(os.path.realpath(p) + os.sep for p in prefixes if p)


ALLOWED = _allowed_prefixes()


@contextmanager
def recording_opens() -> Iterator[list[str]]:
    """Record every path given to ``os.open``, ``open`` and ``io.open`` while inside."""
    opened: list[str] = []
    real_os_open, real_open = os.open, builtins.open

    def note(file: Any) -> None:
        if not isinstance(file, int):
            opened.append(os.path.realpath(os.fsdecode(os.fspath(file))))

    def os_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        note(path)
        return real_os_open(path, flags, mode, dir_fd=dir_fd)

    def open_(file: Any, *args: Any, **kwargs: Any) -> Any:
        note(file)
        return real_open(file, *args, **kwargs)

    with mock.patch("os.open", os_open), mock.patch("builtins.open", open_), \
            mock.patch("io.open", open_):
        yield opened


def assert_inside(root: Path, opened: list[str]) -> None:
    real_root = os.path.realpath(root)
    for path in opened:
        if path.startswith(ALLOWED):
            continue
        assert path == real_root or path.startswith(real_root + os.sep), (
            f"opened {path!r}, outside the checkpoint {real_root!r}")


# --- the property ------------------------------------------------------------------------------


#: Python-level peak allocation allowed in one validate or load_rank call: 16 MiB of digest
#: buffers for each file hashed at once, plus slack. The files are a few KiB, so a read sized
#: from a claimed length (a header length, a manifest size) would pass it.
PEAK_BYTES = _HASH_WORKERS * 16 * 2**20 + 4 * 2**20


@contextmanager
def bounded_memory(enabled: bool) -> Iterator[None]:
    if not enabled:
        yield
        return
    tracemalloc.start()
    try:
        yield
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= PEAK_BYTES, f"allocated {peak} bytes at the peak"


def check_checkpoint(root: Path, *, memory: bool = False) -> None:
    """validate never raises; the reader raises only ShardspecError; both agree; no escape.

    With ``memory``, each call's peak allocation (tracemalloc, Python level) is bounded too.
    """
    with recording_opens() as opened, bounded_memory(memory):
        report = shardspec.validate(root, checksums=True)
    assert_inside(root, opened)
    assert isinstance(report, shardspec.Report)
    json.dumps(report.to_dict())
    reported = {f.code for f in report.errors}
    try:
        with recording_opens() as opened:
            checkpoint = shardspec.open(root)
    except shardspec.ShardspecError as exc:
        event(f"open fails: {exc.code}")  # see --hypothesis-show-statistics
        assert_inside(root, opened)
        assert not report.ok, f"validate found nothing but open fails: {exc}"
        assert exc.code in reported, f"open fails with {exc}; validate reports {reported}"
        return
    assert_inside(root, opened)
    for rank in range(min(checkpoint.world_size, MAX_RANKS)):
        try:
            with recording_opens() as opened, bounded_memory(memory):
                tensors = checkpoint.load_rank(rank, "cpu", verify=True)
        except shardspec.ShardspecError as exc:
            event(f"load fails: {exc.code}")
            assert not report.ok, f"validate found nothing but rank {rank} fails: {exc}"
            assert exc.code in reported, (
                f"rank {rank} fails with {exc}; validate reports {reported}")
        else:
            event("a rank loads")
            assert isinstance(tensors, dict)
            assert all(isinstance(t, torch.Tensor) for t in tensors.values())
        finally:
            assert_inside(root, opened)


# --- values ------------------------------------------------------------------------------------

NASTY_INTS = [0, 1, 2, 3, 4, 7, 8, -1, -2, 255, 256, 65535, 65536, 2**31, 2**32, 2**53 + 1,
              2**62, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), 10**30]
PATHS = ["../x", "/etc/passwd", "a/../../b", "..", ".", "", "a//b", "a/", "./a", "a\\b",
         "a\x00b", "shardspec.json", "config.json", "model-rank-0-part-0.safetensors",
         "model-rank-1-part-0.safetensors", "model-rank-2-part-0.safetensors", *DECOYS,
         "subdir/", "outside.safetensors", "../ckpt/config.json", "é" * 600, "a" * 1025,
         "\ud800", "CONFIG.JSON", " config.json"]
WORDS = [*DTYPES, "F8", "bf16", "float32", "", " ", "__metadata__", "NaN", "pp-ep-tp",
         "tp-pp-ep", "1.0", "1.1", "1.99", "2.0", "01.0", "1", "shardspec", "Shardspec", "none",
         "gptq", "sha256", "blake2b", "0" * 64, "f" * 128, "lm_head.weight",
         "model.embed_tokens.weight", "layers.0.col.weight", "layers.0.qkv.weight", "step",
         "empty", "\u202e", "\ud800", "\udfff\ud800", "\n", "x" * 300]
KEYS = ["format", "format_version", "generator", "layout", "ranks", "quantization", "tensors",
        "extra_files", "metadata", "extensions", "tp_size", "pp_size", "ep_size", "world_size",
        "rank_order", "rank", "tp_rank", "pp_rank", "ep_rank", "files", "path", "size",
        "checksums", "sha256", "blake2b", "md5", "method", "config", "dtype", "shape", "offset",
        "pieces", "file", "replica", "rank_local", "logical", "alias_of", "must_understand",
        "data_offsets", "__metadata__", "unknown", "my-ext", "x"]

ints = st.sampled_from(NASTY_INTS) | st.integers()
floats = st.sampled_from([0.0, -0.0, 0.5, 1.0, 2.0, 4.0, 1e300, float("nan"), float("inf")]) \
    | st.floats()
strings = st.sampled_from(PATHS) | st.sampled_from(WORDS) | st.text(max_size=12)
keys = st.sampled_from(KEYS) | strings
scalars = st.none() | st.booleans() | ints | floats | strings
shapes = st.lists(st.sampled_from([0, 1, 2, 3, 4, 8, 10, 2**62, 2**63 - 1, 2**63, -1]),
                  max_size=4) | st.builds(lambda: [1] * 65)  # a fresh list: mutations edit it
json_values = st.recursive(
    scalars | shapes,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=8,
)

# --- field-level mutations ---------------------------------------------------------------------

Key = str | int
JsonPath = tuple[Key, ...]


def nodes(doc: Any) -> list[JsonPath]:
    """Every JSON path in ``doc``, the root included (iterative: no recursion limit)."""
    out: list[JsonPath] = []
    stack: list[tuple[JsonPath, Any]] = [((), doc)]
    while stack:
        path, node = stack.pop()
        out.append(path)
        if isinstance(node, dict):
            stack.extend(((*path, k), v) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend(((*path, i), v) for i, v in enumerate(node))
    return out


def get(doc: Any, path: JsonPath) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def put(doc: Any, path: JsonPath, value: Any) -> Any:
    """``doc`` with the node at ``path`` replaced (the root replaced when path is empty)."""
    if not path:
        return value
    get(doc, path[:-1])[path[-1]] = value
    return doc


def tweaked(draw: Draw, value: Any) -> Any:
    """A near miss of ``value``: off by one, wrong type, one character off."""
    if isinstance(value, bool):
        return draw(st.sampled_from([not value, int(value), str(value).lower()]))
    if isinstance(value, int):
        return draw(st.sampled_from([value + 1, value - 1, -value - 1, value * 2, 0,
                                     float(value) if abs(value) < 2**1000 else 0.0,
                                     str(value), 2**63 - 1 - value, value + 2**63, value + 2**64,
                                     [value], None]))
    if isinstance(value, float):
        return draw(st.sampled_from([int(value) if value == value and abs(value) < 1e300 else 0,
                                     -value, value * 1e300, str(value)]))
    if isinstance(value, str):
        return draw(st.sampled_from([value + "x", value[:-1], "", value.upper(), "../" + value,
                                     value + "/", "/" + value, value + value, value + "\ud800",
                                     value.replace("-", "_"), value.replace(".", "/"),
                                     value + " ", "." + value]))
    if isinstance(value, list):
        choices: list[Any] = [[], value[::-1], value + value]
        if value:
            choices += [value[:-1], [*value, copy.deepcopy(value[-1])], value[0]]
        return draw(st.sampled_from(choices))
    if isinstance(value, dict):
        if not value:
            return draw(st.sampled_from([[], None, {"": {}}]))
        drop = draw(st.sampled_from(sorted(value)))
        return {k: v for k, v in value.items() if k != drop}
    return draw(st.sampled_from([0, "", False, {}, []]))


FIELD_OPS = ("replace", "tweak", "tweak", "delete", "add", "duplicate", "swap", "rename",
             "transplant")


def mutate_doc(draw: Draw, doc: Any, values: st.SearchStrategy[Any]) -> Any:
    """``doc`` (a copy) with 1-3 field mutations at random JSON paths."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, 3))):
        paths = nodes(doc)
        path = draw(st.sampled_from(paths), label="path")
        node = get(doc, path)
        op = draw(st.sampled_from(FIELD_OPS), label="op")
        if op == "replace":
            doc = put(doc, path, draw(values))
        elif op == "tweak":
            doc = put(doc, path, tweaked(draw, node))
        elif op == "delete" and path:
            del get(doc, path[:-1])[path[-1]]
        elif op == "add" and isinstance(node, dict):
            node[draw(keys)] = draw(values)
        elif op == "add" and isinstance(node, list):
            node.insert(draw(st.integers(0, len(node))), draw(values))
        elif op == "duplicate" and isinstance(node, list) and node:
            index = draw(st.integers(0, len(node) - 1))
            node.insert(draw(st.integers(0, len(node))), copy.deepcopy(node[index]))
        elif op == "duplicate" and isinstance(node, dict) and node:
            node[draw(keys)] = copy.deepcopy(node[draw(st.sampled_from(sorted(node)))])
        elif op == "swap" and isinstance(node, list) and len(node) >= 2:
            i, j = draw(st.integers(0, len(node) - 1)), draw(st.integers(0, len(node) - 1))
            node[i], node[j] = node[j], node[i]
        elif op == "swap" and isinstance(node, dict) and len(node) >= 2:
            a, b = draw(st.sampled_from(sorted(node))), draw(st.sampled_from(sorted(node)))
            node[a], node[b] = node[b], node[a]
        elif op == "rename" and path and isinstance(path[-1], str):
            parent = get(doc, path[:-1])
            parent[draw(keys)] = parent.pop(path[-1])
        elif op == "transplant":
            source = draw(st.sampled_from(paths), label="from")
            doc = put(doc, path, copy.deepcopy(get(doc, source)))
    return doc


def dumps(draw: Draw, doc: Any, *, compact: bool | None = None) -> bytes:
    """``doc`` as JSON bytes; lone surrogates come out escaped or as invalid UTF-8."""
    if compact is None:
        compact = draw(st.booleans())
    text = json.dumps(doc, allow_nan=True, ensure_ascii=draw(st.booleans()),
                      indent=None if compact else 1,
                      separators=(",", ":") if compact else None)
    return text.encode("utf-8", "surrogatepass")


# --- byte-level mutations ----------------------------------------------------------------------

TOKENS = [b"\xff" * 8, b"\x00" * 8, b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1", b"0",
          b"4.0", b"4e0", b"9223372036854775807", b"9223372036854775808",
          b"18446744073709551616", b"9" * 5000, b'"__metadata__"', b'{"a":1,"a":2}',
          b"[" * 100, b"[" * 5000, b'{"a":' * 100, b'"\\ud800"', b'"\\udfff\\ud800"',
          b"\\ud800", b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xef\xbb\xbf", b"\x00", b" " * 8,
          b"}", b"{", b",", b":", b'"', b"null", b"true", b'"../x"', b'"/etc/passwd"',
          b'"a/../../b"', b"//", b"\\", b"\n", b"\t", b"/*x*/", b",]"]
BYTE_OPS = ("flip", "overwrite", "truncate", "insert", "delete", "splice", "splice")


def mutate_bytes(draw: Draw, blob: bytes, regions: Sequence[tuple[int, int]] = ()) -> bytes:
    """``blob`` with 1-3 byte mutations, each anywhere or inside one of ``regions``."""
    out = bytearray(blob)
    for _ in range(draw(st.integers(1, 3))):
        spans = [(0, len(out))] + [(a, min(b, len(out))) for a, b in regions if a < len(out)]
        lo, hi = draw(st.sampled_from(spans), label="region")
        pos = draw(st.integers(lo, hi), label="at")
        op = draw(st.sampled_from(BYTE_OPS), label="op")
        if op == "flip" and pos < len(out):
            for _ in range(draw(st.integers(1, 8))):
                where = draw(st.integers(lo, max(lo, hi - 1)))
                out[where] ^= 1 << draw(st.integers(0, 7))
        elif op == "overwrite":
            new = draw(st.binary(min_size=1, max_size=16))
            out[pos : pos + len(new)] = new
        elif op == "truncate":
            del out[pos:]
        elif op == "insert":
            out[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del out[pos : pos + draw(st.integers(1, 16))]
        elif op == "splice":
            token = draw(st.sampled_from(TOKENS))
            end = pos + len(token) if draw(st.booleans()) else pos  # overwrite or insert
            out[pos:end] = token
    return bytes(out)


def manifest_regions(blob: bytes) -> list[tuple[int, int]]:
    """The manifest's numbers and strings: where a splice changes a value, not the syntax."""
    return [m.span() for m in re.finditer(rb'-?[0-9]+|"[^"]*"', blob)]


def split_safetensors(blob: bytes) -> tuple[int, bytes, bytes]:
    (length,) = struct.unpack("<Q", blob[:8])
    return length, blob[8 : 8 + length], blob[8 + length :]


def parsed_header(files: Files, base: Base, name: str) -> tuple[dict[str, Any], bytes]:
    """The header and data region of ``name``: as it is now, or as in the base if an earlier
    mutation broke it."""
    for blob in (files[name], base.files[name]):
        try:
            _, text, data = split_safetensors(blob)
            header = json.loads(text)
        except (struct.error, ValueError):
            continue
        if isinstance(header, dict):
            return header, data
    raise AssertionError("the base's header parses")


# --- whole-checkpoint mutations ----------------------------------------------------------------


def refresh(files: Files, names: Sequence[str]) -> None:
    """Make the manifest's sizes and digests of ``names`` match the files (if it still parses)."""
    try:
        doc = json.loads(files[MANIFEST])
        records = [f for r in doc["ranks"] for f in r["files"]] + doc.get("extra_files", [])
    except (ValueError, KeyError, TypeError):
        return
    for record in records:
        if isinstance(record, dict) and record.get("path") in names:
            blob = files[record["path"]]
            record["size"] = len(blob)
            record["checksums"] = {"sha256": hashlib.sha256(blob).hexdigest()}
    files[MANIFEST] = json.dumps(doc, indent=1).encode("utf-8")


def manifest_bytes_mutation(draw: Draw, files: Files, base: Base) -> None:
    blob = files[MANIFEST]
    files[MANIFEST] = mutate_bytes(draw, blob, manifest_regions(blob))


def data_bytes_mutation(draw: Draw, files: Files, base: Base) -> None:
    name = draw(st.sampled_from([*base.data_files, "config.json"]), label="file")
    blob = files[name]
    if name == "config.json":
        files[name] = mutate_bytes(draw, blob)
    else:
        length = struct.unpack("<Q", blob[:8])[0]
        regions = [(0, 8), (8, 8 + length), (8 + length, len(blob))]
        if draw(st.booleans(), label="set length prefix"):
            value = draw(st.sampled_from([0, 1, 2, 7, 8, length - 1, length + 1, len(blob) - 8,
                                          len(blob) - 7, 2**64 - 1, 2**63, 100_000_000,
                                          100_000_001]) | st.integers(0, 2**64 - 1))
            blob = struct.pack("<Q", value) + blob[8:]
        if draw(st.booleans(), label="more bytes"):
            blob = mutate_bytes(draw, blob, regions)
        files[name] = blob
    if draw(st.booleans(), label="refresh"):
        refresh(files, [name])


def manifest_field_mutation(draw: Draw, files: Files, base: Base) -> None:
    doc = json.loads(files[MANIFEST])  # valid JSON: only data-file mutations ran before
    if draw(st.integers(0, 3), label="newer minor") == 0:
        # the schema's other path, a newer minor version: unknown fields are warnings
        doc["format_version"] = f"1.{SUPPORTED_MINOR + 1}"
    files[MANIFEST] = dumps(draw, mutate_doc(draw, doc, json_values))


def header_values(data_size: int) -> st.SearchStrategy[Any]:
    sizes = st.sampled_from([0, 1, 2, data_size - 1, data_size, data_size + 1, 2**63 - 1, 2**63,
                             2**64, -1])
    return (
        st.sampled_from([*DTYPES, "F8", "bf16", "", "float32"])
        | shapes
        | st.lists(sizes, min_size=0, max_size=3)
        | st.dictionaries(strings, strings, max_size=2)
        | st.dictionaries(strings, json_values, max_size=2)
        | json_values
    )


def header_field_mutation(draw: Draw, files: Files, base: Base) -> None:
    name = draw(st.sampled_from(base.data_files), label="file")
    header, data = parsed_header(files, base, name)
    kind = draw(st.sampled_from(["fields", "fields", "fields", "reorder", "metadata"]))
    if kind == "fields":
        header = mutate_doc(draw, header, header_values(len(data)))
    elif kind == "reorder":
        order = draw(st.permutations(sorted(header)))
        header = {k: header[k] for k in order}
    else:
        header["__metadata__"] = draw(st.dictionaries(strings, strings, max_size=3)
                                      | json_values)
    body = dumps(draw, header, compact=draw(st.booleans()))
    pad = draw(st.sampled_from([b" "] * 5 + [b"\x00", b"\n", b"\t"]))  # only spaces are allowed
    body += pad * draw(st.integers(0, 9))
    length = len(body)
    if draw(st.integers(0, 3), label="wrong length") == 0:
        length = draw(st.sampled_from([0, 1, length - 1, length + 1, length + 8, 2**64 - 1,
                                       100_000_001]) | st.integers(0, 2**64 - 1))
    region = draw(st.sampled_from(["keep", "keep", "truncate", "append", "empty", "random"]))
    if region == "truncate":
        data = data[: draw(st.integers(0, len(data)))]
    elif region == "append":
        data += draw(st.binary(min_size=1, max_size=16))
    elif region == "empty":
        data = b""
    elif region == "random":
        data = draw(st.binary(min_size=len(data), max_size=len(data)))
    files[name] = struct.pack("<Q", length & (2**64 - 1)) + body + data
    if draw(st.integers(0, 3), label="refresh") != 0:
        refresh(files, [name])


# --- valid changes: the checkpoint stays valid and must load -----------------------------------


def rewrite_tensor(files: Files, base: Base, doc: dict[str, Any], tensor: str,
                   entry: Callable[[str, dict[str, Any]], None]) -> None:
    """Write ``doc`` as the manifest, let ``entry(file, header entry)`` edit ``tensor`` in every
    data file's header, and make the manifest's sizes and digests match again."""
    files[MANIFEST] = json.dumps(doc, indent=1).encode("utf-8")
    for name in base.data_files:
        header, data = parsed_header(files, base, name)
        if isinstance(header.get(tensor), dict):
            entry(name, header[tensor])
            body = json.dumps(header).encode("utf-8")
            files[name] = struct.pack("<Q", len(body)) + body + data
    refresh(files, base.data_files)


def retype_mutation(draw: Draw, files: Files, base: Base) -> None:
    """Give one tensor another dtype with the same bytes everywhere at once: same width, or
    narrower (F4, F6, U8, ...) with the last dimension scaled to match."""
    doc = json.loads(files[MANIFEST])
    names = sorted(n for n, r in doc["tensors"].items() if "dtype" in r)
    tensor = draw(st.sampled_from(names), label="tensor")
    record = doc["tensors"][tensor]
    old = DTYPES[record["dtype"]].bits
    lists = [record["shape"]] if "shape" in record else []
    lists += [p["shape"] for p in record["pieces"]] + [p["offset"] for p in record["pieces"]
                                                       if "offset" in p]

    def fits(bits: int) -> bool:
        if bits == old:
            return True
        return all(v and v[-1] * old % bits == 0 and v[-1] * old // bits < 2**63 for v in lists)

    dtype = draw(st.sampled_from([d for d in sorted(DTYPES) if fits(DTYPES[d].bits)]),
                 label="dtype")
    new = DTYPES[dtype].bits
    for dims in lists:
        if dims:
            dims[-1] = dims[-1] * old // new
    record["dtype"] = dtype

    def edit(file: str, entry: dict[str, Any]) -> None:
        entry["dtype"] = dtype
        if entry["shape"]:
            entry["shape"][-1] = entry["shape"][-1] * old // new

    rewrite_tensor(files, base, doc, tensor, edit)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def same_count_shape(draw: Draw, count: int) -> list[int]:
    """A shape of ``count`` elements: factors of it, or any dimensions around a zero."""
    if count == 0:
        dims = draw(st.lists(st.sampled_from([0, 1, 2, 3, 2**20, 2**40, 2**62, 2**63 - 1]),
                             max_size=4))
        dims.insert(draw(st.integers(0, len(dims))), 0)
        if element_count(dims) is None:  # [2**62, 4, 0] counts past 2**63 before the zero
            dims.remove(0)
            dims.insert(0, 0)
        return dims
    if count == 1 and draw(st.booleans()):
        return []
    dims, rest = [], count
    for _ in range(draw(st.integers(0, 3))):
        dim = draw(st.sampled_from(divisors(rest)))
        dims.append(dim)
        rest //= dim
    return [*dims, rest]


def reshape_mutation(draw: Draw, files: Files, base: Base) -> None:
    """Give a whole-piece tensor (replicated, zero-size, rank-local) another shape of the same
    element count, everywhere at once."""
    doc = json.loads(files[MANIFEST])
    names = sorted(
        n for n, r in doc["tensors"].items()
        if "dtype" in r and "logical" not in r
        and all(p["shape"] == r.get("shape", p["shape"]) for p in r["pieces"]))
    tensor = draw(st.sampled_from(names), label="tensor")
    record = doc["tensors"][tensor]
    new_shape: dict[str, list[int]] = {}  # file -> the shape its entry gets
    if "shape" in record:
        shape = same_count_shape(draw, element_count(record["shape"]) or 0)
        record["shape"] = shape
    for piece in record["pieces"]:
        if "shape" not in record:
            shape = same_count_shape(draw, element_count(piece["shape"]) or 0)
        piece["shape"] = list(shape)
        if "offset" in piece:
            piece["offset"] = [0] * len(shape)
        new_shape[piece["file"]] = list(shape)

    def edit(file: str, entry: dict[str, Any]) -> None:
        entry["shape"] = new_shape.get(file, entry["shape"])

    rewrite_tensor(files, base, doc, tensor, edit)


Mutation = Callable[[Draw, Files, Base], None]
#: In this order: valid changes, then data-file mutations (they may rewrite the manifest to
#: match, see ``refresh``), then manifest mutations.
MUTATIONS: dict[str, Mutation] = {
    "reshape": reshape_mutation,
    "retype": retype_mutation,
    "data-bytes": data_bytes_mutation,
    "header-fields": header_field_mutation,
    "manifest-fields": manifest_field_mutation,
    "manifest-bytes": manifest_bytes_mutation,
}


def run_mutations(draw: Draw, base: Base, root: Path, kinds: Sequence[str]) -> None:
    files = dict(base.files)
    for kind in MUTATIONS:
        if kind in kinds:
            MUTATIONS[kind](draw, files, base)
    write_files(root, files)


def fuzz(base: Base, data: st.DataObject, kinds: Sequence[str]) -> None:
    with checkpoint_copy(base) as root:
        run_mutations(data.draw, base, root, kinds)
        check_checkpoint(root)


# --- the properties ----------------------------------------------------------------------------


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("kind", ["manifest-bytes", "data-bytes", "manifest-fields",
                                  "header-fields"])
@fuzz_settings(EXAMPLES)
@given(data=st.data())
def test_mutations_of_one_kind(base: Base, kind: str, data: st.DataObject) -> None:
    fuzz(base, data, [kind])


@pytest.mark.timeout(TIMEOUT_S)
@fuzz_settings(EXAMPLES)
@given(data=st.data(), kinds=st.sets(st.sampled_from(sorted(MUTATIONS)), min_size=1))
def test_mixed_mutations(base: Base, data: st.DataObject, kinds: set[str]) -> None:
    fuzz(base, data, sorted(kinds))


@pytest.mark.timeout(TIMEOUT_S)
@fuzz_settings(max(1, EXAMPLES // 2))
@given(data=st.data(), kinds=st.sets(st.sampled_from(["reshape", "retype"]), min_size=1))
def test_valid_changes_stay_valid(base: Base, data: st.DataObject, kinds: set[str]) -> None:
    """Reshaped and retyped tensors (F4, F6, F8, BOOL, zero-size with huge dimensions, ...):
    validate passes and every rank loads."""
    with checkpoint_copy(base) as root:
        run_mutations(data.draw, base, root, sorted(kinds))
        report = shardspec.validate(root, checksums=True)
        assert report.ok, [str(f) for f in report.errors]
        check_checkpoint(root)


@pytest.mark.timeout(TIMEOUT_S)
@fuzz_settings(max(1, EXAMPLES // 4))
@given(data=st.data(), kinds=st.sets(
    st.sampled_from(["data-bytes", "header-fields", "manifest-fields"]), min_size=1))
def test_no_allocation_sized_from_a_claim(base: Base, data: st.DataObject, kinds: set[str]) -> None:
    """Header lengths, offsets, shapes and sizes are claims: memory follows the real files."""
    with checkpoint_copy(base) as root:
        run_mutations(data.draw, base, root, sorted(kinds))
        check_checkpoint(root, memory=True)


@pytest.mark.timeout(TIMEOUT_S)
@fuzz_settings(EXAMPLES)
@given(data=st.data(), kinds=st.sets(st.sampled_from(
    ["data-bytes", "header-fields", "manifest-fields", "manifest-bytes"]), min_size=1))
def test_joined_pieces_mutations(joined_base: Base, data: st.DataObject, kinds: set[str]
                                 ) -> None:
    """Several pieces of a rank, joined (format 1.3): an offset cut short raised IndexError
    on every parse path (issue 49 item 6)."""
    fuzz(joined_base, data, sorted(kinds))


def test_fuzz_helpers_see_the_base(base: Base) -> None:
    """The strategies have something to bite: the base parses and its regions are found."""
    assert len(nodes(json.loads(base.files[MANIFEST]))) > 100
    assert manifest_regions(base.files[MANIFEST])
    for name in base.data_files:
        length, text, data = split_safetensors(base.files[name])
        assert text.startswith(b"{") and data


# --- the command line --------------------------------------------------------------------------

runner = CliRunner()
TENSORS = ["layers.0.col.weight", "layers.0.row.weight", "layers.0.norm.weight",
           "layers.0.qkv.weight", "lm_head.weight", "step", "empty", "missing"]


@pytest.mark.timeout(TIMEOUT_S)
@fuzz_settings(CLI_EXAMPLES)
@given(data=st.data(), kinds=st.sets(st.sampled_from(sorted(MUTATIONS)), min_size=1))
def test_cli_reports_without_traceback(base: Base, data: st.DataObject, kinds: set[str]) -> None:
    with checkpoint_copy(base) as root:
        run_mutations(data.draw, base, root, sorted(kinds))
        result = runner.invoke(app, ["validate", str(root), "--checksums", "--json"])
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            result.exception)
        assert result.exit_code in (0, 1), result.output
        assert "Traceback" not in result.output
        assert json.loads(result.stdout)["valid"] is (result.exit_code == 0)
        tensor = data.draw(st.sampled_from(TENSORS), label="tensor")
        for args in (["validate", str(root)], ["inspect", str(root)],
                     ["inspect", str(root), "--json"], ["inspect", str(root), "--tensor", tensor],
                     ["inspect", str(root), "--tensor", tensor, "--json"],
                     ["files", str(root), "--rank", "1"],
                     ["files", str(root), "--rank", "0", "--json"]):
            result = runner.invoke(app, args)
            assert result.exception is None or isinstance(result.exception, SystemExit), (
                args, result.exception)
            assert result.exit_code in (0, 1, 2), (args, result.output)
            assert "Traceback" not in result.output
            if result.exit_code == 0 and "--json" in args:
                json.loads(result.stdout)


def _bad_prefix_and_markup(root: Path) -> None:
    """A data file whose length prefix is all ones; metadata that looks like rich markup."""
    doc = json.loads((root / MANIFEST).read_bytes())
    doc["metadata"] = {"[bold]x[/]": "[/] \u202e \n"}
    (root / MANIFEST).write_text(json.dumps(doc), encoding="utf-8")
    data_file = root / doc["ranks"][1]["files"][0]["path"]
    data_file.write_bytes(b"\xff" * 8 + data_file.read_bytes()[8:])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("damage", [None, _bad_prefix_and_markup], ids=["valid", "damaged"])
def test_cli_subprocess_prints_json_without_traceback(
    base: Base, damage: Callable[[Path], None] | None
) -> None:
    with checkpoint_copy(base) as root:
        if damage is not None:
            damage(root)
        env = {k: v for k, v in os.environ.items() if k != "SHARDSPEC_DEBUG"}
        env["PYTHONPATH"] = str(REPO / "reference")
        proc = subprocess.run(
            [sys.executable, "-c", "from shardspec.cli import main; main()", "validate",
             str(root), "--checksums", "--json"],
            env=env, capture_output=True, text=True, timeout=110, check=False,
        )
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == (0 if damage is None else 1), proc.stderr
    report = json.loads(proc.stdout)
    assert report["valid"] is (damage is None)
    if damage is not None:
        codes = {f["code"] for f in report["findings"]}
        assert {"st-header-length", "checksum-mismatch"} <= codes, codes


def test_open_recording_catches_an_escape(tmp_path: Path) -> None:
    """The recorder itself works: an open outside the checkpoint is caught."""
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "secret").write_bytes(b"")
    with recording_opens() as opened:
        io.open(tmp_path / "secret", "rb").close()  # noqa: SIM115, UP020
        os.close(os.open(tmp_path / "ckpt", os.O_RDONLY))
    assert len(opened) == 2
    with pytest.raises(AssertionError, match="outside the checkpoint"):
        assert_inside(tmp_path / "ckpt", opened)
