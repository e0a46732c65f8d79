"""A converted checkpoint is read natively by transformers and torch: its data files carry torch's
distributed names (``shard-SSSSS-model-CCCCC-of-NNNNN.safetensors``) and ``DCP_SHARDING_INFO``, so
``from_pretrained(CKPT)`` loads it in one process and under torchrun with ``tp_plan="auto"``,
and torch's ``HuggingFaceStorageReader`` reads it at any layout: replicated norms, key/value
heads replicated over TP 4 and tied embeddings included, bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from shardspec.convert import convert
from vllm_engine import free_port

transformers = pytest.importorskip("transformers")

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
IDS = torch.tensor([[1, 5, 9, 17, 33, 65, 127, 0]])


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, torch.Tensor]]:
    """Small real Llamas saved by save_pretrained, untied and tied: (directory, logits)."""
    from architectures import COMMON

    root = tmp_path_factory.mktemp("native")
    out = {}
    for tie in (False, True):
        torch.manual_seed(0)
        config = transformers.LlamaConfig(**COMMON, tie_word_embeddings=tie)
        model = transformers.LlamaForCausalLM(config).eval()
        model.save_pretrained(root / f"hf-tie-{tie}")
        with torch.no_grad():
            out[f"tie-{tie}"] = (root / f"hf-tie-{tie}", model(IDS).logits)
    return out


def _convert(src: Path, dst: Path, **kwargs: object) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TP 4 replicates key/value heads, with a warning
        convert(src, dst, **kwargs)  # type: ignore[arg-type]
    return dst


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
@pytest.mark.parametrize(("tie", "layout"), [
    (False, {"tp_size": 2}), (True, {"tp_size": 2}),
    (False, {"tp_size": 2, "pp_size": 2}), (False, {"tp_size": 2, "max_file_size": 200_000}),
])
def test_from_pretrained_of_a_converted_checkpoint_in_one_process(
        models: dict[str, tuple[Path, torch.Tensor]], tmp_path: Path, tie: bool,
        layout: dict[str, int]) -> None:
    from transformers.distributed.checkpoint import is_sharded_checkpoint

    hf, want = models[f"tie-{tie}"]
    ckpt = _convert(hf, tmp_path / "ckpt", untie_embeddings=tie, **layout)
    assert is_sharded_checkpoint(ckpt)  # transformers takes its distributed path
    if "max_file_size" in layout:
        assert len(list(ckpt.glob("shard-00002-model-*-of-00006.safetensors"))) == 6
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt).eval()
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, want)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_torchs_reader_reads_a_tied_checkpoint_bit_exact(
        models: dict[str, tuple[Path, torch.Tensor]], tmp_path: Path, tp: int) -> None:
    """Every name of the model's state dict, the tied LM head too (torch's reader knows no
    alias, so convert stores it as transformers' distributed save does)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader

    hf, _ = models["tie-True"]
    ckpt = _convert(hf, tmp_path / "ckpt", tp_size=tp, untie_embeddings=True)
    want = transformers.AutoModelForCausalLM.from_pretrained(hf).state_dict()
    state = {name: torch.empty_like(tensor) for name, tensor in want.items()}
    dcp.load(state, storage_reader=HuggingFaceStorageReader(str(ckpt)), no_dist=True)
    for name, tensor in want.items():
        assert state[name].equal(tensor), name


def test_from_pretrained_with_tensor_parallelism_under_torchrun(
        models: dict[str, tuple[Path, torch.Tensor]], tmp_path: Path) -> None:
    """2 gloo ranks, tp_plan="auto": each converted checkpoint (TP 2, and TP 4 read by 2
    ranks) gives every rank the same shares and rank 0 the same logits as the original
    loaded the same way; those agree with one process's to rounding."""
    groups = []
    for tie in (False, True):
        hf, _ = models[f"tie-{tie}"]
        groups.append([hf, _convert(hf, tmp_path / f"tp2-{tie}", tp_size=2,
                                    untie_embeddings=tie)])
    groups[0].append(_convert(groups[0][0], tmp_path / "tp4", tp_size=4))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(free_port()), str(HELPERS / "hf_tp_logits.py"),
         str(tmp_path / "logits.pt"), *(",".join(map(str, g)) for g in groups)], env=env,
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    logits = torch.load(tmp_path / "logits.pt")
    for group in groups:
        original, *converted = (logits[str(d)] for d in group)
        for got in converted:
            assert torch.equal(got, original)
        assert torch.allclose(original, models[f"tie-{group is groups[1]}"][1], atol=1e-5)


def test_the_numbering_is_torchs_so_import_reads_the_files_back(
        models: dict[str, tuple[Path, torch.Tensor]], tmp_path: Path) -> None:
    """Without its manifest, a converted checkpoint is what torch's distributed writer leaves
    (rank S from 1, file C of N from 1): ``shardspec import`` adopts it, the same pieces."""
    import shardspec
    from shardspec.convert import import_directory

    hf, _ = models["tie-True"]
    ckpt = _convert(hf, tmp_path / "ckpt", tp_size=2, max_file_size=200_000,
                    untie_embeddings=True)
    before = shardspec.open(ckpt).manifest
    (ckpt / "shardspec.json").unlink()
    kind, imported = import_directory(ckpt)
    assert kind == "huggingface distributed"
    assert [[f.path for f in r.files] for r in imported.manifest.ranks] == \
        [[f.path for f in r.files] for r in before.ranks]
    assert shardspec.validate(ckpt, checksums=True).ok
    whole = shardspec.load_rank(ckpt, 0, "cpu", layout=shardspec.Layout(tp_size=1))
    want = transformers.AutoModelForCausalLM.from_pretrained(hf).state_dict()
    assert sorted(whole) == sorted(want)
    for name, tensor in want.items():
        assert whole[name].equal(tensor), name


def test_a_tied_head_is_an_alias_unless_untied(models: dict[str, tuple[Path, torch.Tensor]],
                                                tmp_path: Path) -> None:
    """By default the tied LM head is stored once (an alias, SPEC 7.6): vLLM serves it tied,
    as from the Hugging Face files. --untie-embeddings writes it as a tensor of its own, which
    transformers' from_pretrained needs (the tests above)."""
    import shardspec
    from shardspec.format.manifest import Alias, TensorRecord

    hf, _ = models["tie-True"]
    tied = shardspec.open(_convert(hf, tmp_path / "tied", tp_size=2)).manifest.tensors
    untied = shardspec.open(_convert(hf, tmp_path / "untied", tp_size=2,
                                     untie_embeddings=True)).manifest.tensors
    assert sum(isinstance(tied[n], Alias) for n in ("lm_head.weight",
                                                   "model.embed_tokens.weight")) == 1
    assert all(isinstance(untied[n], TensorRecord) for n in ("lm_head.weight",
                                                            "model.embed_tokens.weight"))
