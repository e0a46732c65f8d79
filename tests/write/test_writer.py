"""SPEC 6.1-6.2 and 10: the reference writer."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import stat
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

import shardspec
from checkpoints import Tiny, assert_same_tensor, make_tiny, raw_bytes, read_manifest_dict
from shardspec import Layout, Logical, Manifest, Quantization, Shard
from shardspec.format.manifest import Alias
from shardspec.storage.commit import TEMP_SUFFIX


def load_all(path: Path) -> dict[int, dict[str, torch.Tensor]]:
    checkpoint = shardspec.open(path)
    return {r: checkpoint.load_rank(r, "cpu") for r in range(checkpoint.world_size)}


def data_region_size(path: Path) -> int:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return len(raw) - 8 - length


def test_tiny_round_trip(tiny: Tiny) -> None:
    loaded = load_all(tiny.path)
    for rank, expected in tiny.expected.items():
        assert set(loaded[rank]) == set(expected)
        for name, tensor in expected.items():
            assert_same_tensor(loaded[rank][name], tensor)
    assert shardspec.validate(tiny.path, checksums=True).ok


def test_returned_manifest_is_the_one_on_disk(tiny: Tiny) -> None:
    on_disk = (tiny.path / "shardspec.json").read_bytes()
    assert tiny.manifest.to_json() == on_disk
    assert Manifest.from_dict(json.loads(on_disk)) == tiny.manifest
    assert tiny.manifest.generator == f"shardspec {shardspec.__version__}"


def test_tp_only_files_have_vllm_names(tiny: Tiny) -> None:
    assert [[f.path for f in r.files] for r in tiny.manifest.ranks] == [
        ["model-rank-0-part-0.safetensors"], ["model-rank-1-part-0.safetensors"]]


def test_pp_2_names_carry_coordinates_and_escape_vllms_glob(tmp_path: Path) -> None:
    layout = Layout(tp_size=2, pp_size=2)
    states = {r: {f"stage{r // 2}.w": torch.full((2,), float(r))} for r in range(4)}
    manifest = shardspec.save(states, tmp_path / "ckpt", layout=layout)
    names = [f.path for r in manifest.ranks for f in r.files]
    assert names == [
        "model-rank-0-pp-0-ep-0-tp-0-part-0.safetensors",
        "model-rank-1-pp-0-ep-0-tp-1-part-0.safetensors",
        "model-rank-2-pp-1-ep-0-tp-0-part-0.safetensors",
        "model-rank-3-pp-1-ep-0-tp-1-part-0.safetensors",
    ]
    for tp_rank in range(2):
        assert fnmatch.filter(names, f"model-rank-{tp_rank}-part-*.safetensors") == []
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == sorted(
        [*names, "shardspec.json"])


def test_data_file_name_follows_the_layout() -> None:
    assert shardspec.data_file_name(Layout(tp_size=8), 5, 3) == "model-rank-5-part-3.safetensors"
    layout = Layout(tp_size=2, ep_size=2, rank_order="ep-tp-pp")
    assert shardspec.data_file_name(layout, 3, 0) == (
        "model-rank-3-pp-0-ep-1-tp-1-part-0.safetensors")


def test_refuses_a_non_empty_directory_without_overwrite(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        shardspec.save({0: {"w": torch.ones(2)}}, tmp_path, layout=Layout(tp_size=1))
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_refuses_a_file_as_the_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        shardspec.save({0: {"w": torch.ones(2)}}, tmp_path / "file", layout=Layout(tp_size=1))


def test_overwrite_replaces_and_removes_stale_parts(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    big = {0: {f"t{i}": torch.full((64,), float(i)) for i in range(4)}}
    first = shardspec.save(big, root, layout=Layout(tp_size=1), max_file_size=256)
    assert len(first.ranks[0].files) == 4
    (root / "notes.txt").write_text("not part of the checkpoint")
    (root / "model-rank-7-part-0.safetensors").write_bytes(b"left over from a crash")
    (root / f".model-rank-0-part-0.safetensors{TEMP_SUFFIX}").write_bytes(b"partial")

    second = shardspec.save({0: {"only": torch.arange(3)}}, root, layout=Layout(tp_size=1),
                            overwrite=True)
    assert sorted(p.name for p in root.iterdir()) == [
        "model-rank-0-part-0.safetensors", "notes.txt", "shardspec.json"]
    loaded = shardspec.load_rank(root, 0, "cpu")
    assert list(loaded) == ["only"] and loaded["only"].tolist() == [0, 1, 2]
    assert shardspec.open(root).manifest == second


def test_zero_size_tensors_are_kept(tmp_path: Path) -> None:
    states = {0: {"empty": torch.zeros(0, 3, dtype=torch.bfloat16),
                  "empty1d": torch.zeros(0, dtype=torch.int64), "w": torch.ones(2)}}
    shardspec.save(states, tmp_path / "c", layout=Layout(tp_size=1))
    loaded = shardspec.load_rank(tmp_path / "c", 0, "cpu")
    assert set(loaded) == {"empty", "empty1d", "w"}
    assert_same_tensor(loaded["empty"], states[0]["empty"])
    assert_same_tensor(loaded["empty1d"], states[0]["empty1d"])


def test_non_contiguous_inputs_are_written_contiguous(tmp_path: Path) -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    states = {0: {"t": base.t(), "strided": base[:, ::2],
                  "expanded": torch.ones(3, 1).expand(3, 4)}}
    assert not states[0]["t"].is_contiguous()
    shardspec.save(states, tmp_path / "c", layout=Layout(tp_size=1))
    loaded = shardspec.load_rank(tmp_path / "c", 0, "cpu")
    for name, tensor in states[0].items():
        assert loaded[name].is_contiguous()
        assert_same_tensor(loaded[name], tensor.contiguous())


def test_views_of_one_storage_with_different_names_are_stored_separately(tmp_path: Path) -> None:
    qkv = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    q, k, v = qkv.unbind(0)
    shardspec.save({0: {"q": q, "k": k, "v": v}}, tmp_path / "c", layout=Layout(tp_size=1))
    loaded = shardspec.load_rank(tmp_path / "c", 0, "cpu")
    for name, tensor in {"q": q, "k": k, "v": v}.items():
        assert_same_tensor(loaded[name], tensor)
    manifest = shardspec.open(tmp_path / "c").manifest
    assert not any(isinstance(t, Alias) for t in manifest.tensors.values())


def test_tied_weights_become_an_alias_sharing_storage(tiny: Tiny) -> None:
    record = tiny.manifest.tensors["lm_head.weight"]
    assert record.to_dict() == {"alias_of": "model.embed_tokens.weight"}
    for rank in range(2):
        loaded = shardspec.load_rank(tiny.path, rank, "cpu")
        assert loaded["lm_head.weight"].data_ptr() == loaded["model.embed_tokens.weight"].data_ptr()
        assert_same_tensor(loaded["lm_head.weight"], tiny.expected[rank]["lm_head.weight"])
    with open(tiny.data_file(0), "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    assert "lm_head.weight" not in header  # an alias has no data of its own


def test_tying_on_some_ranks_only_is_not_an_alias(tmp_path: Path) -> None:
    emb = torch.randn(4, 2)
    states = {0: {"emb": emb, "head": emb}, 1: {"emb": emb.clone(), "head": emb.clone() + 1}}
    manifest = shardspec.save(states, tmp_path / "c", layout=Layout(tp_size=2))
    assert not any(isinstance(t, Alias) for t in manifest.tensors.values())
    loaded = load_all(tmp_path / "c")
    for rank, state in states.items():
        for name, tensor in state.items():
            assert_same_tensor(loaded[rank][name], tensor)


def test_max_file_size_splits_a_rank_into_parts(tmp_path: Path) -> None:
    tensors = {f"t{i}": torch.full((100,), float(i)) for i in range(5)}  # 400 bytes each
    tensors["big"] = torch.ones(1000)  # 4000 bytes: over the cap on its own
    tensors["tail"] = torch.ones(10)
    manifest = shardspec.save({0: tensors}, tmp_path / "c", layout=Layout(tp_size=1),
                              max_file_size=1000)
    names = [f.path for f in manifest.ranks[0].files]
    assert names == [f"model-rank-0-part-{p}.safetensors" for p in range(len(names))]
    assert len(names) == 5  # [t0 t1] [t2 t3] [t4] [big] [tail]
    for name in names:
        size = data_region_size(tmp_path / "c" / name)
        assert size <= 1000 or size == 4000
    placed = {n: t.piece_of(0).file for n, t in manifest.tensors.items()}
    assert placed["big"] == names[3]
    loaded = shardspec.load_rank(tmp_path / "c", 0, "cpu")
    for name, tensor in tensors.items():
        assert_same_tensor(loaded[name], tensor)


def shard_error(tmp_path: Path, states: dict[int, dict[str, torch.Tensor]],
                sharding: dict[int, dict[str, Shard]], error: type[Exception]) -> Exception:
    target = tmp_path / "empty"
    target.mkdir()
    with pytest.raises(error) as info:
        shardspec.save(states, target, layout=Layout(tp_size=len(states)), sharding=sharding)
    assert list(target.iterdir()) == []
    with pytest.raises(error):
        shardspec.save(states, tmp_path / "never", layout=Layout(tp_size=len(states)),
                       sharding=sharding)
    assert not (tmp_path / "never").exists()
    return info.value


@pytest.mark.parametrize(("sizes", "offsets", "code"), [
    ((2, 1), (0, 3), "coverage-gap"),
    ((3, 2), (0, 2), "coverage-overlap"),
    ((2, 2), (0, 3), "piece-bounds"),
], ids=["gap", "overlap", "out_of_bounds"])
def test_pieces_that_do_not_tile_once_are_refused_before_writing(
    tmp_path: Path, sizes: tuple[int, int], offsets: tuple[int, int], code: str
) -> None:
    """Two ranks' pieces of a 4-element tensor that do not tile it exactly once."""
    states = {r: {"w": torch.ones(size)} for r, size in enumerate(sizes)}
    sharding = {r: {"w": Shard((4,), (offset,))} for r, offset in enumerate(offsets)}
    error = shard_error(tmp_path, states, sharding, shardspec.TensorRecordError)
    assert isinstance(error, shardspec.ShardspecError) and error.code == code


