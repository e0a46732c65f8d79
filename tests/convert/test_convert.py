"""convert, merge and import-vllm: layouts, extra files, tied weights, errors, the CLI."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

import shardspec
from checkpoints import raw_bytes
from hf_helpers import llama_tensors, load_hf_dir, write_hf_dir
from shardspec.cli import app
from shardspec.convert import convert, import_vllm, merge
from shardspec.convert.hf import HFError, HFSource, iter_slice, scan_safetensors
from shardspec.convert.tp_plan import PlanError, PlanWarning
from shardspec.format.manifest import Alias, TensorRecord


@pytest.fixture
def hf(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    tensors = llama_tensors(layers=2, dtype=torch.bfloat16)
    return write_hf_dir(tmp_path / "hf", tensors), tensors


def assert_same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert a[name].shape == b[name].shape, name
        assert raw_bytes(a[name]) == raw_bytes(b[name]), name


# --- convert -----------------------------------------------------------------------------------


def test_an_extra_file_linking_out_of_the_source_is_refused(
        hf: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path) -> None:
    """Issue 41 item 8: git and tar carry links; a tokenizer.json linking outside the source
    is not copied into the checkpoint and checksummed as its own."""
    src, _ = hf
    secret = tmp_path / "secret.txt"
    secret.write_text("not the model's")
    (src / "tokenizer.json").unlink()
    (src / "tokenizer.json").symlink_to(secret)
    with pytest.raises(HFError, match="tokenizer.json links to .*secret.txt, outside"):
        convert(src, tmp_path / "ckpt", tp_size=2)
    assert not (tmp_path / "ckpt").exists()
    # A link that stays inside the source is an ordinary extra file.
    (src / "tokenizer.json").unlink()
    (src / "real.json").write_text("{}")
    (src / "tokenizer.json").symlink_to(src / "real.json")
    manifest = convert(src, tmp_path / "ok", tp_size=2)
    assert (tmp_path / "ok" / "tokenizer.json").read_text() == "{}"
    assert "tokenizer.json" in {f.path for f in manifest.extra_files}


def test_a_hugging_face_cache_snapshot_converts_with_its_links_to_blobs(
        hf: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path) -> None:
    """Snapshots of the Hugging Face cache link every file to the repository's blobs."""
    src, tensors = hf
    repo = tmp_path / "models--org--tiny"
    snapshot = repo / "snapshots" / "0123abc"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, file in enumerate(sorted(p for p in src.iterdir() if p.is_file())):
        blob = repo / "blobs" / f"blob{i}"
        blob.write_bytes(file.read_bytes())
        (snapshot / file.name).symlink_to(Path("../..") / "blobs" / blob.name)
    manifest = convert(snapshot, tmp_path / "ckpt", tp_size=2)
    assert "tokenizer.json" in {f.path for f in manifest.extra_files}
    merge(tmp_path / "ckpt", tmp_path / "merged")
    merged = load_file(tmp_path / "merged" / "model.safetensors")
    assert all(merged[k].equal(v) for k, v in tensors.items())


def test_convert_tp2_layout_and_files(hf: tuple[Path, dict[str, torch.Tensor]],
                                      tmp_path: Path) -> None:
    src, tensors = hf
    (src / "model.safetensors.index.json").write_text('{"weight_map": {}}')  # stale
    (src / "pytorch_model.bin").write_bytes(b"old")
    (src / "consolidated.00.pth").write_bytes(b"old")
    (src / "original").mkdir()
    (src / "original" / "params.json").write_text("{}")
    (src / "nested").mkdir()
    (src / "nested" / "chat_template.jinja").write_text("{{ x }}")
    dst = tmp_path / "ckpt"
    manifest = convert(src, dst, tp_size=2)
    assert manifest.layout.tp_size == 2 and manifest.layout.pp_size == 1
    assert sorted(p.name for p in dst.iterdir() if p.suffix == ".safetensors") == [
        "shard-00001-model-00001-of-00001.safetensors",
        "shard-00002-model-00001-of-00001.safetensors"]  # torch's distributed names
    extras = sorted(f.path for f in manifest.extra_files)
    assert extras == ["config.json", "nested/chat_template.jinja", "tokenizer.json",
                      "tokenizer_config.json"]
    for name in ("model.safetensors.index.json", "pytorch_model.bin", "consolidated.00.pth",
                 "original", "model.safetensors"):
        assert not (dst / name).exists(), name
    for record in manifest.extra_files:
        digest = hashlib.sha256((dst / record.path).read_bytes()).hexdigest()
        assert record.checksums["sha256"] == digest
    report = shardspec.validate(dst, checksums=True)
    assert report.ok, report.findings
    assert manifest.metadata["converted_from"] == "huggingface"
    q = manifest.tensors["model.layers.0.self_attn.q_proj.weight"]
    assert isinstance(q, TensorRecord)
    assert [p.offset for p in q.pieces] == [(0, 0), (8, 0)]
    norm = manifest.tensors["model.norm.weight"]
    assert isinstance(norm, TensorRecord)
    assert [(p.rank, p.replica) for p in norm.pieces] == [(0, 0), (1, 1)]
    rank1 = shardspec.load_rank(dst, 1, device="cpu")
    assert torch.equal(rank1["model.layers.1.mlp.down_proj.weight"],
                       tensors["model.layers.1.mlp.down_proj.weight"][:, 16:])


