"""``shardspec import``: per-rank directories adopted in place (convert.recognize, .adopt,
.from_hf_distributed). A real 2-rank distributed save of transformers (torchrun, gloo,
``tp_plan="auto"``) becomes a checkpoint that validates, loads at TP 1 bit-exact and serves in
the real vLLM engine with ``auto``'s tokens; what is not a per-rank directory is refused with
what it looks like."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import transformers  # with accelerate for tp_plan="auto": both in the test extra
from safetensors.torch import load_file, save_file

import shardspec
from command import run
from shardspec.convert import import_directory, import_hf_distributed
from shardspec.convert.hf import HFError
from vllm_engine import free_port

HELPERS = Path(__file__).resolve().parents[1] / "helpers"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the Hugging Face directory, its distributed save by 2 tensor-parallel ranks)."""
    from architectures import COMMON

    root = tmp_path_factory.mktemp("distributed")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**COMMON)
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(root / "hf")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(free_port()), str(HELPERS / "hf_distributed_save.py"),
         str(root / "hf"), str(root / "dist")], env=env, capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root / "hf", root / "dist"


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_a_transformers_distributed_save_is_adopted_in_place(saved: tuple[Path, Path],
                                                             tmp_path: Path) -> None:
    hf, dist = saved
    ckpt = _copy(dist, tmp_path / "dist")
    before = {f.name: f.read_bytes() for f in ckpt.iterdir()}
    code, out, _ = run("import", str(ckpt))
    assert code == 0 and "huggingface distributed" in out and "tp=2" in out
    # Nothing moved or rewritten: the manifest is the one file added.
    assert {f.name: f.read_bytes() for f in ckpt.iterdir() if f.name != "shardspec.json"} \
        == before
    assert shardspec.validate(ckpt, checksums=True).ok
    manifest = json.loads((ckpt / "shardspec.json").read_text())
    q = manifest["tensors"]["model.layers.0.self_attn.q_proj.weight"]
    assert q["shape"] == [128, 128]
    assert sorted((p["rank"], tuple(p["offset"])) for p in q["pieces"]) == [(0, (0, 0)),
                                                                          (1, (64, 0))]
    want = load_file(hf / "model.safetensors")
    whole = shardspec.open(ckpt).load_rank(0, "cpu", layout=shardspec.Layout(tp_size=1),
                                           verify=True)
    assert sorted(whole) == sorted(want)
    for name, tensor in want.items():
        assert whole[name].dtype == tensor.dtype and whole[name].equal(tensor), name


@pytest.mark.vllm
def test_an_imported_distributed_save_serves_in_vllm_like_auto(saved: tuple[Path, Path],
                                                               tmp_path: Path) -> None:
    from vllm_engine import generate

    hf, dist = saved
    ckpt = _copy(dist, tmp_path / "dist")
    import_directory(ckpt)
    want = generate(hf, "auto", tp=2)
    got = generate(ckpt, "shardspec", tp=2)
    assert got.tokens == want.tokens and got.logprobs == want.logprobs


def _rank_file(path: Path, tensors: dict[str, torch.Tensor], offsets: dict[str, list[int]],
               info: object = None) -> None:
    metadata = {"DCP_SHARDING_INFO": json.dumps(
        info if info is not None else {n: {"saved_offsets": o} for n, o in offsets.items()})}
    save_file(tensors, str(path), metadata=metadata)


def test_replicated_chunks_are_numbered_as_replicas(tmp_path: Path) -> None:
    """A save that did not dedup a replicated tensor holds it once per rank: replicas."""
    norm = torch.arange(8, dtype=torch.float32)
    w = torch.arange(32, dtype=torch.float32).reshape(4, 8)
    _rank_file(tmp_path / "shard-00001-model-00001-of-00001.safetensors",
               {"norm": norm, "w": w[:2]}, {"norm": [0], "w": [0, 0]})
    _rank_file(tmp_path / "shard-00002-model-00001-of-00001.safetensors",
               {"norm": norm, "w": w[2:]}, {"norm": [0], "w": [2, 0]})
    manifest = import_hf_distributed(tmp_path).manifest
    assert [p.replica for p in manifest.tensors["norm"].pieces] == [0, 1]  # type: ignore[union-attr]
    assert shardspec.validate(tmp_path, checksums=True).ok
    loaded = shardspec.open(tmp_path).load_rank(0, "cpu", layout=shardspec.Layout(tp_size=1))
    assert loaded["w"].equal(w) and loaded["norm"].equal(norm)