def test_disagreeing_global_shapes_are_refused_before_writing(tmp_path: Path) -> None:
    states = {0: {"w": torch.ones(2)}, 1: {"w": torch.ones(2)}}
    sharding = {0: {"w": Shard((4,), (0,))}, 1: {"w": Shard((5,), (2,))}}
    shard_error(tmp_path, states, sharding, ValueError)


def test_shard_on_some_ranks_only_is_refused_before_writing(tmp_path: Path) -> None:
    states = {0: {"w": torch.ones(2)}, 1: {"w": torch.ones(2)}}
    sharding = {0: {"w": Shard((4,), (0,))}}
    shard_error(tmp_path, states, sharding, ValueError)


def test_dtypes_differing_across_ranks_are_refused(tmp_path: Path) -> None:
    states = {0: {"w": torch.ones(2)}, 1: {"w": torch.ones(2, dtype=torch.float16)}}
    shard_error(tmp_path, states, {}, ValueError)


def test_shard_for_a_missing_tensor_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not in the state dict"):
        shardspec.save({0: {"w": torch.ones(2)}}, tmp_path / "c", layout=Layout(tp_size=1),
                       sharding={0: {"v": Shard((2,), (0,))}})


@pytest.mark.parametrize("ranks", [[0], [0, 1, 2], [1, 2]])
def test_wrong_number_of_ranks_is_refused(tmp_path: Path, ranks: list[int]) -> None:
    with pytest.raises(ValueError, match="one state dict per rank"):
        shardspec.save({r: {"w": torch.ones(1)} for r in ranks}, tmp_path / "c",
                       layout=Layout(tp_size=2))
    assert not (tmp_path / "c").exists()