def test_convert_sharded_source_with_index(tmp_path: Path) -> None:
    tensors = llama_tensors(layers=3)
    src = write_hf_dir(tmp_path / "hf", tensors, shards=3)
    dst = tmp_path / "ckpt"
    convert(src, dst, tp_size=2, pp_size=3)
    assert not (dst / "model.safetensors.index.json").exists()
    out = tmp_path / "merged"
    merge(dst, out)
    assert_same_state(load_hf_dir(out), tensors)


def test_index_disagreeing_with_shards_is_refused(tmp_path: Path) -> None:
    src = write_hf_dir(tmp_path / "hf", llama_tensors(layers=2), shards=2)
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors"
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(HFError, match="model.norm.weight"):
        convert(src, tmp_path / "ckpt", tp_size=1)


def test_no_weights_is_refused(tmp_path: Path) -> None:
    (tmp_path / "hf").mkdir()
    with pytest.raises(HFError, match="no model.safetensors"):
        convert(tmp_path / "hf", tmp_path / "ckpt", tp_size=1)


def test_unmatched_weight_names_it_and_writes_nothing(tmp_path: Path) -> None:
    tensors = llama_tensors(layers=1)
    tensors["model.layers.0.mystery.weight"] = torch.zeros(4, 4)
    src = write_hf_dir(tmp_path / "hf", tensors)
    dst = tmp_path / "ckpt"
    with pytest.raises(PlanError, match="'model.layers.0.mystery.weight'"):
        convert(src, dst, tp_size=2)
    assert not dst.exists()
    # a plan that says to replicate it makes it fine
    plan = {"layers.*.mystery": "replicate", **json.loads(json.dumps(
        shardspec.convert.tp_plan.BUILTIN_PLAN))}
    convert(src, dst, tp_size=2, plan=plan)
    assert shardspec.validate(dst).ok


def test_uneven_split_refused_unless_allowed(tmp_path: Path) -> None:
    tensors = llama_tensors(layers=1, vocab=30)  # 30 rows over 4 ranks
    src = write_hf_dir(tmp_path / "hf", tensors)
    uneven = r"'(lm_head|model.embed_tokens).weight'.*dim 0 has size 30"
    with pytest.raises(PlanError, match=uneven):
        convert(src, tmp_path / "ckpt", tp_size=4)
    assert not (tmp_path / "ckpt").exists()
    with pytest.warns(PlanWarning, match="each key/value head is held by 2"):
        manifest = convert(src, tmp_path / "ckpt", tp_size=4, allow_uneven=True)
    embed = manifest.tensors["model.embed_tokens.weight"]
    assert isinstance(embed, TensorRecord)
    assert [p.shape[0] for p in embed.pieces] == [8, 8, 7, 7]
    merge(tmp_path / "ckpt", tmp_path / "merged")
    assert_same_state(load_hf_dir(tmp_path / "merged"), tensors)


def test_config_plan_is_used(tmp_path: Path) -> None:
    tensors = llama_tensors(layers=1)
    plan = {"layers.*.self_attn.q_proj": "rowwise", "layers.*.self_attn.k_proj": "colwise",
            "layers.*.self_attn.v_proj": "colwise", "layers.*.self_attn.o_proj": "rowwise",
            "layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise",
            "layers.*.mlp.down_proj": "rowwise"}
    src = write_hf_dir(tmp_path / "hf", tensors, model_type="custom",
                       config={"base_model_tp_plan": plan})
    manifest = convert(src, tmp_path / "ckpt", tp_size=2)
    q = manifest.tensors["model.layers.0.self_attn.q_proj.weight"]
    assert isinstance(q, TensorRecord)
    assert [p.offset for p in q.pieces] == [(0, 0), (0, 8)]


