"""Loading modes (shardspec.load.execute, shardspec.load.host_memory): copy, mmap and staged, same
bytes."""

from __future__ import annotations

import gc
import hashlib
import mmap
import re
import sys
from pathlib import Path

import pytest
import torch

import shardspec
import shardspec.load.host_memory
import shardspec.reader
from checkpoints import Tiny, assert_same_tensor, raw_bytes, sha256_file, write_handmade
from fake_engine import FakeEngine
from shardspec.load.execute import execute_plan
from shardspec.load.host_memory import HUGE_PAGE_BYTES, PAGE_BYTES, fresh_buffer, prefault


def _load(tiny: Tiny, rank: int, mode: str) -> dict[str, torch.Tensor]:
    checkpoint = shardspec.open(tiny.path)
    if mode == "staged":  # the CUDA path's pipeline, through a CPU copy engine
        return execute_plan(tiny.path, checkpoint.plan(rank), torch.device("cpu"),
                            verify=True, engine=FakeEngine())
    return checkpoint.load_rank(rank, "cpu", verify=True, mmap=mode == "mmap")


@pytest.mark.parametrize("mode", ["copy", "copy-huge-pages", "mmap", "staged"])
def test_every_mode_returns_the_same_tensors_bit_exact(
    tiny: Tiny, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shardspec.load.host_memory, "USE_HUGE_PAGES", mode == "copy-huge-pages")
    for rank in range(2):
        loaded = _load(tiny, rank, mode)
        assert set(loaded) == set(tiny.expected[rank])
        for name, tensor in tiny.expected[rank].items():
            assert_same_tensor(loaded[name], tensor)
        assert loaded["lm_head.weight"] is loaded["model.embed_tokens.weight"]


@pytest.mark.parametrize("mmap", [False, True])
def test_unaligned_offsets_load_bit_exact_in_both_cpu_modes(tmp_path: Path, mmap: bool) -> None:
    tensors = {
        "byte": ("U8", [1], b"\x07"),
        "f32": ("F32", [3], bytes(range(12))),
        "f64": ("F64", [2], bytes(range(100, 116))),
        "bf16": ("BF16", [1, 3], bytes(range(200, 206))),
    }
    root = write_handmade(tmp_path / "c", tensors)  # header not padded: data_start is odd
    loaded = shardspec.load_rank(root, 0, "cpu", mmap=mmap)
    for name, (_, _, payload) in tensors.items():
        assert raw_bytes(loaded[name]) == payload


def test_mmap_tensors_are_copy_on_write(tiny: Tiny) -> None:
    path = tiny.data_file(0)
    before = sha256_file(path)
    loaded = shardspec.load_rank(tiny.path, 0, "cpu", mmap=True)
    loaded["layers.0.row.weight"].fill_(7.0)
    assert sha256_file(path) == before
    again = shardspec.load_rank(tiny.path, 0, "cpu", mmap=True)
    assert_same_tensor(again["layers.0.row.weight"], tiny.expected[0]["layers.0.row.weight"])


def test_mmap_tensors_outlive_the_checkpoint_and_its_file_handles(tiny: Tiny) -> None:
    loaded = shardspec.open(tiny.path).load_rank(1, "cpu", mmap=True)
    gc.collect()
    tiny.data_file(1).unlink()  # the mapping holds the data, as an open file would
    for name, tensor in tiny.expected[1].items():
        assert_same_tensor(loaded[name], tensor)


def test_mmap_with_verify_refuses_a_changed_file(tiny: Tiny) -> None:
    path = tiny.data_file(0)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(shardspec.IntegrityError) as info:
        shardspec.load_rank(tiny.path, 0, "cpu", verify=True, mmap=True)
    assert info.value.code == "checksum-mismatch"


def test_mmap_needs_a_cpu_device(tiny: Tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shardspec.reader, "resolve_device", lambda _: torch.device("cuda", 0))
    with pytest.raises(shardspec.RequestError) as info:
        shardspec.load_rank(tiny.path, 0, mmap=True)
    assert info.value.code == "device-invalid" and "mmap" in info.value.finding.message


def test_mmap_cannot_be_combined_with_resharding(tiny: Tiny) -> None:
    with pytest.raises(ValueError, match="resharding"):
        shardspec.load_rank(tiny.path, 0, "cpu", mmap=True, layout=shardspec.Layout(tp_size=1))


