"""Copying loads read a file's data region with several threads: bytes exact, failures clear."""

from __future__ import annotations

import os

import pytest
import torch

import shardspec
import shardspec.load.execute
from shardspec.format.errors import SafetensorsError
from shardspec.load.reads import pread_parallel


@pytest.mark.parametrize("threads", [1, 2, 5])
@pytest.mark.parametrize("chunk", [1, 4096, 10_000, 1 << 20])
def test_every_byte_lands_in_place(tmp_path, threads, chunk):
    payload = os.urandom(123_457)
    path = tmp_path / "data"
    path.write_bytes(b"head" + payload)
    out = bytearray(len(payload))
    fd = os.open(path, os.O_RDONLY)
    try:
        calls = pread_parallel(fd, memoryview(out), 4, "data", threads=threads, chunk=chunk)
    finally:
        os.close(fd)
    assert bytes(out) == payload
    assert calls >= -(-len(payload) // chunk)


def test_a_file_shorter_than_its_region_is_an_error_not_zeros(tmp_path):
    path = tmp_path / "short"
    path.write_bytes(b"x" * 10_000)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(SafetensorsError, match="ended early") as info:
            pread_parallel(fd, memoryview(bytearray(50_000)), 0, "short", threads=3, chunk=4096)
    finally:
        os.close(fd)
    assert info.value.finding.file == "short"


def test_load_rank_is_bit_exact_with_many_threads_and_small_spans(tmp_path, monkeypatch):
    gen = torch.Generator().manual_seed(7)
    tensors = {f"t{i}": torch.randint(-2**15, 2**15, (257, 33), dtype=torch.int16, generator=gen)
               for i in range(6)}
    tensors["odd"] = torch.randint(0, 255, (1001,), dtype=torch.uint8, generator=gen)
    shardspec.save({0: tensors}, tmp_path / "ckpt", layout=shardspec.Layout(tp_size=1))
    monkeypatch.setattr(shardspec.load.execute, "READ_CHUNK_BYTES", 4096)
    for threads in (1, 4):
        monkeypatch.setattr(shardspec.load.execute, "READ_THREADS", threads)
        loaded = shardspec.open(tmp_path / "ckpt").load_rank(0, "cpu")
        assert set(loaded) == set(tensors)
        for name, tensor in tensors.items():
            assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name


@pytest.mark.parametrize(("setting", "expected"), [("3", 3), ("12", 12), ("0", None),
                                                   ("-2", None), ("many", None), ("", None)])
def test_read_threads_setting_takes_positive_integers_only(monkeypatch, setting, expected):
    monkeypatch.setenv("SHARDSPEC_READ_THREADS", setting)
    threads = shardspec.load.execute._read_threads()
    if expected is None:  # the default: the usable cores, at most 8
        assert 1 <= threads <= 8
        monkeypatch.delenv("SHARDSPEC_READ_THREADS")
        assert threads == shardspec.load.execute._read_threads()
    else:
        assert threads == expected


@pytest.mark.parametrize("count", [2, 3, 511, 1022, 1023, 3000])
@pytest.mark.parametrize(("length", "gap"), [(7, 0), (1024, 0), (5, 3), (64, 100)])
def test_strided_runs_land_in_place_through_libc_and_without(tmp_path, count, length, gap):
    """pread_runs: the i-th run of the file (every ``length + gap`` bytes) lands at byte
    ``dst + i * dst_stride`` of the target, gaps read into the scratch buffer, in calls of at
    most IOV_MAX vectors; the pure-Python path gives the same bytes."""
    import numpy as np

    from shardspec.load import reads

    payload = np.frombuffer(os.urandom(8 + count * (length + gap)), dtype=np.uint8)
    path = tmp_path / "data"
    path.write_bytes(payload.tobytes())
    dst, dst_stride = 3, length + 11
    want = np.zeros(dst + count * dst_stride, dtype=np.uint8)
    for i in range(count):
        start = 8 + i * (length + gap)
        want[dst + i * dst_stride : dst + i * dst_stride + length] = payload[start : start + length]
    fd = os.open(path, os.O_RDONLY)
    try:
        for read in (reads.pread_runs, reads._pread_runs_slowly):
            got = np.zeros_like(want)
            calls = read(fd, got, dst, dst_stride, length, count, 8, length + gap, "data",
                         np.empty(128, dtype=np.uint8))
            assert np.array_equal(got, want), read.__name__
            assert calls >= -(-count * (2 if gap else 1) // reads.IOV_MAX)
    finally:
        os.close(fd)
