"""SPEC 9.2: streamed digests equal hashlib's over the whole file."""

from __future__ import annotations

import hashlib
import io

import pytest

import shardspec.integrity
from shardspec.integrity import ALGORITHMS, digest_stream


@pytest.mark.parametrize("size", [0, 1, 1000, 3 * 1024 + 7])
def test_digests_equal_hashlib(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    monkeypatch.setattr(shardspec.integrity, "_CHUNK", 1024)  # several chunks
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