def test_copy_mode_tensors_do_not_see_later_changes_to_the_file(tiny: Tiny) -> None:
    loaded = shardspec.load_rank(tiny.path, 0, "cpu")
    tiny.data_file(0).write_bytes(b"\0" * tiny.data_file(0).stat().st_size)
    assert_same_tensor(loaded["layers.0.col.weight"], tiny.expected[0]["layers.0.col.weight"])


@pytest.mark.parametrize("huge_pages", [False, True])
@pytest.mark.parametrize("nbytes", [0, 1, 4097, HUGE_PAGE_BYTES, 3 * HUGE_PAGE_BYTES + 5])
def test_fresh_buffer_is_writable_memory_of_the_exact_size(
    nbytes: int, huge_pages: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shardspec.load.host_memory, "USE_HUGE_PAGES", huge_pages)
    buffer = fresh_buffer(nbytes)
    assert buffer.dtype == torch.uint8 and buffer.shape == (nbytes,)
    pattern = torch.arange(nbytes, dtype=torch.int64).remainder_(251).to(torch.uint8)
    buffer.copy_(pattern)
    view = buffer[nbytes // 2 :]
    del buffer
    gc.collect()  # the view keeps the mapping alive
    assert torch.equal(view, pattern[nbytes // 2 :])


def _resident_pages(address: int, nbytes: int) -> list[bool]:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    flags = (ctypes.c_ubyte * (nbytes // PAGE_BYTES))()
    assert libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(nbytes), flags) == 0
    return [bool(flag & 1) for flag in flags]


@pytest.mark.skipif(sys.platform != "linux", reason="MADV_POPULATE_WRITE is Linux's")
def test_prefault_makes_untouched_pages_resident_without_changing_a_byte() -> None:
    pages = 64
    memory = mmap.mmap(-1, pages * PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buffer = torch.frombuffer(memory, dtype=torch.uint8)
    buffer[: 3 * PAGE_BYTES].fill_(7)  # written before: kept
    assert _resident_pages(buffer.data_ptr(), pages * PAGE_BYTES)[3:] == [False] * (pages - 3)
    # A range that starts and ends inside pages: the pages it touches are faulted in.
    if not prefault(buffer.data_ptr() + 2 * PAGE_BYTES + 100, 10 * PAGE_BYTES):
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (before Linux 5.14)")
    resident = _resident_pages(buffer.data_ptr(), pages * PAGE_BYTES)
    assert resident[:13] == [True] * 13 and resident[13:] == [False] * (pages - 13)
    assert bool((buffer[: 3 * PAGE_BYTES] == 7).all())
    assert not buffer[3 * PAGE_BYTES :].any()
    assert not prefault(buffer.data_ptr(), 0)


def _thp_mode() -> str | None:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    found = re.search(r"\[(\w+)\]", text)
    return found[1] if found else None


@pytest.mark.skipif(_thp_mode() not in ("madvise", "always"),
                    reason="needs Linux transparent huge pages in madvise or always mode")
def test_large_fresh_buffers_are_eligible_for_huge_pages_when_enabled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shardspec.load.host_memory, "USE_HUGE_PAGES", True)
    buffer = fresh_buffer(8 * HUGE_PAGE_BYTES)
    start = buffer.data_ptr()
    smaps = Path("/proc/self/smaps").read_text().splitlines()
    for index, line in enumerate(smaps):
        span = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if span and int(span[1], 16) <= start < int(span[2], 16):
            fields = dict(
                entry.split(":", 1) for entry in smaps[index + 1 : index + 30]
                if re.match(r"^[A-Za-z_]+:", entry))
            assert fields["THPeligible"].strip() == "1"
            return
    pytest.fail("the buffer's mapping is not in /proc/self/smaps")


def test_staged_load_verifies_checksums(tiny: Tiny) -> None:
    path = tiny.data_file(1)
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x01
    path.write_bytes(bytes(data))
    checkpoint = shardspec.open(tiny.path)
    with pytest.raises(shardspec.IntegrityError) as info:
        execute_plan(tiny.path, checkpoint.plan(1), torch.device("cpu"), verify=True,
                     engine=FakeEngine())
    assert info.value.code == "checksum-mismatch"
    assert hashlib.sha256(bytes(data)).hexdigest() != checkpoint.manifest.ranks[1].files[0] \
        .checksums["sha256"]
