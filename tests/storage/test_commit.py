"""SPEC 10: durable writes under temporary names; the manifest is written last."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardspec.storage.commit import (
    LEFTOVER,
    TEMP_SUFFIX,
    commit_manifest,
    uncommit,
    write_durably,
)


def test_write_durably_renames_into_place(tmp_path: Path) -> None:
    seen: list[Path] = []

    def write(temp: Path) -> None:
        seen.append(temp)
        temp.write_bytes(b"data")

    write_durably(tmp_path / "model-rank-0-part-0.safetensors", write)
    (temp,) = seen
    # a new name each write, created here (never a name planted beforehand), that LEFTOVER
    # matches: an interrupted write's temporary is removed by the next write
    assert temp.name.startswith(".model-rank-0-part-0.safetensors.")
    assert temp.name.endswith(TEMP_SUFFIX) and LEFTOVER.match(temp.name)
    assert temp.parent == tmp_path and not temp.exists()
    assert (tmp_path / "model-rank-0-part-0.safetensors").read_bytes() == b"data"


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    def write(temp: Path) -> None:
        temp.write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_durably(tmp_path / "a.safetensors", write)
    assert list(tmp_path.iterdir()) == []


def test_failed_rewrite_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "a.safetensors"
    target.write_bytes(b"old")

    def write(temp: Path) -> None:
        temp.write_bytes(b"new but broken")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        write_durably(target, write)
    assert [p.name for p in tmp_path.iterdir()] == ["a.safetensors"]
    assert target.read_bytes() == b"old"


def test_commit_and_uncommit(tmp_path: Path) -> None:
    commit_manifest(tmp_path, b'{"format": "shardspec"}\n')
    assert (tmp_path / "shardspec.json").read_bytes() == b'{"format": "shardspec"}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["shardspec.json"]
    uncommit(tmp_path)
    assert list(tmp_path.iterdir()) == []
    uncommit(tmp_path)  # nothing to remove is fine