def test_unknown_model_shaped_like_llama_converts_and_any_other_is_refused(
        tmp_path: Path) -> None:
    """No plan in config.json or transformers: the Llama-shaped plan, where it names every
    tensor; otherwise a refusal that names the tensor and says to give --plan."""
    src = write_hf_dir(tmp_path / "hf", llama_tensors(layers=1), model_type="mystery")
    convert(src, tmp_path / "ckpt", tp_size=2)
    tensors = {**llama_tensors(layers=1), "model.layers.0.mlp.c_fc.weight": torch.ones(4, 4)}
    odd = write_hf_dir(tmp_path / "odd", tensors, model_type="mystery")
    with pytest.raises(PlanError, match="c_fc.*'mystery'.*--plan"):
        convert(odd, tmp_path / "refused", tp_size=2)
    assert not (tmp_path / "refused").exists()


def test_pipeline_stages_default_and_override(tmp_path: Path) -> None:
    tensors = llama_tensors(layers=3)
    src = write_hf_dir(tmp_path / "hf", tensors)
    manifest = convert(src, tmp_path / "a", tp_size=1, pp_size=2)

    def stage(m: shardspec.Manifest, name: str) -> set[int]:
        record = m.tensors[name]
        assert isinstance(record, TensorRecord)
        return {m.ranks[p.rank].pp_rank for p in record.pieces}

    assert stage(manifest, "model.embed_tokens.weight") == {0}
    assert stage(manifest, "model.layers.0.mlp.up_proj.weight") == {0}
    assert stage(manifest, "model.layers.1.mlp.up_proj.weight") == {0}
    assert stage(manifest, "model.layers.2.mlp.up_proj.weight") == {1}
    assert stage(manifest, "model.norm.weight") == {1}
    assert stage(manifest, "lm_head.weight") == {1}
    moved = convert(src, tmp_path / "b", tp_size=1, pp_size=2,
                    stages={"layers.1.*": 1, "layers.1.*.*": 1})
    assert stage(moved, "model.layers.1.mlp.up_proj.weight") == {1}
    assert stage(moved, "model.layers.1.input_layernorm.weight") == {1}
    with pytest.raises(PlanError, match="matches no tensor"):
        convert(src, tmp_path / "c", tp_size=1, pp_size=2, stages={"nothing": 1})


def test_tied_embedding_alias_at_pp1_own_tensor_at_pp2(tmp_path: Path) -> None:
    tensors = llama_tensors(layers=2, tie=True)
    src = write_hf_dir(tmp_path / "hf", tensors, tie=True)
    one = convert(src, tmp_path / "pp1", tp_size=2)
    # stored under the smaller name, as vLLM's saver keeps; the other name is an alias
    assert one.tensors["model.embed_tokens.weight"] == Alias(alias_of="lm_head.weight")
    rank0 = shardspec.load_rank(tmp_path / "pp1", 0, device="cpu")
    assert rank0["lm_head.weight"] is rank0["model.embed_tokens.weight"]
    assert torch.equal(rank0["lm_head.weight"], tensors["model.embed_tokens.weight"][:32])
    # --untie-embeddings: the LM head a tensor of its own, as transformers' distributed save
    # has it (torch's reader, which transformers loads through, knows no alias).
    hf_names = convert(src, tmp_path / "hf-names", tp_size=2, untie_embeddings=True)
    assert isinstance(hf_names.tensors["lm_head.weight"], TensorRecord)
    assert isinstance(hf_names.tensors["model.embed_tokens.weight"], TensorRecord)
    rank1 = shardspec.load_rank(tmp_path / "hf-names", 1, device="cpu")
    assert torch.equal(rank1["lm_head.weight"], tensors["model.embed_tokens.weight"][32:])
    assert torch.equal(rank1["model.embed_tokens.weight"], rank1["lm_head.weight"])
    two = convert(src, tmp_path / "pp2", tp_size=2, pp_size=2)
    assert isinstance(two.tensors["lm_head.weight"], TensorRecord)
    assert isinstance(two.tensors["model.embed_tokens.weight"], TensorRecord)
    last = shardspec.load_rank(tmp_path / "pp2", 3, device="cpu")
    assert torch.equal(last["lm_head.weight"], tensors["model.embed_tokens.weight"][32:])
    for name in ("pp1", "hf-names", "pp2"):
        merge(tmp_path / name, tmp_path / f"merged-{name}")
        merged = load_hf_dir(tmp_path / f"merged-{name}")
        assert "lm_head.weight" not in merged
        assert_same_state(merged, tensors)


