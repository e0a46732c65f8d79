"""SPEC 11.2 on a real CUDA device (skipped where there is none)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import shardspec
from checkpoints import Tiny, assert_same_tensor

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_load_rank_places_tensors_on_the_device_bit_exact(tiny: Tiny) -> None:
    for rank in range(2):
        loaded = shardspec.load_rank(tiny.path, rank, "cuda:0", verify=True)
        assert set(loaded) == set(tiny.expected[rank])
        for name, tensor in tiny.expected[rank].items():
            assert loaded[name].device == torch.device("cuda", 0)
            assert_same_tensor(loaded[name], tensor)
        assert loaded["lm_head.weight"].data_ptr() == loaded["model.embed_tokens.weight"].data_ptr()


def test_default_device_is_cuda_local_rank(tiny: Tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    local_rank = torch.cuda.device_count() - 1
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    loaded = shardspec.load_rank(tiny.path, 1)
    assert {t.device for t in loaded.values()} == {torch.device("cuda", local_rank)}


def test_large_file_streams_through_the_staging_buffers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shardspec.load.execute

    monkeypatch.setattr(shardspec.load.execute, "CHUNK_BYTES", 1 << 16)  # many chunks, both buffers
    tensor = torch.randint(0, 256, (1 << 20,), dtype=torch.uint8)
    shardspec.save({0: {"t": tensor, "odd": torch.arange(7, dtype=torch.int16)}},
                   tmp_path / "c", layout=shardspec.Layout(tp_size=1))
    loaded = shardspec.load_rank(tmp_path / "c", 0, "cuda:0", verify=True)
    assert torch.equal(loaded["t"].cpu(), tensor)
    assert loaded["odd"].cpu().tolist() == list(range(7))


@pytest.mark.parametrize("buffers,readers", [(2, 1), (3, 2), (4, 4)])
def test_cuda_load_equals_cpu_load_moved_bit_for_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, buffers: int, readers: int
) -> None:
    import shardspec.load.execute

    monkeypatch.setattr(shardspec.load.execute, "CHUNK_BYTES", 1 << 16)
    monkeypatch.setattr(shardspec.load.execute, "STAGING_BUFFERS", buffers)
    monkeypatch.setattr(shardspec.load.execute, "STAGING_READERS", readers)
    gen = torch.Generator().manual_seed(3)
    state = {
        "a": torch.randint(-(2**15), 2**15, (777, 129), dtype=torch.int16, generator=gen)
        .view(torch.bfloat16),
        "b": torch.randint(0, 256, (3 << 16,), dtype=torch.uint8, generator=gen),
        "c": torch.arange(5, dtype=torch.int8),
    }
    shardspec.save({0: state}, tmp_path / "c", layout=shardspec.Layout(tp_size=1))
    on_cpu = shardspec.load_rank(tmp_path / "c", 0, "cpu")
    on_gpu = shardspec.load_rank(tmp_path / "c", 0, "cuda:0", verify=True)
    for name, tensor in on_cpu.items():
        assert on_gpu[name].device.type == "cuda"
        assert_same_tensor(on_gpu[name].cpu(), tensor)


def test_a_cold_load_reads_chunks_directly_into_pinned_staging_bit_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The path tests/load/test_direct_reads.py drives through a CPU copy engine, on the real one:
    # O_DIRECT reads into pinned buffers, then host-to-device copies, digests checked.
    import os

    import shardspec.load.execute
    import shardspec.load.staging
    from shardspec.load import host_reads
    from shardspec.load.host_memory import PAGE_BYTES
    from shardspec.load.reads import open_direct

    gen = torch.Generator().manual_seed(5)
    state = {"w": torch.randint(0, 256, (3 << 20,), dtype=torch.uint8, generator=gen),
             "odd": torch.arange(7, dtype=torch.int16)}
    shardspec.save({0: state}, tmp_path / "c", layout=shardspec.Layout(tp_size=1))
    (data_file,) = shardspec.open(tmp_path / "c").rank_files(0)
    fd = os.open(data_file, os.O_RDONLY)
    try:
        direct = open_direct(fd)
        if direct is None:
            pytest.skip(f"{tmp_path} does not open for direct I/O")
        os.close(direct)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    monkeypatch.setattr(host_reads, "DIRECT_MIN_BYTES", 1)
    monkeypatch.setattr(shardspec.load.execute, "CHUNK_BYTES", 64 * PAGE_BYTES)
    spans: list[int] = []
    span = shardspec.load.staging.pread_direct_span
    monkeypatch.setattr(shardspec.load.staging, "pread_direct_span",
                        lambda *args: spans.append(1) or span(*args))
    loaded = shardspec.load_rank(tmp_path / "c", 0, "cuda:0", verify=True)
    assert len(spans) > 1
    for name, tensor in state.items():
        assert loaded[name].device == torch.device("cuda", 0)
        assert_same_tensor(loaded[name].cpu(), tensor)