def test_non_tensor_value_is_a_type_error(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="'w'"):
        shardspec.save({0: {"w": [1.0, 2.0]}}, tmp_path / "c",  # type: ignore[dict-item]
                       layout=Layout(tp_size=1))
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("name", ["", "__metadata__"])
def test_reserved_or_empty_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError):
        shardspec.save({0: {name: torch.ones(1)}}, tmp_path / "c", layout=Layout(tp_size=1))


def test_dtype_without_a_spec_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="SPEC 6.4"):
        shardspec.save({0: {"w": torch.ones(2, dtype=torch.complex128)}}, tmp_path / "c",
                       layout=Layout(tp_size=1))


def test_extra_files_are_copied_with_digests(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "llama"}')
    vocab = tmp_path / "vocab.txt"
    vocab.write_bytes(os.urandom(1000))
    root = tmp_path / "c"
    manifest = shardspec.save({0: {"w": torch.ones(1)}}, root, layout=Layout(tp_size=1),
                              extra_files=[config])
    assert [f.to_dict() for f in manifest.extra_files] == [{
        "path": "config.json", "size": config.stat().st_size,
        "checksums": {"sha256": hashlib.sha256(config.read_bytes()).hexdigest()}}]
    assert (root / "config.json").read_bytes() == config.read_bytes()

    manifest = shardspec.save({0: {"w": torch.ones(1)}}, root, layout=Layout(tp_size=1),
                              extra_files={"tokenizer/vocab.txt": vocab}, overwrite=True)
    (record,) = manifest.extra_files
    assert record.path == "tokenizer/vocab.txt"
    assert record.checksums["sha256"] == hashlib.sha256(vocab.read_bytes()).hexdigest()
    assert (root / "tokenizer" / "vocab.txt").read_bytes() == vocab.read_bytes()
    assert not (root / "config.json").exists()  # the previous checkpoint's extra file
    assert shardspec.validate(root, checksums=True).ok