def test_small_max_file_size_makes_parts(hf: tuple[Path, dict[str, torch.Tensor]],
                                         tmp_path: Path) -> None:
    src, tensors = hf
    manifest = convert(src, tmp_path / "ckpt", tp_size=2, max_file_size=1024)
    assert all(len(r.files) > 1 for r in manifest.ranks)
    assert shardspec.validate(tmp_path / "ckpt", checksums=True).ok
    merge(tmp_path / "ckpt", tmp_path / "merged")
    assert_same_state(load_hf_dir(tmp_path / "merged"), tensors)


def test_existing_destination_refused_unless_overwrite(
        hf: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path) -> None:
    src, _ = hf
    convert(src, tmp_path / "ckpt", tp_size=2)
    with pytest.raises(FileExistsError):
        convert(src, tmp_path / "ckpt", tp_size=1)
    manifest = convert(src, tmp_path / "ckpt", tp_size=1, overwrite=True)
    assert manifest.world_size == 1
    assert not (tmp_path / "ckpt" / "shard-00002-model-00001-of-00001.safetensors").exists()
    with pytest.raises(ValueError, match="another directory"):
        convert(src, src, tp_size=1)


def test_quantization_config_is_recorded(tmp_path: Path) -> None:
    src = write_hf_dir(tmp_path / "hf", llama_tensors(layers=1), config={
        "quantization_config": {"quant_method": "FP8", "activation_scheme": "dynamic"}})
    manifest = convert(src, tmp_path / "ckpt", tp_size=1)
    assert manifest.quantization.method == "fp8"
    assert manifest.quantization.config["activation_scheme"] == "dynamic"


@given(
    shape=st.lists(st.integers(0, 6), min_size=1, max_size=4),
    data=st.data(),
    block=st.sampled_from([1, 3, 8, 64, 1 << 20]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.uint8, torch.float64]),
)
def test_iter_slice_equals_torch_slicing(tmp_path_factory: pytest.TempPathFactory,
                                         shape: list[int], data: st.DataObject, block: int,
                                         dtype: torch.dtype) -> None:
    dim = data.draw(st.integers(0, len(shape) - 1))
    start = data.draw(st.integers(0, shape[dim]))
    stop = data.draw(st.integers(start, shape[dim]))
    tensor = torch.arange(int(np.prod(shape)), dtype=torch.float64).reshape(shape).to(dtype)
    path = tmp_path_factory.mktemp("slice") / "t.safetensors"
    save_file({"t": tensor}, str(path))
    source = scan_safetensors(path)["t"]
    got = b"".join(iter_slice(source, dim, start, stop, block=block))
    assert got == raw_bytes(tensor.narrow(dim, start, stop - start))
    assert b"".join(iter_slice(source, None, block=block)) == raw_bytes(tensor)


def test_hf_source_reads_headers_only(hf: tuple[Path, dict[str, torch.Tensor]]) -> None:
    src, tensors = hf
    source = HFSource(src)
    assert source.weight_files == ["model.safetensors"]
    assert set(source.tensors) == set(tensors)
    assert source.config is not None and source.config["model_type"] == "llama"


# --- merge -------------------------------------------------------------------------------------


def test_merge_writes_hf_shards_and_index(hf: tuple[Path, dict[str, torch.Tensor]],
                                          tmp_path: Path) -> None:
    src, tensors = hf
    convert(src, tmp_path / "ckpt", tp_size=2, pp_size=2)
    out = tmp_path / "merged"
    files = merge(tmp_path / "ckpt", out, max_shard_size=4000)
    count = len(files) - 1
    assert count > 1 and files[-1] == "model.safetensors.index.json"
    assert files[:-1] == [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index) == {"metadata", "weight_map"}
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size()
                                                  for t in tensors.values())
    assert set(index["weight_map"]) == set(tensors)
    for name, file in index["weight_map"].items():
        assert name in load_file(str(out / file))
    for file in files[:-1]:
        assert (out / file).stat().st_size <= 4000 + 2048 or len(load_file(str(out / file))) == 1
    assert_same_state(load_hf_dir(out), tensors)
    assert (out / "config.json").read_bytes() == (src / "config.json").read_bytes()
    assert (out / "tokenizer.json").exists()
    assert not (out / "shardspec.json").exists()


