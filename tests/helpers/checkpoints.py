"""Shared helpers and fixtures: a tiny valid checkpoint, hand-made safetensors bytes, manifest
edits, the page cache (``tests/conftest.py`` loads this module as a plugin).

Hypothesis profiles are picked by ``SHARDSPEC_HYPOTHESIS_PROFILE``: ``ci`` (default,
derandomized and quick) or ``thorough`` (1000 examples per property).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import shardspec
from shardspec import Layout, Shard
from shardspec.testing.profiles import load_profile

load_profile()  # shardspec.testing.profiles: SHARDSPEC_HYPOTHESIS_PROFILE, "ci" by default


REPO = Path(__file__).resolve().parents[2]
SCHEMA_FILE = REPO / "schema" / "manifest.schema.json"


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    # pyproject.toml sets pytest-timeout's ``timeout``; without that plugin pytest warns about an
    # unknown option and ``filterwarnings = error`` turns the warning into a failed run.
    if not pluginmanager.hasplugin("timeout"):
        parser.addini("timeout", "ignored: pytest-timeout is not installed", default="0")


# --- bytes -----------------------------------------------------------------------------------


def raw_bytes(tensor: torch.Tensor) -> bytes:
    """A tensor's bytes in row-major order, whatever its dtype (bit-exact comparisons)."""
    if tensor.numel() == 0:
        return b""
    # a fresh dense copy: .contiguous() may keep odd strides on size-1 dimensions
    flat = torch.empty(tensor.numel(), dtype=tensor.dtype)
    flat.copy_(tensor.detach().to("cpu").reshape(-1))
    return flat.view(torch.uint8).numpy().tobytes()