def test_quantization_logical_metadata_and_extensions_round_trip(tmp_path: Path) -> None:
    quant = Quantization(method="fp8", config={"activation_scheme": "dynamic",
                                               "weight_block_size": [128, 128]})
    weight = torch.zeros(4, 8, dtype=torch.uint8).view(torch.float8_e4m3fn)
    states = {0: {"w": weight, "w_scale": torch.ones(1)}}
    root = tmp_path / "c"
    shardspec.save(states, root, layout=Layout(tp_size=1), quantization=quant,
                   logical={"w": Logical(dtype="BF16", shape=(4, 8))},
                   metadata={"model": "tiny"},
                   extensions={"org.example.note": {"must_understand": False, "x": [1]}})
    checkpoint = shardspec.open(root)
    manifest = checkpoint.manifest
    assert manifest.quantization == quant
    assert manifest.tensors["w"].logical == Logical(dtype="BF16", shape=(4, 8))
    assert manifest.metadata == {"model": "tiny"}
    assert manifest.extensions == {"org.example.note": {"must_understand": False, "x": [1]}}
    assert [w.code for w in checkpoint.warnings] == ["extension-ignored"]
    assert read_manifest_dict(root)["quantization"] == {
        "method": "fp8", "config": {"activation_scheme": "dynamic",
                                    "weight_block_size": [128, 128]}}
    assert checkpoint.load_rank(0, "cpu", expect_quantization="fp8")["w"].dtype == (
        torch.float8_e4m3fn)


def test_written_files_are_readable_by_everyone(tmp_path: Path) -> None:
    source = tmp_path / "config.json"
    source.write_text("{}")
    previous = os.umask(0o022)
    try:
        make_tiny(tmp_path / "c", extra_files=[source])
    finally:
        os.umask(previous)
    for path in (tmp_path / "c").iterdir():
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == 0o644, (path.name, oct(mode))