def test_merge_single_dtype_file_is_byte_identical(tmp_path: Path) -> None:
    tensors = llama_tensors(layers=2)
    src = write_hf_dir(tmp_path / "hf", tensors)
    with pytest.warns(PlanWarning, match="each key/value head is held by 2"):
        convert(src, tmp_path / "ckpt", tp_size=4, pp_size=2)
    merge(tmp_path / "ckpt", tmp_path / "merged")
    assert (tmp_path / "merged" / "model.safetensors").read_bytes() == \
        (src / "model.safetensors").read_bytes()


def test_merge_refuses_rank_local_tensors(tmp_path: Path) -> None:
    vllm = _vllm_dir(tmp_path / "vllm", tp=2)
    import_vllm(vllm)
    with pytest.raises(HFError, match="rank-local"):
        merge(vllm, tmp_path / "merged")


def test_merge_refuses_a_corrupt_checkpoint(hf: tuple[Path, dict[str, torch.Tensor]],
                                            tmp_path: Path) -> None:
    src, _ = hf
    convert(src, tmp_path / "ckpt", tp_size=2)
    data = tmp_path / "ckpt" / "shard-00002-model-00001-of-00001.safetensors"
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(shardspec.IntegrityError):
        merge(tmp_path / "ckpt", tmp_path / "merged", verify=True)
    with pytest.raises(shardspec.NotCommittedError):
        merge(tmp_path / "nothing", tmp_path / "merged2")


def test_merge_assembles_pieces_split_in_two_dims(tmp_path: Path) -> None:
    weight = torch.arange(48, dtype=torch.float32).reshape(6, 8)
    states, sharding = {}, {}
    for rank in range(4):
        r, c = divmod(rank, 2)
        states[rank] = {"w": weight[r * 3:(r + 1) * 3, c * 4:(c + 1) * 4].clone()}
        sharding[rank] = {"w": shardspec.Shard((6, 8), (r * 3, c * 4))}
    shardspec.save(states, tmp_path / "ckpt", layout=shardspec.Layout(tp_size=4),
                   sharding=sharding)
    merge(tmp_path / "ckpt", tmp_path / "merged")
    assert torch.equal(load_file(str(tmp_path / "merged" / "model.safetensors"))["w"], weight)


# --- import-vllm -------------------------------------------------------------------------------


