"""Corrupt source bytes are refused, not carried into a new checkpoint under fresh checksums."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

import shardspec
import shardspec.reshard.load as reshard_load
from hf_helpers import llama_tensors, write_hf_dir
from shardspec.cli import app
from shardspec.convert import convert, merge
from shardspec.format.errors import IntegrityError
from shardspec.format.manifest import Layout
from shardspec.reshard import reshard


def _checkpoint(tmp_path: Path, tp: int) -> Path:
    src = write_hf_dir(tmp_path / "hf", llama_tensors(layers=2, hidden=64, heads=4,
                                                        kv_heads=2, dtype=torch.bfloat16))
    convert(src, tmp_path / "ckpt", tp_size=tp)
    return tmp_path / "ckpt"


def _flip_a_data_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    header = int.from_bytes(data[:8], "little")
    data[8 + header + 5] ^= 0x01  # one bit of the first tensor's data; the header is intact
    path.write_bytes(bytes(data))


def test_reshard_refuses_a_flipped_byte(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, 2)
    _flip_a_data_byte(ckpt / "shard-00002-model-00001-of-00001.safetensors")
    with pytest.raises(IntegrityError, match="sha256") as info:
        reshard(ckpt, tmp_path / "out", Layout(tp_size=1))
    assert info.value.code == "checksum-mismatch"
    assert info.value.finding.file == "shard-00002-model-00001-of-00001.safetensors"
    assert not (tmp_path / "out" / "shardspec.json").exists()
    result = CliRunner().invoke(app, ["reshard", str(ckpt), str(tmp_path / "cli"), "--tp", "1"])
    assert result.exit_code == 1, result.output
    assert "checksum-mismatch" in result.output
    assert not (tmp_path / "cli" / "shardspec.json").exists()
    # asked not to verify, it trusts the source (and says so in its docs)
    reshard(ckpt, tmp_path / "trusted", Layout(tp_size=1), verify=False)


def test_merge_refuses_a_flipped_byte(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, 2)
    _flip_a_data_byte(ckpt / "shard-00001-model-00001-of-00001.safetensors")
    with pytest.raises(IntegrityError, match="sha256"):
        merge(ckpt, tmp_path / "merged")
    assert not (tmp_path / "merged" / "model.safetensors").exists()
    result = CliRunner().invoke(app, ["merge", str(ckpt), str(tmp_path / "cli")])
    assert result.exit_code == 1 and "checksum-mismatch" in result.output


def test_each_source_file_is_hashed_once_per_reshard(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = _checkpoint(tmp_path, 1)
    hashed: Counter[str] = Counter()
    verify = reshard_load._verify

    def counting(readable: Any, record: Any, stats: Any) -> None:
        hashed[record.path] += 1
        verify(readable, record, stats)

    monkeypatch.setattr(reshard_load, "_verify", counting)
    reshard(ckpt, tmp_path / "tp4", Layout(tp_size=4))
    # 4 target ranks all read rank 0's one file: it is hashed once, not four times
    assert hashed == Counter({"shard-00001-model-00001-of-00001.safetensors": 1})
    assert shardspec.validate(tmp_path / "tp4", checksums=True).ok
