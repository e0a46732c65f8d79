"""A PP=1 checkpoint from ``convert`` is found and loaded by vLLM's sharded-state loader.

vLLM is not installed here: the test reimplements the rules of its ``ShardedStateLoader``:

1. a worker of rank r globs ``model-rank-{r}-part-*.safetensors`` in the directory and fails if
   nothing matches;
2. its expected keys are the model's state dict after ``_filter_subtensors``: of names sharing
   one storage (tied weights) only the alphabetically smallest is kept;
3. it opens every matched file with safetensors; every key must be an expected key not loaded
   before (else a KeyError), and the tensor's shape must fit the parameter;
4. after all files, no expected key may be left (else "Missing keys").

Each rank's expected names and shapes are built from the converter's plan (the manifest): the
tensors and aliases with a piece on the rank. The test also checks that no file of another
rank matches a rank's glob and that a PP>1 checkpoint is refused loudly (SPEC 6.2).
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from hf_helpers import expected_split_dim, llama_tensors, write_hf_dir
from shardspec.convert import convert, import_vllm
from shardspec.format.manifest import Alias, Manifest, TensorRecord

PATTERN = "model-rank-{rank}-part-{part}.safetensors"  # vLLM's DEFAULT_PATTERN
KV_HEADS = 2


def vllm_state_dict(manifest: Manifest, rank: int) -> dict[str, tuple[int, ...]]:
    """The rank's parameter names and shapes, after vLLM's _filter_subtensors."""
    storage: dict[str, str] = {}   # name -> the name holding its data
    shapes: dict[str, tuple[int, ...]] = {}
    for name, record in manifest.tensors.items():
        if isinstance(record, TensorRecord) and (piece := record.piece_of(rank)):
            storage[name] = name
            shapes[name] = piece.shape
    for name, record in manifest.tensors.items():
        if isinstance(record, Alias) and record.alias_of in storage:
            storage[name] = record.alias_of
            shapes[name] = shapes[record.alias_of]
    keep: dict[str, str] = {}
    for name in sorted(storage):
        keep.setdefault(storage[name], name)  # smallest name of each storage group
    return {name: shapes[name] for name in keep.values()}


def vllm_sharded_state_load(directory: Path, rank: int,
                            state: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    pattern = os.path.join(directory, PATTERN.format(rank=rank, part="*"))
    filepaths = glob.glob(pattern)
    if not filepaths:
        raise ValueError(f"Could not find checkpoint files '{pattern}', only pre-sharded "
                         "checkpoints are currently supported!")
    remaining = dict(state)
    loaded: dict[str, torch.Tensor] = {}
    for path in filepaths:
        with safe_open(path, framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                param_shape = remaining.pop(key)  # KeyError: unexpected or loaded twice
                tensor = f.get_tensor(key)
                assert all(s <= p for s, p in zip(tensor.shape, param_shape, strict=True))
                assert tuple(tensor.shape) == param_shape, key
                loaded[key] = tensor
    if remaining:
        raise ValueError(f"Missing keys {tuple(remaining)} in loaded state!")
    return loaded


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.filterwarnings("ignore:the model has 2 key/value heads")
def test_converted_checkpoint_loads_by_vllm_rules(tmp_path: Path, tp: int, tie: bool) -> None:
    tensors = llama_tensors(layers=2, tie=tie, dtype=torch.bfloat16, heads=4,
                            kv_heads=KV_HEADS)
    src = write_hf_dir(tmp_path / "hf", tensors, tie=tie, heads=4, kv_heads=KV_HEADS)
    dst = tmp_path / "ckpt"
    manifest = convert(src, dst, tp_size=tp)
    full = dict(tensors)
    if tie:
        full["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    for rank in range(tp):
        own = {f.path for f in manifest.ranks[rank].files}
        matched = {Path(p).name for p in glob.glob(str(dst / PATTERN.format(rank=rank,
                                                                             part="*")))}
        assert matched == own  # its own files, and no other rank's
        state = vllm_state_dict(manifest, rank)
        loaded = vllm_sharded_state_load(dst, rank, state)
        if tie:  # vLLM keeps one name of the tied pair: the smaller
            assert "lm_head.weight" in loaded and "model.embed_tokens.weight" not in loaded
        for name, tensor in loaded.items():
            dim = expected_split_dim(name)
            want = full[name] if dim is None else torch.chunk(full[name], tp, dim=dim)[rank]
            if tp > KV_HEADS and (".k_proj." in name or ".v_proj." in name):
                # vLLM: fewer KV heads than ranks -> KV head r // (tp / kv) on rank r
                want = torch.chunk(full[name], KV_HEADS, dim=0)[rank // (tp // KV_HEADS)]
            assert torch.equal(tensor, want), name
    # files of no rank beyond the layout match
    assert not glob.glob(str(dst / PATTERN.format(rank=tp, part="*")))


def test_rules_reject_what_vllm_rejects(tmp_path: Path) -> None:
    tensors = llama_tensors(layers=1)
    convert(write_hf_dir(tmp_path / "hf", tensors), tmp_path / "ckpt", tp_size=2)
    from shardspec import open as open_checkpoint

    manifest = open_checkpoint(tmp_path / "ckpt").manifest
    state = vllm_state_dict(manifest, 0)
    with pytest.raises(KeyError):  # an unexpected key
        vllm_sharded_state_load(tmp_path / "ckpt", 0, {k: v for k, v in state.items()
                                                       if k != "model.norm.weight"})
    with pytest.raises(ValueError, match="Missing keys"):
        vllm_sharded_state_load(tmp_path / "ckpt", 0, {**state, "extra.weight": (1,)})


def test_pipeline_parallel_checkpoint_is_not_found_by_vllm(tmp_path: Path) -> None:
    src = write_hf_dir(tmp_path / "hf", llama_tensors(layers=2))
    manifest = convert(src, tmp_path / "ckpt", tp_size=2, pp_size=2)
    for rank in range(manifest.world_size):
        with pytest.raises(ValueError, match="Could not find checkpoint files"):
            vllm_sharded_state_load(tmp_path / "ckpt", rank, {})


def test_imported_vllm_directory_still_loads_by_vllm_rules(tmp_path: Path) -> None:
    root = tmp_path / "vllm"
    root.mkdir()
    from safetensors.torch import save_file

    states = {r: {"model.layers.0.self_attn.qkv_proj.weight": torch.randn(6, 4),
                  "lm_head.weight": torch.randn(8, 4)} for r in range(2)}
    for rank, state in states.items():
        save_file(state, str(root / PATTERN.format(rank=rank, part=0)))
    manifest = import_vllm(root).manifest
    for rank in range(2):
        loaded = vllm_sharded_state_load(root, rank, vllm_state_dict(manifest, rank))
        assert all(torch.equal(loaded[k], v) for k, v in states[rank].items())