def _vllm_dir(root: Path, tp: int, parts: int = 1) -> Path:
    """A directory as vLLM's save_sharded_state writes it (fused qkv: rank-local pieces)."""
    root.mkdir(parents=True)
    gen = torch.Generator().manual_seed(1)
    for rank in range(tp):
        state = {
            "model.layers.0.self_attn.qkv_proj.weight": torch.randn(12, 8, generator=gen),
            "model.layers.0.mlp.gate_up_proj.weight": torch.randn(16, 8, generator=gen),
            "model.norm.weight": torch.ones(8),
            "lm_head.weight": torch.randn(16, 8, generator=gen),
        }
        names = list(state)
        for part in range(parts):
            chunk = {n: state[n] for n in names[part::parts]}
            save_file(chunk, str(root / f"model-rank-{rank}-part-{part}.safetensors"))
    (root / "config.json").write_text('{"model_type": "llama"}')
    (root / "tokenizer.json").write_text("{}")
    (root / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    (root / "original").mkdir()
    (root / "original" / "consolidated.00.pth").write_bytes(b"x")
    return root


def _snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    return {p.relative_to(root).as_posix(): (p.stat().st_mtime_ns, p.read_bytes())
            for p in root.rglob("*") if p.is_file()}


def test_import_vllm(tmp_path: Path) -> None:
    root = _vllm_dir(tmp_path / "vllm", tp=4, parts=2)
    before = _snapshot(root)
    result = import_vllm(root)
    manifest = result.manifest
    after = _snapshot(root)
    assert set(after) - set(before) == {"shardspec.json"}
    assert all(after[name] == before[name] for name in before)  # nothing rewritten
    assert manifest.layout.tp_size == 4 and manifest.world_size == 4
    assert all(isinstance(t, TensorRecord) and t.rank_local for t in manifest.tensors.values())
    assert [f.path for f in manifest.ranks[2].files] == [
        "model-rank-2-part-0.safetensors", "model-rank-2-part-1.safetensors"]
    assert sorted(f.path for f in manifest.extra_files) == ["config.json", "tokenizer.json"]
    assert set(result.skipped) == {"model.safetensors.index.json", "original/"}
    report = shardspec.validate(root, checksums=True)
    assert report.ok, report.findings
    rank3 = shardspec.load_rank(root, 3, device="cpu")
    assert_same_state(rank3, {**load_file(str(root / "model-rank-3-part-0.safetensors")),
                              **load_file(str(root / "model-rank-3-part-1.safetensors"))})
    with pytest.raises(FileExistsError):
        import_vllm(root)
    assert import_vllm(root, overwrite=True).manifest == manifest


@pytest.mark.parametrize(("make", "message"), [
    (lambda r: (r / "model-rank-1-part-0.safetensors").unlink(), r"ranks \[1\] have no files"),
    (lambda r: (r / "model-rank-0-part-0.safetensors").rename(
        r / "model-rank-0-part-1.safetensors"), r"rank 0 lacks parts \[0\]"),
    (lambda r: (r / "model.safetensors").write_bytes(b""), "not vLLM sharded-state files"),
    (lambda r: (r / "model-rank-0-pp-1-part-0.safetensors").write_bytes(b""),
     "not vLLM sharded-state files"),
    (lambda r: (r / "pytorch_model.bin").write_bytes(b""), "not vLLM sharded-state files"),
    (lambda r: [p.unlink() for p in r.glob("model-rank-*")], "no model-rank-"),
])
def test_import_vllm_refuses(tmp_path: Path, make: object, message: str) -> None:
    root = _vllm_dir(tmp_path / "vllm", tp=3)
    make(root)  # type: ignore[operator]
    with pytest.raises(HFError, match=message):
        import_vllm(root)
    assert not (root / "shardspec.json").exists()


def test_import_vllm_refuses_a_broken_file(tmp_path: Path) -> None:
    root = _vllm_dir(tmp_path / "vllm", tp=2)
    (root / "model-rank-1-part-0.safetensors").write_bytes(b"\x00" * 4)
    with pytest.raises(HFError, match="model-rank-1-part-0"):
        import_vllm(root)


# --- CLI ---------------------------------------------------------------------------------------


def test_cli_convert_merge_import(hf: tuple[Path, dict[str, torch.Tensor]],
                                  tmp_path: Path) -> None:
    src, tensors = hf
    runner = CliRunner()
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(dict(shardspec.convert.tp_plan.BUILTIN_PLAN)))
    stages = tmp_path / "stages.json"
    stages.write_text(json.dumps({"layers.1.*.*": 0}))
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "ckpt"), "--tp", "2",
                                 "--pp", "2", "--plan", str(plan), "--stages", str(stages),
                                 "--max-file-size", "1MiB"])
    assert result.exit_code == 0, result.output
    assert "converted" in result.output
    result = runner.invoke(app, ["merge", str(tmp_path / "ckpt"), str(tmp_path / "merged"),
                                 "--max-shard-size", "2KB", "--verify"])
    assert result.exit_code == 0, result.output
    assert_same_state(load_hf_dir(tmp_path / "merged"), tensors)
    root = _vllm_dir(tmp_path / "vllm", tp=2)
    result = runner.invoke(app, ["import-vllm", str(root), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["tp_size"] == 2


def test_cli_errors_exit_2_with_a_message(hf: tuple[Path, dict[str, torch.Tensor]],
                                          tmp_path: Path) -> None:
    src, _ = hf
    runner = CliRunner()
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "a"), "--tp", "3"])
    assert result.exit_code == 2
    assert "4 query heads cannot be dealt evenly to 3" in " ".join(result.output.split())
    result = runner.invoke(app, ["convert", str(tmp_path / "none"), str(tmp_path / "b"),
                                 "--tp", "1"])
    assert result.exit_code == 2
    result = runner.invoke(app, ["merge", str(src), str(tmp_path / "c")])
    assert result.exit_code == 1
    assert "not-committed" in result.output
    result = runner.invoke(app, ["merge", str(src), str(tmp_path / "c"), "--max-shard-size",
                                 "lots"])
    assert result.exit_code == 2
    result = runner.invoke(app, ["import-vllm", str(src)])
    assert result.exit_code == 2
    assert not os.path.exists(src / "shardspec.json")


def test_destination_inside_the_source_is_not_copied_into_itself(
        hf: tuple[Path, dict[str, torch.Tensor]]) -> None:
    src, _ = hf
    convert(src, src / "ckpt", tp_size=2)
    manifest = convert(src, src / "ckpt", tp_size=1, overwrite=True)
    assert not any(f.path.startswith("ckpt/") for f in manifest.extra_files)
    assert shardspec.validate(src / "ckpt").ok