def assert_same_tensor(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Same dtype, same shape, same bytes (NaN payloads included)."""
    assert actual.dtype == expected.dtype
    assert tuple(actual.shape) == tuple(expected.shape)
    assert raw_bytes(actual) == raw_bytes(expected)


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def safetensors_bytes(
    header: dict[str, Any] | bytes | str,
    data: bytes = b"",
    *,
    length: int | None = None,
    pad: int = 0,
) -> bytes:
    """A safetensors file by hand: 8-byte LE length, the header (padded with spaces), data.

    ``header`` may be a dict (serialized compactly), or str/bytes used verbatim so that tests
    can write duplicate keys or broken JSON; ``length`` overrides the recorded header length.
    """
    if isinstance(header, dict):
        header = json.dumps(header, separators=(",", ":"))
    if isinstance(header, str):
        header = header.encode("utf-8")
    header += b" " * pad
    recorded = len(header) if length is None else length
    return struct.pack("<Q", recorded) + header + data


def tensor_file_bytes(
    tensors: dict[str, tuple[str, list[int], bytes]],
    *,
    metadata: dict[str, str] | None = None,
    pad_to: int = 1,
) -> bytes:
    """A well-formed safetensors file from ``name -> (dtype name, shape, raw bytes)``.

    Tensors are laid out in the given order with no padding between them, so offsets are
    unaligned whenever the sizes are; ``pad_to`` pads the header like safetensors does (8).
    """
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    data = b""
    for name, (dtype, shape, payload) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    text = json.dumps(header, separators=(",", ":")).encode()
    pad = (-len(text)) % pad_to
    return safetensors_bytes(text, data, pad=pad)


# --- manifests on disk -----------------------------------------------------------------------


def read_manifest_dict(root: Path) -> dict[str, Any]:
    return json.loads((root / "shardspec.json").read_bytes())


def write_manifest_dict(root: Path, data: dict[str, Any]) -> None:
    (root / "shardspec.json").write_text(json.dumps(data, indent=1), encoding="utf-8")


def rewrite_manifest(root: Path, edit: Callable[[dict[str, Any]], object]) -> None:
    """Load ``root/shardspec.json``, let ``edit`` change it in place (its return value is
    ignored, so a lambda may call ``update`` or ``pop``), and write it back."""
    data = read_manifest_dict(root)
    edit(data)
    write_manifest_dict(root, data)


def file_record(data: dict[str, Any], path: str) -> dict[str, Any]:
    """The file record for ``path`` in a manifest dict (data file or extra file)."""
    for rank in data["ranks"]:
        for record in rank["files"]:
            if record["path"] == path:
                return record
    for record in data.get("extra_files", []):
        if record["path"] == path:
            return record
    raise KeyError(path)


def refresh_record(root: Path, path: str) -> None:
    """Make the manifest's size and sha256 of ``path`` match the file as it is now."""

    def edit(data: dict[str, Any]) -> None:
        record = file_record(data, path)
        record["size"] = (root / path).stat().st_size
        record["checksums"] = {"sha256": sha256_file(root / path)}

    rewrite_manifest(root, edit)


# --- a tiny checkpoint -----------------------------------------------------------------------


def tp_states(
    tensors: dict[str, tuple[torch.Tensor, int | None]], tp: int
) -> tuple[dict[int, dict[str, torch.Tensor]], dict[int, dict[str, Shard]]]:
    """Each rank's pieces of global tensors (name -> (tensor, split dim or None)) at TP=``tp``,
    and their Shards: what shardspec.save takes."""
    states: dict[int, dict[str, torch.Tensor]] = {r: {} for r in range(tp)}
    sharding: dict[int, dict[str, Shard]] = {r: {} for r in range(tp)}
    for name, (tensor, dim) in tensors.items():
        for rank, (piece, shard) in enumerate(shardspec.split(tensor, dim, tp)):
            states[rank][name] = piece
            sharding[rank][name] = shard
    return states, sharding


@dataclass
class Tiny:
    """A TP=2 checkpoint on disk and, per rank, the tensors a reader must return."""

    path: Path
    manifest: shardspec.Manifest
    expected: dict[int, dict[str, torch.Tensor]]

    def data_file(self, rank: int, part: int = 0) -> Path:
        return self.path / self.manifest.ranks[rank].files[part].path


def make_tiny(path: Path, **save_kwargs: Any) -> Tiny:
    """Write the tiny TP=2 model: a colwise and a rowwise weight, a replicated norm, a
    rank-local fused qkv, tied embeddings (an alias), a scalar and a zero-size tensor."""
    gen = torch.Generator().manual_seed(0)
    col = torch.randn(8, 4, generator=gen).to(torch.bfloat16)
    row = torch.randn(4, 6, generator=gen)
    norm = torch.randn(4, generator=gen)
    embed = torch.randn(10, 4, generator=gen)
    scalar = torch.tensor(3.5, dtype=torch.float64)
    empty = torch.zeros(0, 4, dtype=torch.float16)
    cols, rows, norms = (shardspec.split(col, 0, 2), shardspec.split(row, 1, 2),
                         shardspec.split(norm, None, 2))
    scalars, empties = shardspec.split(scalar, None, 2), shardspec.split(empty, 0, 2)
    states: dict[int, dict[str, torch.Tensor]] = {}
    sharding: dict[int, dict[str, Shard]] = {}
    for rank in range(2):
        qkv = torch.full((3 + rank, 4), float(rank), dtype=torch.bfloat16)
        states[rank] = {
            "model.embed_tokens.weight": embed,
            "lm_head.weight": embed,
            "layers.0.col.weight": cols[rank][0],
            "layers.0.row.weight": rows[rank][0],
            "layers.0.norm.weight": norms[rank][0],
            "layers.0.qkv.weight": qkv,
            "step": scalars[rank][0],
            "empty": empties[rank][0],
        }
        sharding[rank] = {
            "layers.0.col.weight": cols[rank][1],
            "layers.0.row.weight": rows[rank][1],
            "layers.0.norm.weight": norms[rank][1],
            "step": scalars[rank][1],
            "empty": empties[rank][1],
        }
    manifest = shardspec.save(states, path, layout=Layout(tp_size=2), sharding=sharding,
                              **save_kwargs)
    expected = {r: {k: v.clone() for k, v in s.items()} for r, s in states.items()}
    return Tiny(path=Path(path), manifest=manifest, expected=expected)


@pytest.fixture
def tiny(tmp_path: Path) -> Tiny:
    return make_tiny(tmp_path / "ckpt")


@pytest.fixture(scope="session")
def tiny_manifest_dict(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The tiny checkpoint's manifest as a dict (read-only: use ``manifest_dict``)."""
    return read_manifest_dict(make_tiny(tmp_path_factory.mktemp("tiny") / "ckpt").path)


@pytest.fixture
def manifest_dict(tiny_manifest_dict: dict[str, Any]) -> dict[str, Any]:
    """A fresh, editable copy of a valid manifest dict."""
    return copy.deepcopy(tiny_manifest_dict)


def manifest_bytes(data: dict[str, Any]) -> bytes:
    return json.dumps(data).encode("utf-8")


def write_handmade(
    root: Path,
    tensors: dict[str, tuple[str, list[int], bytes]],
    *,
    pad_to: int = 1,
) -> Path:
    """A one-rank checkpoint whose only data file is written by hand (see
    :func:`tensor_file_bytes`); every tensor is a global tensor held whole by rank 0."""
    root.mkdir(parents=True, exist_ok=True)
    name = "model-rank-0-part-0.safetensors"
    (root / name).write_bytes(tensor_file_bytes(tensors, pad_to=pad_to))
    data = {
        "format": "shardspec",
        "format_version": "1.0",
        "layout": {"tp_size": 1, "pp_size": 1, "ep_size": 1, "world_size": 1,
                   "rank_order": "pp-ep-tp"},
        "ranks": [{"rank": 0, "tp_rank": 0, "pp_rank": 0, "ep_rank": 0, "files": [
            {"path": name, "size": (root / name).stat().st_size,
             "checksums": {"sha256": sha256_file(root / name)}}]}],
        "quantization": {"method": "none"},
        "tensors": {
            tensor: {"dtype": dtype, "shape": shape, "pieces": [
                {"rank": 0, "file": name, "offset": [0] * len(shape), "shape": shape}]}
            for tensor, (dtype, shape, _) in tensors.items()
        },
    }
    write_manifest_dict(root, data)
    return root


def evict(path: Path, offset: int = 0, length: int = 0) -> None:
    """Drop ``length`` bytes of ``path`` from ``offset`` out of the page cache (0: to the end)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
