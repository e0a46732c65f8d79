"""SPEC 9.2: streamed digests equal hashlib's over the whole file."""

from __future__ import annotations

import hashlib
import io
import threading
from pathlib import Path

import pytest

import shardspec.format.integrity
from shardspec.format.integrity import ALGORITHMS, digest_stream


@pytest.mark.parametrize("size", [0, 1, 1000, 3 * 1024 + 7])
def test_digests_equal_hashlib(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    monkeypatch.setattr(shardspec.format.integrity, "_CHUNK", 1024)  # several chunks
    data = bytes(i * 7 % 251 for i in range(size))
    seen: list[int] = []
    digests, total = digest_stream(io.BytesIO(data), ("sha256", "blake2b"), seen.append)
    assert total == size and sum(seen) == size
    assert digests == {"sha256": hashlib.sha256(data).hexdigest(),
                       "blake2b": hashlib.blake2b(data).hexdigest()}


def test_sha256_is_mandatory_and_blake2b_is_512_bit() -> None:
    assert "sha256" in ALGORITHMS
    assert len(digest_stream(io.BytesIO(b"x"), ("blake2b",))[0]["blake2b"]) == 128


def test_digest_reads_from_the_current_position() -> None:
    handle = io.BytesIO(b"headerpayload")
    handle.seek(6)
    assert digest_stream(handle)[0]["sha256"] == hashlib.sha256(b"payload").hexdigest()


def test_digest_stream_stops_cleanly_when_progress_raises(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_bytes(b"x" * (40 * 1024 * 1024))

    def progress(count: int) -> None:
        raise KeyboardInterrupt

    before = threading.active_count()
    with path.open("rb") as handle, pytest.raises(KeyboardInterrupt):
        digest_stream(handle, progress=progress)
    assert threading.active_count() == before  # the reader thread is gone


def test_digest_stream_matches_hashlib_over_many_chunks(tmp_path: Path) -> None:
    data = bytes(range(256)) * (150 * 1024)  # 37.5 MiB: three chunks, the last partial
    path = tmp_path / "f"
    path.write_bytes(data)
    with path.open("rb") as handle:
        digests, total = digest_stream(handle, ("sha256", "blake2b"))
    assert total == len(data)
    assert digests == {"sha256": hashlib.sha256(data).hexdigest(),
                       "blake2b": hashlib.blake2b(data).hexdigest()}
