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
from typer.testing import CliRunner

import shardspec
from conftest import make_tiny, read_manifest_dict, write_manifest_dict
from shardspec.cli import app
from shardspec.format.errors import ShardspecError
from shardspec.format.parse import parse_manifest

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
