"""The staging pipeline (shardspec.load.staging): bounded buffers, ordering, exact bytes, errors."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fake_engine import FakeEngine
from shardspec.format.errors import SafetensorsError
from shardspec.load.host_memory import PAGE_BYTES
from shardspec.load.reads import open_direct
from shardspec.load.staging import staged_read


def _file(path: Path, size: int, seed: int) -> bytes:
    data = hashlib.shake_256(seed.to_bytes(4, "little")).digest(size) if size else b""
    path.write_bytes(data)
    return data


def _read_staged(engine: FakeEngine, path: Path, start: int, size: int, digest: Any,
                 direct: bool = False, **options: Any) -> torch.Tensor:
    """``staged_read`` of the ``size`` bytes at ``start`` of ``path`` (named "data"), through
    an O_DIRECT descriptor as well where ``direct``."""
    fd = os.open(path, os.O_RDONLY)
    direct_fd = open_direct(fd) if direct else None
    try:
        assert direct_fd is not None or not direct
        return staged_read(engine, fd, start, size, "data", digest, direct=direct_fd, **options)
    finally:
        if direct_fd is not None:
            os.close(direct_fd)
        os.close(fd)


@given(
    size=st.integers(0, 200_000),
    start=st.integers(0, 5000),
    chunk=st.integers(1, 70_000),
    depth=st.integers(1, 4),
    readers=st.integers(1, 3),
)
def test_staged_bytes_equal_the_file_whatever_the_chunking(
    tmp_path_factory: pytest.TempPathFactory, size: int, start: int, chunk: int, depth: int,
    readers: int,
) -> None:
    path = tmp_path_factory.getbasetemp() / "staging-data"
    data = _file(path, start + size, seed=size * 7 + chunk)
    engine = FakeEngine()
    digest = hashlib.sha256()
    out = _read_staged(engine, path, start, size, digest, chunk=chunk, depth=depth,
                       readers=readers)
    assert out.numpy().tobytes() == data[start:]
    assert digest.hexdigest() == hashlib.sha256(data[start:]).hexdigest()
    # pinned memory is bounded by depth x chunk, whatever the size
    assert engine.staging_buffers <= depth
    assert engine.staging_bytes <= depth * min(chunk, max(size, 1))
    assert engine.pending == 0 and engine.finished == (1 if size else 0)


def test_a_file_shorter_than_its_header_says_is_an_error_and_copies_are_finished(
    tmp_path: Path,
) -> None:
    path = tmp_path / "data"
    _file(path, 10_000, seed=1)
    engine = FakeEngine()
    with pytest.raises(SafetensorsError) as info:
        _read_staged(engine, path, 0, 25_000, None, chunk=4096, depth=2)
    assert info.value.code == "st-offsets" and info.value.finding.file == "data"
    assert engine.pending == 0 and engine.finished == 1


def test_nonpositive_parameters_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        staged_read(FakeEngine(), 0, 0, 1, "x", None, chunk=0)


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="direct reads are Linux's")
@given(
    size=st.integers(0, 120_000),
    start=st.integers(0, 9000),
    pages=st.integers(1, 5),
    depth=st.integers(1, 3),
    readers=st.integers(1, 2),
    tail=st.integers(0, 5000),
)
def test_chunks_read_directly_into_staging_equal_the_file(
    tmp_path_factory: pytest.TempPathFactory, size: int, start: int, pages: int, depth: int,
    readers: int, tail: int,
) -> None:
    # Chunks start on the file's pages: the first holds some header, the last may pass the
    # file's end; neither may reach the output or the digest.
    path = tmp_path_factory.getbasetemp() / "staging-direct"
    data = _file(path, start + size + tail, seed=size * 5 + start)
    engine = FakeEngine(page_aligned=True)
    digest = hashlib.sha256()
    out = _read_staged(engine, path, start, size, digest, direct=True,
                       chunk=pages * PAGE_BYTES, depth=depth, readers=readers)
    assert out.numpy().tobytes() == data[start : start + size]
    assert digest.hexdigest() == hashlib.sha256(data[start : start + size]).hexdigest()
    assert engine.staging_buffers <= depth
    assert engine.staging_bytes <= depth * pages * PAGE_BYTES
    assert engine.pending == 0


def test_direct_chunks_must_be_whole_pages(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="whole pages"):
        staged_read(FakeEngine(), 0, 0, 1, "x", None, chunk=PAGE_BYTES + 1, direct=0)