@pytest.mark.parametrize(("damage", "message"), [
    (lambda d: (d / "shard-00001-model-00001-of-00001.safetensors").unlink(),
     r"ranks \[0\] have no files"),
    (lambda d: (d / "shard-00001-model-00001-of-00001.safetensors").rename(
        d / "shard-00001-model-00001-of-00002.safetensors"), "say they are \\[2\\] in all"),
    (lambda d: _rank_file(d / "shard-00002-model-00001-of-00001.safetensors",
                          {"w": torch.ones(2, 8)}, {}, info={"w": {"saved_offsets": [2]}}),
     "no list of 2 non-negative integer saved_offsets"),
    (lambda d: save_file({"w": torch.ones(2, 8)},
                         str(d / "shard-00002-model-00001-of-00001.safetensors")),
     "has no DCP_SHARDING_INFO"),
    (lambda d: _rank_file(d / "shard-00002-model-00001-of-00001.safetensors",
                          {"w": torch.ones(3, 8)}, {"w": [1, 0]}),
     "coverage-overlap"),
])
def test_a_broken_distributed_save_is_refused_and_nothing_is_written(
        tmp_path: Path, damage: object, message: str) -> None:
    w = torch.zeros(4, 8)
    _rank_file(tmp_path / "shard-00001-model-00001-of-00001.safetensors", {"w": w[:2]},
               {"w": [0, 0]})
    _rank_file(tmp_path / "shard-00002-model-00001-of-00001.safetensors", {"w": w[2:]},
               {"w": [2, 0]})
    damage(tmp_path)  # type: ignore[operator]
    with pytest.raises(Exception, match=message):
        import_directory(tmp_path)
    assert not (tmp_path / "shardspec.json").exists()


@pytest.mark.parametrize(("files", "message"), [
    (["model.safetensors", "config.json"], "whole tensors: convert it with `shardspec convert"),
    ([".metadata", "__0_0.distcp"], "torch.distributed.checkpoint directory"),
    (["pytorch_model.bin"], "pickled PyTorch weights"),
    (["config.json"], "no per-rank weight files"),
])
def test_what_is_not_a_per_rank_directory_is_refused_saying_what_it_looks_like(
        tmp_path: Path, files: list[str], message: str) -> None:
    for name in files:
        (tmp_path / name).write_bytes(b"{}")
    with pytest.raises(HFError, match=message):
        import_directory(tmp_path)
    code, _, err = run("import", str(tmp_path))
    assert code == 2 and "Traceback" not in err and message.split(":")[0] in err


def test_import_recognizes_vllm_sharded_state(tmp_path: Path) -> None:
    save_file({"w": torch.ones(2, 2)}, str(tmp_path / "model-rank-0-part-0.safetensors"))
    save_file({"w": torch.ones(2, 2)}, str(tmp_path / "model-rank-1-part-0.safetensors"))
    code, out, _ = run("import", str(tmp_path))
    assert code == 0 and "vllm sharded_state" in out and "1 rank-local tensor" in out
    assert shardspec.validate(tmp_path, checksums=True).ok
    code, _, err = run("import", str(tmp_path))  # once is enough
    assert code == 2 and "already holds shardspec.json" in err


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_torchs_huggingface_reader_reads_a_converted_checkpoint_bit_exact(
        saved: tuple[Path, Path], tmp_path: Path, tp: int) -> None:
    """Each data file says where its entries lie (``DCP_SHARDING_INFO``): torch's own reader
    reads the checkpoint whole, key/value heads replicated over ranks at TP 4 included."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader

    from shardspec.convert import convert

    hf, _ = saved
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TP 4 replicates key/value heads, with a warning
        convert(hf, tmp_path / "ckpt", tp_size=tp)
    want = load_file(hf / "model.safetensors")
    state = {name: torch.empty_like(tensor) for name, tensor in want.items()}
    dcp.load(state, storage_reader=HuggingFaceStorageReader(str(tmp_path / "ckpt")),
             no_dist=True)
    for name, tensor in want.items():
        assert state[name].equal(tensor), name