def test_no_temporary_files_remain(tiny: Tiny) -> None:
    names = [p.name for p in tiny.path.iterdir()]
    assert not [n for n in names if n.startswith(".") or TEMP_SUFFIX in n]
    assert sorted(names) == sorted(
        ["shardspec.json"] + [f.path for r in tiny.manifest.ranks for f in r.files])


def test_split_along_a_dimension_gives_views_and_offsets() -> None:
    tensor = torch.arange(20).reshape(5, 4)
    parts = shardspec.split(tensor, 0, 3)
    assert [tuple(p.shape) for p, _ in parts] == [(2, 4), (2, 4), (1, 4)]
    assert [s for _, s in parts] == [Shard((5, 4), (0, 0)), Shard((5, 4), (2, 0)),
                                     Shard((5, 4), (4, 0))]
    assert all(p.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()
               for p, _ in parts)
    assert [s.offset for _, s in shardspec.split(tensor, -1, 2)] == [(0, 0), (0, 2)]


def test_split_none_replicates() -> None:
    tensor = torch.ones(3)
    assert [s for _, s in shardspec.split(tensor, None, 3)] == [
        Shard((3,), (0,), replica=r) for r in range(3)]


def test_split_of_f4_counts_elements_not_bytes() -> None:
    packed = torch.arange(8, dtype=torch.uint8).reshape(2, 4).view(torch.float4_e2m1fn_x2)
    (a, sa), (b, sb) = shardspec.split(packed, 1, 2)
    assert sa == Shard((2, 8), (0, 0)) and sb == Shard((2, 8), (0, 4))
    assert raw_bytes(b) == bytes([2, 3, 6, 7])


def test_sharded_f4_round_trips(tmp_path: Path) -> None:
    packed = torch.randint(0, 256, (4, 6), dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    pieces = shardspec.split(packed, 1, 2)
    states = {r: {"w": p} for r, (p, _) in enumerate(pieces)}
    sharding = {r: {"w": s} for r, (_, s) in enumerate(pieces)}
    manifest = shardspec.save(states, tmp_path / "c", layout=Layout(tp_size=2), sharding=sharding)
    record: Any = manifest.tensors["w"]
    assert record.dtype == "F4" and record.shape == (4, 12)
    loaded = load_all(tmp_path / "c")
    for rank, (piece, _) in enumerate(pieces):
        assert_same_tensor(loaded[rank]["w"], piece.contiguous())


@pytest.mark.parametrize(("shape", "dim"), [((4, 6), 2), ((4, 6), -3), ((), 0)])
def test_split_refuses_a_dimension_out_of_range(shape: tuple[int, ...], dim: int) -> None:
    with pytest.raises(ValueError, match="out of range"):
        shardspec.split(torch.zeros(shape), dim, 2)


def test_extra_files_with_one_base_name_are_refused(tmp_path: Path) -> None:
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "config.json").write_text(folder)
    with pytest.raises(ValueError, match="base name"):
        shardspec.save({0: {"w": torch.ones(1)}}, tmp_path / "c", layout=Layout(tp_size=1),
                       extra_files=[tmp_path / "a" / "config.json", tmp_path / "b" / "config.json"])
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("name", ["../config.json", "/abs.json", "shardspec.json",
                                  "model-rank-0-part-0.safetensors"])
def test_unsafe_extra_file_names_are_refused_before_writing(tmp_path: Path, name: str) -> None:
    source = tmp_path / "config.json"
    source.write_text("{}")
    with pytest.raises(shardspec.ShardspecError):
        shardspec.save({0: {"w": torch.ones(1)}}, tmp_path / "c", layout=Layout(tp_size=1),
                       extra_files={name: source})
    assert not (tmp_path / "c").exists()
    assert not Path("/abs.json").exists()
