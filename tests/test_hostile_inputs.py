"""Hostile input, round four (issue 49): manifests, imports and options that crashed or hung.

Each test failed before its fix: "internal error" on the command line, a Python exception
that is not a shardspec error, a valid verdict for a checkpoint a reader cannot load, or a
file silently dropped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

import shardspec
from conftest import make_tiny, read_manifest_dict, write_manifest_dict
from shardspec import Layout, Shard
from shardspec.cli import app
from shardspec.format.errors import ShardspecError
from shardspec.format.parse import parse_manifest
from shardspec.reshard.write import reshard

runner = CliRunner()


def cli_json(*args: str) -> dict[str, Any]:
    result = runner.invoke(app, [*args, "--json"])
    said = result.stdout + result.stderr
    assert "internal error" not in said and "Traceback" not in said, said
    data: dict[str, Any] = json.loads(result.stdout)
    return data


# --- item 6: two pieces on one rank, one offset shorter than the shape ------------------------


def short_offset(root: Path) -> None:
    """Rank 0 holds a second piece of the colwise weight, in a second file, whose offset has
    one number for a tensor of two dimensions."""
    data = read_manifest_dict(root)
    data["format_version"] = "1.3"
    files = data["ranks"][0]["files"]
    files.append({**files[0], "path": "model-rank-0-part-1.safetensors"})
    data["tensors"]["layers.0.col.weight"]["pieces"].append(
        {"rank": 0, "file": "model-rank-0-part-1.safetensors", "offset": [4], "shape": [4, 4]})
    write_manifest_dict(root, data)


def test_a_short_offset_among_several_pieces_is_piece_bounds(tmp_path: Path) -> None:
    """validate and inspect said "internal error: IndexError"; shardspec.open raised it."""
    tiny = make_tiny(tmp_path / "ckpt")
    short_offset(tiny.path)
    data = (tiny.path / "shardspec.json").read_bytes()
    assert parse_manifest(data).findings[0].code == "piece-bounds"
    with pytest.raises(ShardspecError) as excinfo:
        shardspec.open(tiny.path)
    assert excinfo.value.code == "piece-bounds"
    report = cli_json("validate", str(tiny.path))
    assert report["valid"] is False and "piece-bounds" in json.dumps(report)
    assert "piece-bounds" in json.dumps(cli_json("inspect", str(tiny.path)))


# --- item 8: sub-byte joins of a tensor with no elements -------------------------------------


@pytest.mark.parametrize("dim", [0, 1])
def test_a_sub_byte_join_with_no_elements_loads_empty(tmp_path: Path, dim: int) -> None:
    """SPEC 7.7: a reader returns a zero-element tensor. validate said valid, and the writer
    and load_rank raised torch's "cannot reshape tensor of 0 elements"."""
    shape = (0, 8) if dim == 1 else (4, 0)
    value = torch.empty((shape[0], shape[1] // 2), dtype=torch.uint8).view(
        torch.float4_e2m1fn_x2)
    half = [0, 0]
    half[dim] = shape[dim] // 2
    pieces = [Shard(shape, (0, 0), shape=(*shape[:dim], half[dim], *shape[dim + 1:])),
              Shard(shape, tuple(half), shape=(*shape[:dim], half[dim], *shape[dim + 1:]))]
    shardspec.save({0: {"w": value}}, tmp_path / "c", layout=Layout(tp_size=1),
                   sharding={0: {"w": pieces}})
    assert shardspec.validate(tmp_path / "c", checksums=True).ok
    got = shardspec.load_rank(tmp_path / "c", 0, "cpu", verify=True)["w"]
    assert got.dtype == torch.float4_e2m1fn_x2 and got.numel() == 0
    assert tuple(got.shape) == tuple(value.shape)
    reshard(tmp_path / "c", tmp_path / "r", Layout(tp_size=2))
    for rank in range(2):
        assert shardspec.load_rank(tmp_path / "r", rank, "cpu")["w"].numel() == 0
