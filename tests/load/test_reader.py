"""SPEC 6-9 and 11.1: opening a checkpoint and loading one rank, refusing what is wrong."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

import shardspec
import shardspec.load.execute
from checkpoints import (
    Tiny,
    assert_same_tensor,
    raw_bytes,
    refresh_record,
    rewrite_manifest,
    sha256_file,
    write_handmade,
)
from shardspec.format.errors import ShardspecError


def rank0_state(tiny: Tiny) -> dict[str, torch.Tensor]:
    """Rank 0's stored tensors (no alias), ready to be written again."""
    state = shardspec.load_rank(tiny.path, 0, "cpu")
    del state["lm_head.weight"]
    return {k: v.clone() for k, v in state.items()}


def rewrite_data_file(tiny: Tiny, state: dict[str, torch.Tensor]) -> str:
    """Replace rank 0's data file and make the manifest's size and digest match it."""
    name = tiny.manifest.ranks[0].files[0].path
    save_file(state, str(tiny.path / name), metadata={"format": "pt"})
    refresh_record(tiny.path, name)
    return name


def test_open_reads_only_the_manifest(tiny: Tiny) -> None:
    for rank in tiny.manifest.ranks:
        for record in rank.files:
            (tiny.path / record.path).unlink()
    checkpoint = shardspec.open(tiny.path)
    assert checkpoint.world_size == 2 and checkpoint.layout.tp_size == 2
    assert checkpoint.manifest == tiny.manifest
    assert "tp=2" in repr(checkpoint)


