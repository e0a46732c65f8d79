"""Copying loads read what the page cache does not hold around it (shardspec.load.host_reads):
the same bytes as through the cache, chosen by where the bytes are, and no way to read another
file than the one opened."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import torch

import shardspec
import shardspec.load.execute
import shardspec.load.host_reads as host_reads
import shardspec.load.staging
from checkpoints import evict, raw_bytes, write_handmade
from fake_engine import FakeEngine
from shardspec.format.errors import SafetensorsError
from shardspec.load.host_memory import PAGE_BYTES, fresh_buffer
from shardspec.load.reads import open_direct, page_cache_share, pread_direct

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="direct reads and RWF_NOWAIT are Linux's")


def _write(path: Path, payload: bytes) -> Path:
    path.write_bytes(payload)
    evict(path)
    return path


# The eight probes of a 1 MiB region land at the midpoints of its eighths: 64 KiB, 192 KiB, ...
PROBED = [(2 * i + 1) * (1 << 20) // 16 for i in range(8)]


def test_the_page_cache_probe_tells_a_read_file_from_an_evicted_one(tmp_path: Path) -> None:
    path = _write(tmp_path / "data", os.urandom(1 << 20))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert page_cache_share(fd, 0, 1 << 20, samples=8) == 0.0
        os.pread(fd, 1 << 20, 0)
        assert page_cache_share(fd, 0, 1 << 20, samples=8) == 1.0
        evict(path, PROBED[3], PAGE_BYTES)
        assert page_cache_share(fd, 0, 1 << 20, samples=8) == 7 / 8
        assert page_cache_share(fd, 0, 0, samples=8) is None  # nothing to probe
    finally:
        os.close(fd)


def test_a_file_the_cache_mostly_holds_is_read_through_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pages go missing from a warm file (reclaim, readahead marks): reading it all from the
    # device for that took up to twice as long (benchmarks/README.md).
    monkeypatch.setattr(host_reads, "DIRECT_MIN_BYTES", 1)
    path = _write(tmp_path / "data", os.urandom(1 << 20))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.pread(fd, 1 << 20, 0)
        for position in PROBED[:3]:
            evict(path, position, PAGE_BYTES)
        assert host_reads.direct_descriptor(fd, 0, 1 << 20) is None  # 5 of 8 probes held
        evict(path)
        direct = host_reads.direct_descriptor(fd, 0, 1 << 20)
        assert direct is not None
        os.close(direct)
    finally:
        os.close(fd)


def test_a_direct_descriptor_is_the_opened_file_even_after_its_path_is_replaced(
    tmp_path: Path
) -> None:
    path = _write(tmp_path / "data", b"A" * 8192)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.replace(_write(tmp_path / "other", b"B" * 8192), path)  # the path, not the file
        direct = open_direct(fd)
        assert direct is not None
        try:
            buffer = fresh_buffer(PAGE_BYTES, page_aligned=True)
            assert os.preadv(direct, [memoryview(buffer.numpy())], 0) == PAGE_BYTES
            assert bytes(buffer.numpy()) == b"A" * PAGE_BYTES
            assert os.fstat(direct).st_ino == os.fstat(fd).st_ino
        finally:
            os.close(direct)
    finally:
        os.close(fd)


@pytest.mark.parametrize("chunk_pages", [1, 3, 64])
@pytest.mark.parametrize("tail", [0, 1, 4095, 4097])
def test_direct_reads_fill_every_byte_up_to_the_file_end(
    tmp_path: Path, chunk_pages: int, tail: int
) -> None:
    payload = os.urandom(20 * PAGE_BYTES + tail)
    path = _write(tmp_path / "data", payload)
    fd = os.open(path, os.O_RDONLY)
    direct = open_direct(fd)
    assert direct is not None
    try:
        pages = -(-len(payload) // PAGE_BYTES)
        buffer = fresh_buffer(pages * PAGE_BYTES, page_aligned=True)
        pread_direct(direct, fd, memoryview(buffer.numpy()), 0, len(payload), "data",
                     threads=4, chunk=chunk_pages * PAGE_BYTES)
    finally:
        os.close(direct)
        os.close(fd)
    assert bytes(buffer.numpy()[: len(payload)]) == payload


def test_a_read_the_device_refuses_is_made_through_the_cache_instead(tmp_path: Path) -> None:
    # A view one byte off a page: the kernel refuses the direct read (EINVAL).
    payload = os.urandom(10 * PAGE_BYTES)
    path = _write(tmp_path / "data", payload)
    fd = os.open(path, os.O_RDONLY)
    direct = open_direct(fd)
    assert direct is not None
    try:
        spare = fresh_buffer(11 * PAGE_BYTES, page_aligned=True)
        view = memoryview(spare.numpy())[1 : 1 + 10 * PAGE_BYTES]
        with pytest.raises(OSError):
            os.preadv(direct, [view[:PAGE_BYTES]], 0)
        pread_direct(direct, fd, view, 0, len(payload), "data", threads=2, chunk=4 * PAGE_BYTES)
    finally:
        os.close(direct)
        os.close(fd)
    assert bytes(view) == payload


def test_a_file_that_ends_before_its_region_is_an_error_not_zeros(tmp_path: Path) -> None:
    path = _write(tmp_path / "short", os.urandom(3 * PAGE_BYTES))
    fd = os.open(path, os.O_RDONLY)
    direct = open_direct(fd)
    assert direct is not None
    try:
        buffer = fresh_buffer(8 * PAGE_BYTES, page_aligned=True)
        with pytest.raises(SafetensorsError, match="ended early") as info:
            pread_direct(direct, fd, memoryview(buffer.numpy()), 0, 8 * PAGE_BYTES, "short",
                         threads=2, chunk=PAGE_BYTES)
    finally:
        os.close(direct)
        os.close(fd)
    assert info.value.finding.file == "short"


@pytest.fixture
def small_direct_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Direct reads for any region and in page-sized requests; counts the direct reads made."""
    monkeypatch.setattr(host_reads, "DIRECT_MIN_BYTES", 1)
    monkeypatch.setattr(host_reads, "DIRECT_CHUNK_BYTES", PAGE_BYTES)
    calls: list[int] = []

    def counted(*args: object, **kwargs: object) -> int:
        calls.append(1)
        return pread_direct(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(host_reads, "pread_direct", counted)
    return calls


def _checkpoint(root: Path) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    # Megabytes, so the header's readahead does not bring the whole file into the cache.
    tensors = {f"w{i}": torch.randn(1021, 517 + i, generator=gen).to(torch.bfloat16)
               for i in range(5)}
    tensors["ids"] = torch.randint(-2**62, 2**62, (333,), dtype=torch.int64, generator=gen)
    shardspec.save({0: tensors}, root, layout=shardspec.Layout(tp_size=1))
    return tensors


def test_a_cold_load_reads_directly_and_a_warm_one_through_the_cache_bit_exact(
    tmp_path: Path, small_direct_reads: list[int]
) -> None:
    tensors = _checkpoint(tmp_path / "ckpt")
    checkpoint = shardspec.open(tmp_path / "ckpt")
    (data_file,) = checkpoint.rank_files(0)
    for cache in ("cold", "warm"):
        if cache == "cold":
            evict(data_file)
        else:  # a direct read leaves nothing in the cache: the file is read through it first
            data_file.read_bytes()
        small_direct_reads.clear()
        loaded = checkpoint.load_rank(0, "cpu")
        assert len(small_direct_reads) == (1 if cache == "cold" else 0), cache
        assert set(loaded) == set(tensors)
        for name, tensor in tensors.items():
            assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name


def test_unaligned_tensor_offsets_read_directly_load_bit_exact(
    tmp_path: Path, small_direct_reads: list[int]
) -> None:
    tensors = {
        "byte": ("U8", [1], b"\x07"),
        "f32": ("F32", [3], bytes(range(12))),
        "f64": ("F64", [2], bytes(range(100, 116))),
        "big": ("BF16", [2_000_000], os.urandom(4_000_000)),  # past the header's readahead
    }
    root = write_handmade(tmp_path / "c", tensors)  # header not padded: data_start is odd
    for path in root.glob("*.safetensors"):
        evict(path)
    loaded = shardspec.load_rank(root, 0, "cpu")
    assert small_direct_reads == [1]
    for name, (_, _, payload) in tensors.items():
        assert raw_bytes(loaded[name]) == payload


@pytest.mark.parametrize(("setting", "expected"), [("", True), ("1", True), ("0", False),
                                                   ("off", False), ("No", False)])
def test_the_direct_reads_setting(monkeypatch: pytest.MonkeyPatch, setting: str,
                                  expected: bool) -> None:
    monkeypatch.setenv("SHARDSPEC_DIRECT_READS", setting)
    assert host_reads._direct_reads_setting() is expected


def _without_nowait(monkeypatch: pytest.MonkeyPatch) -> None:
    preadv = os.preadv

    def no_nowait(fd: int, buffers: list[memoryview], offset: int, flags: int = 0) -> int:
        if flags:  # a file system without RWF_NOWAIT
            raise OSError(95, "Operation not supported")
        return preadv(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", no_nowait)


@pytest.mark.parametrize("why", ["turned off", "no RWF_NOWAIT", "no direct open"])
def test_a_cold_load_without_direct_reads_goes_through_the_cache_bit_exact(
    tmp_path: Path, small_direct_reads: list[int], monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    tensors = _checkpoint(tmp_path / "ckpt")
    checkpoint = shardspec.open(tmp_path / "ckpt")
    evict(checkpoint.rank_files(0)[0])
    if why == "turned off":
        monkeypatch.setattr(host_reads, "DIRECT_READS", False)
    elif why == "no RWF_NOWAIT":  # the kernel cannot say what is cached
        _without_nowait(monkeypatch)
    else:  # e.g. no /proc
        monkeypatch.setattr(host_reads, "open_direct", lambda fd: None)
    loaded = checkpoint.load_rank(0, "cpu")
    assert small_direct_reads == []
    assert all(torch.equal(loaded[name], tensor) for name, tensor in tensors.items())


def test_a_cold_staged_load_reads_each_chunk_directly_into_staging_bit_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CUDA path's pipeline, through a CPU copy engine whose staging memory is page-aligned
    # as pinned memory is; digests checked (verify=True) on the bytes in file order.
    tensors = _checkpoint(tmp_path / "ckpt")
    checkpoint = shardspec.open(tmp_path / "ckpt")
    monkeypatch.setattr(host_reads, "DIRECT_MIN_BYTES", 1)
    monkeypatch.setattr(shardspec.load.execute, "CHUNK_BYTES", 16 * PAGE_BYTES)
    spans: list[int] = []
    span = shardspec.load.staging.pread_direct_span

    def counted(*args: object) -> int:
        spans.append(1)
        return span(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(shardspec.load.staging, "pread_direct_span", counted)
    for cache in ("cold", "warm"):
        (data_file,) = checkpoint.rank_files(0)
        evict(data_file) if cache == "cold" else data_file.read_bytes()
        spans.clear()
        loaded = shardspec.load.execute.execute_plan(
            tmp_path / "ckpt", checkpoint.plan(0), torch.device("cpu"), verify=True,
            engine=FakeEngine(page_aligned=True))
        assert (len(spans) > 1) if cache == "cold" else not spans, cache
        for name, tensor in tensors.items():
            assert torch.equal(loaded[name], tensor), (cache, name)


def _advised_for_huge_pages(address: int) -> bool:
    smaps = Path("/proc/self/smaps").read_text().splitlines()
    for index, line in enumerate(smaps):
        span = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if span and int(span[1], 16) <= address < int(span[2], 16):
            flags = next(entry for entry in smaps[index + 1 :] if entry.startswith("VmFlags:"))
            return " hg" in flags
    pytest.fail("the buffer's mapping is not in /proc/self/smaps")


@pytest.mark.parametrize("huge", [True, False])
def test_buffers_filled_by_direct_reads_are_advised_for_huge_pages(
    tmp_path: Path, small_direct_reads: list[int], monkeypatch: pytest.MonkeyPatch, huge: bool
) -> None:
    monkeypatch.setattr(host_reads, "DIRECT_HUGE_PAGES", huge)
    tensors = _checkpoint(tmp_path / "ckpt")  # over 2 MiB: eligible
    checkpoint = shardspec.open(tmp_path / "ckpt")
    evict(checkpoint.rank_files(0)[0])
    loaded = checkpoint.load_rank(0, "cpu")
    assert small_direct_reads == [1]
    assert _advised_for_huge_pages(loaded["w0"].data_ptr()) is huge
    assert all(torch.equal(loaded[name], tensor) for name, tensor in tensors.items())