def test_load_rank_opens_only_that_ranks_files(
    tiny: Tiny, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[str] = []
    real_open_inside = shardspec.load.execute.open_inside

    def recording(root: Path, relative: str) -> Any:
        opened.append(relative)
        return real_open_inside(root, relative)

    monkeypatch.setattr(shardspec.load.execute, "open_inside", recording)
    shardspec.load_rank(tiny.path, 1, "cpu")
    assert opened == ["model-rank-1-part-0.safetensors"]


def test_load_rank_works_with_other_ranks_files_deleted(tiny: Tiny) -> None:
    tiny.data_file(0).unlink()
    loaded = shardspec.load_rank(tiny.path, 1, "cpu", verify=True)
    for name, tensor in tiny.expected[1].items():
        assert_same_tensor(loaded[name], tensor)
    with pytest.raises(shardspec.PathError):
        shardspec.load_rank(tiny.path, 0, "cpu")


def test_rank_files_lists_only_that_rank(tiny: Tiny) -> None:
    checkpoint = shardspec.open(tiny.path)
    assert checkpoint.rank_files(1) == [tiny.data_file(1)]


def test_global_pieces_replicas_and_rank_local_tensors_load(tiny: Tiny) -> None:
    loaded = {r: shardspec.load_rank(tiny.path, r, "cpu") for r in range(2)}
    assert loaded[0]["layers.0.col.weight"].shape == (4, 4)
    assert loaded[1]["layers.0.row.weight"].shape == (4, 3)
    assert loaded[0]["layers.0.qkv.weight"].shape == (3, 4)
    assert loaded[1]["layers.0.qkv.weight"].shape == (4, 4)
    assert_same_tensor(loaded[0]["layers.0.norm.weight"], loaded[1]["layers.0.norm.weight"])
    assert loaded[0]["step"].shape == () and loaded[0]["step"].item() == 3.5
    assert loaded[1]["empty"].shape == (0, 4) and loaded[1]["empty"].dtype == torch.float16


def test_missing_data_file(tiny: Tiny) -> None:
    tiny.data_file(0).unlink()
    with pytest.raises(shardspec.PathError) as info:
        shardspec.load_rank(tiny.path, 0, "cpu")
    assert info.value.code == "file-missing"


def test_truncated_data_file(tiny: Tiny) -> None:
    path = tiny.data_file(1)
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(shardspec.IntegrityError) as info:
        shardspec.load_rank(tiny.path, 1, "cpu")
    assert info.value.code == "file-size" and info.value.section == "9.1"


def test_same_size_replacement_is_caught_by_verify(tiny: Tiny) -> None:
    state = rank0_state(tiny)
    state["layers.0.row.weight"] = state["layers.0.row.weight"] + 1
    name = tiny.manifest.ranks[0].files[0].path
    before = (tiny.path / name).stat().st_size
    save_file(state, str(tiny.path / name), metadata={"format": "pt"})
    assert (tiny.path / name).stat().st_size == before
    with pytest.raises(shardspec.IntegrityError) as info:
        shardspec.load_rank(tiny.path, 0, "cpu", verify=True)
    assert info.value.code == "checksum-mismatch"
    assert name in str(info.value)
    # without verify the reader checks structure only, and the structure is sound
    loaded = shardspec.load_rank(tiny.path, 0, "cpu")
    assert_same_tensor(loaded["layers.0.row.weight"], state["layers.0.row.weight"])


def test_verify_passes_on_an_intact_checkpoint(tiny: Tiny) -> None:
    loaded = shardspec.load_rank(tiny.path, 0, "cpu", verify=True)
    assert set(loaded) == set(tiny.expected[0])


def test_header_dtype_disagreeing_with_the_manifest(tiny: Tiny) -> None:
    state = rank0_state(tiny)
    state["layers.0.col.weight"] = state["layers.0.col.weight"].float()
    rewrite_data_file(tiny, state)
    with pytest.raises(shardspec.SafetensorsError) as info:
        shardspec.load_rank(tiny.path, 0, "cpu")
    assert info.value.code == "st-mismatch"
    assert info.value.finding.tensor == "layers.0.col.weight"


def test_header_shape_disagreeing_with_the_manifest(tiny: Tiny) -> None:
    state = rank0_state(tiny)
    state["layers.0.qkv.weight"] = state["layers.0.qkv.weight"].reshape(4, 3)
    rewrite_data_file(tiny, state)
    with pytest.raises(shardspec.SafetensorsError) as info:
        shardspec.load_rank(tiny.path, 0, "cpu")
    assert info.value.code == "st-mismatch"


def test_header_missing_a_tensor(tiny: Tiny) -> None:
    state = rank0_state(tiny)
    del state["step"]
    rewrite_data_file(tiny, state)
    with pytest.raises(shardspec.SafetensorsError) as info:
        shardspec.load_rank(tiny.path, 0, "cpu")
    assert info.value.code == "st-missing-tensor" and info.value.finding.tensor == "step"


def test_header_with_an_extra_tensor(tiny: Tiny) -> None:
    state = rank0_state(tiny)
    state["bonus"] = torch.ones(1)
    rewrite_data_file(tiny, state)
    with pytest.raises(shardspec.SafetensorsError) as info:
        shardspec.load_rank(tiny.path, 0, "cpu")
    assert info.value.code == "st-extra-tensor" and info.value.finding.tensor == "bonus"


def test_broken_container_is_refused(tiny: Tiny) -> None:
    path = tiny.data_file(0)
    raw = bytearray(path.read_bytes())
    raw[8] = ord("[")
    path.write_bytes(bytes(raw))
    with pytest.raises(shardspec.SafetensorsError) as info:
        shardspec.load_rank(tiny.path, 0, "cpu")
    assert info.value.code == "st-header-json"


def test_data_file_symlinked_outside_is_refused(tiny: Tiny, tmp_path: Path) -> None:
    path = tiny.data_file(0)
    outside = tmp_path / "outside.safetensors"
    path.rename(outside)
    os.symlink(outside, path)
    with pytest.raises(shardspec.PathError) as info:
        shardspec.load_rank(tiny.path, 0, "cpu")
    assert info.value.code == "path-escapes"


def test_expect_quantization(tiny: Tiny) -> None:
    assert shardspec.load_rank(tiny.path, 0, "cpu", expect_quantization="none")
    with pytest.raises(shardspec.QuantizationError) as info:
        shardspec.load_rank(tiny.path, 0, "cpu", expect_quantization="fp8")
    assert info.value.code == "quantization-mismatch" and info.value.section == "8.3"


@pytest.mark.parametrize("rank", [2, -1, True, False, "0", 0.0, None])
def test_bad_rank_is_a_request_error(tiny: Tiny, rank: Any) -> None:
    checkpoint = shardspec.open(tiny.path)
    with pytest.raises(shardspec.RequestError) as info:
        checkpoint.load_rank(rank, "cpu")
    assert info.value.code == "rank-out-of-range"
    assert isinstance(info.value, ValueError)
    with pytest.raises(ValueError):
        checkpoint.rank_files(rank)


def test_unaligned_offsets_load_bit_exact(tmp_path: Path) -> None:
    tensors = {
        "byte": ("U8", [1], b"\x07"),
        "f32": ("F32", [3], bytes(range(12))),
        "odd": ("I8", [3], b"\x01\x02\x03"),
        "f64": ("F64", [2], bytes(range(100, 116))),
        "bf16": ("BF16", [1, 3], bytes(range(200, 206))),
        "c64": ("C64", [1], bytes(range(50, 58))),
    }
    root = write_handmade(tmp_path / "c", tensors)
    loaded = shardspec.load_rank(root, 0, "cpu", verify=True)
    dtypes = {"byte": torch.uint8, "f32": torch.float32, "odd": torch.int8,
              "f64": torch.float64, "bf16": torch.bfloat16, "c64": torch.complex64}
    for name, (_, shape, payload) in tensors.items():
        assert loaded[name].dtype == dtypes[name]
        assert tuple(loaded[name].shape) == tuple(shape)
        assert raw_bytes(loaded[name]) == payload


@pytest.mark.parametrize("pad_to", [1, 8])
def test_f4_and_f8_round_trip_bit_exact(tmp_path: Path, pad_to: int) -> None:
    payloads = {
        "f4": ("F4", [3, 4], bytes([0x21, 0x43, 0xFF, 0x0F, 0xF0, 0x88])),
        "e4m3": ("F8_E4M3", [4], bytes([0x7F, 0xFF, 0x00, 0x80])),
        "e5m2": ("F8_E5M2", [2], bytes([0x7C, 0x7F])),
        "e8m0": ("F8_E8M0", [2], bytes([0xFF, 0x7F])),
        "e4m3fnuz": ("F8_E4M3FNUZ", [1], bytes([0x80])),
        "e5m2fnuz": ("F8_E5M2FNUZ", [1], bytes([0x80])),
    }
    root = write_handmade(tmp_path / "c", payloads, pad_to=pad_to)
    loaded = shardspec.load_rank(root, 0, "cpu")
    assert loaded["f4"].dtype == torch.float4_e2m1fn_x2 and loaded["f4"].shape == (3, 2)
    assert loaded["e4m3"].dtype == torch.float8_e4m3fn
    assert loaded["e5m2"].dtype == torch.float8_e5m2
    assert loaded["e8m0"].dtype == torch.float8_e8m0fnu
    assert loaded["e4m3fnuz"].dtype == torch.float8_e4m3fnuz
    assert loaded["e5m2fnuz"].dtype == torch.float8_e5m2fnuz
    for name, (_, _, payload) in payloads.items():
        assert raw_bytes(loaded[name]) == payload


def test_f4_with_odd_last_dimension_loads_flat(tmp_path: Path) -> None:
    root = write_handmade(tmp_path / "c", {"f4": ("F4", [2, 3], bytes([0x21, 0x43, 0x65]))})
    loaded = shardspec.load_rank(root, 0, "cpu")["f4"]
    assert loaded.dtype == torch.float4_e2m1fn_x2 and loaded.shape == (3,)
    assert raw_bytes(loaded) == bytes([0x21, 0x43, 0x65])


def test_f6_loads_as_packed_bytes(tmp_path: Path) -> None:
    payload = bytes(range(1, 7))
    root = write_handmade(tmp_path / "c", {"f6": ("F6_E2M3", [2, 4], payload)})
    loaded = shardspec.load_rank(root, 0, "cpu")["f6"]
    assert loaded.dtype == torch.uint8 and loaded.shape == (2, 3)
    assert raw_bytes(loaded) == payload


def test_every_error_carries_code_section_and_location(tiny: Tiny) -> None:
    state = rank0_state(tiny)
    del state["step"]
    rewrite_data_file(tiny, state)
    with pytest.raises(ShardspecError) as info:
        shardspec.load_rank(tiny.path, 0, "cpu")
    error = info.value
    assert error.code == "st-missing-tensor" and error.section == "7.2"
    text = str(error)
    assert "model-rank-0-part-0.safetensors" in text and "'step'" in text
    assert "SPEC 7.2" in text and text.startswith("[st-missing-tensor]")


def test_errors_after_manifest_edits_raise_their_family(tiny: Tiny) -> None:
    rewrite_manifest(tiny.path, lambda d: d["tensors"]["layers.0.col.weight"]["pieces"].pop())
    with pytest.raises(shardspec.TensorRecordError) as info:
        shardspec.open(tiny.path)
    assert info.value.code == "coverage-gap"
    assert "'layers.0.col.weight'" in str(info.value) and "SPEC 7.3" in str(info.value)


def test_open_records_the_sha256_of_the_manifest_bytes_it_read(tiny: Tiny) -> None:
    checkpoint = shardspec.open(tiny.path)
    assert checkpoint.manifest_sha256 == sha256_file(tiny.path / "shardspec.json")
