"""shardspec in a real vLLM engine (vLLM's CPU build here; the official wheel where a GPU is).

Every case starts an engine (``tests/helpers/vllm_engine.py``) and compares its greedy tokens *and*
their logprobs with ``load_format="auto"`` on the original Hugging Face directory at the same
parallel layout, so equal outputs mean equal weights. shardspec engines run with
SHARDSPEC_VLLM_CHECK_BOXES: whatever a worker does not read is NaN, so a worker that used a
byte it did not read would not match.

- ``load_format="shardspec"``: a checkpoint converted at TP 1, 2 and 4 (Hugging Face names)
  serves at TP 1 and 2, and loads at PP 2 (vLLM's CPU build cannot generate at PP 2); a
  Qwen3-MoE; a checkpoint saved by the workers (``save_to``) reloads at its own layout; a
  layout its rank-local tensors cannot serve is refused, naming both layouts;
- ``convert --names vllm`` at TP 1 and 2 loads in vLLM's own ``sharded_state`` loader
  (issue 25: the attention layers' scale buffers; at TP 2 with ``sharded_state``) and, with
  its fused tensors global and cut per part (issue 40), in the plugin, at its own layout
  and, where no tensor is rank-local (a vocabulary vLLM need not pad), at another;
- ``reshard`` of ``--names vllm`` output keeps its parts (issue 50): the result at TP 1, 2
  and 4 serves equal to ``auto``, at TP 1 in ``sharded_state`` too.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import shardspec
from shardspec.cli import app
from shardspec.convert import convert
from shardspec.convert.tp_plan import PlanWarning
from vllm_engine import (
    EngineError,
    Generated,
    generate,
    save_llama,
    save_qwen3_moe,
    save_with_dcp,
    serve_and_complete,
)

pytestmark = pytest.mark.vllm

Baseline = Callable[..., Generated]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_llama(tmp_path_factory.mktemp("hf") / "llama")


@pytest.fixture(scope="module")
def auto(llama: Path) -> Baseline:
    """``auto`` on the Hugging Face directory, one engine per layout, run once."""
    cache: dict[tuple[int, int], Generated] = {}

    def get(tp: int = 1, pp: int = 1) -> Generated:
        if (tp, pp) not in cache:
            cache[tp, pp] = generate(llama, "auto", tp=tp, pp=pp)
        return cache[tp, pp]

    return get


@pytest.fixture(scope="module")
def converted(llama: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("converted")
    out = {tp: _converted(llama, root / f"tp{tp}", tp_size=tp) for tp in (1, 2)}
    with pytest.warns(PlanWarning, match="key/value head"):  # 2 KV heads over 4 ranks
        out[4] = _converted(llama, root / "tp4", tp_size=4)
    return out


def _converted(src: Path, dst: Path, **kwargs: object) -> Path:
    convert(src, dst, **kwargs)  # type: ignore[arg-type]
    return dst


def _same(got: Generated, want: Generated) -> None:
    assert got.tokens == want.tokens
    assert got.logprobs == want.logprobs  # bit-equal logits: bit-equal weights


def _bytes_read(log: str) -> list[int]:
    return [int(n) for n in re.findall(r"shardspec: worker .* read (\d+) bytes", log)]


@pytest.mark.parametrize("ckpt_tp", [1, 2, 4])
@pytest.mark.parametrize("engine_tp", [1, 2])
def test_converted_checkpoint_serves_at_any_tp(converted: dict[int, Path], auto: Baseline,
                                               engine_tp: int, ckpt_tp: int) -> None:
    got = generate(converted[ckpt_tp], "shardspec", tp=engine_tp)
    _same(got, auto(engine_tp))
    data = sum(f.stat().st_size for f in converted[ckpt_tp].glob("*.safetensors"))
    read = _bytes_read(got.log)
    assert len(read) == engine_tp
    if engine_tp > 1:  # each worker reads its share of the split weights, not the whole
        # (from TP 1, a row-parallel weight's rows are read with the bytes between two runs:
        # its rows are shorter than a page, so those bytes lie in pages read anyway)
        share = 0.7 if ckpt_tp < engine_tp else 0.6
        assert all(r < share * data for r in read), (read, data)
    # Every worker reads its bytes straight into the parameters by a recorded plan: no tensor
    # goes through load_weights.
    plans = _plans(got.log)
    assert len(plans) == engine_tp
    assert all(how.startswith("recorded") and reads > 0 and through == 0
               for how, reads, through in plans), plans


def _plans(log: str) -> list[tuple[str, int, int]]:
    """(how, reads, tensors through load_weights) of each worker's placement plan."""
    return [(how, int(reads), int(through)) for how, reads, through in re.findall(
        r"shardspec: placement plan (recorded[^:]*|from the cache): (\d+) reads into \d+ "
        r"parameters, (\d+) tensors through load_weights", log)]


def test_placement_plan_cached_and_replayed_on_the_next_start(
        converted: dict[int, Path], auto: Baseline, tmp_path: Path) -> None:
    """The first start records each worker's plan into the named cache; the second start finds
    it there, records nothing and serves as ``auto`` does (unread bytes NaN-poisoned)."""
    cache = tmp_path / "plans"
    first = generate(converted[4], "shardspec", tp=2, extra={"plan_cache": str(cache)})
    _same(first, auto(2))
    assert [how.split(" in ")[0] for how, _, _ in _plans(first.log)] == ["recorded"] * 2
    assert len(list(cache.glob("*.json"))) == 2  # one plan a worker
    second = generate(converted[4], "shardspec", tp=2, extra={"plan_cache": str(cache)})
    _same(second, auto(2))
    assert [how for how, _, _ in _plans(second.log)] == ["from the cache"] * 2


def test_plans_verified_with_verify_serve(converted: dict[int, Path], auto: Baseline,
                                          tmp_path: Path) -> None:
    """``verify`` on the placement path: at TP 2 from TP 4 every source file is hashed before
    any of its bytes is placed; a byte flipped in one is refused."""
    got = generate(converted[4], "shardspec", tp=2, extra={"verify": True})
    _same(got, auto(2))
    assert len(_plans(got.log)) == 2
    corrupt = tmp_path / "corrupt"
    shutil.copytree(converted[4], corrupt)
    victim = corrupt / shardspec.open(corrupt).manifest.files_of(0)[0].path
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF  # the last byte of a tensor: the header still parses, the digest differs
    victim.write_bytes(bytes(data))
    with pytest.raises(EngineError) as failed:
        generate(corrupt, "shardspec", tp=2, extra={"verify": True}, generate=False)
    assert "checksum-mismatch" in failed.value.log


def test_openai_server_serves_a_tp4_checkpoint_at_tp2(converted: dict[int, Path],
                                                      auto: Baseline) -> None:
    """The issue's user journey: ``convert --tp 4``, then the server ``vllm serve`` runs, with
    ``--load-format shardspec`` at TP 2, answers HTTP completions as ``auto`` generates."""
    tokens = serve_and_complete(converted[4], tp=2, extra_args=("--load-format", "shardspec"))
    assert tokens == auto(2).tokens


def test_converted_checkpoint_loads_at_pp2(converted: dict[int, Path], auto: Baseline,
                                           tmp_path: Path) -> None:
    """vLLM's CPU build loads at PP 2 but cannot generate there (its CPU model runner has no
    intermediate tensors: ``auto`` fails the same way), so the stages' loaded state is compared
    with the TP 1 engine's, which serves as ``auto`` does."""
    whole, staged = tmp_path / "tp1", tmp_path / "pp2"
    _same(generate(converted[4], "shardspec", extra={"save_to": str(whole)}), auto(1))
    got = generate(converted[4], "shardspec", pp=2, extra={"save_to": str(staged)},
                   generate=False)
    data = sum(f.stat().st_size for f in converted[4].glob("*.safetensors"))
    read = _bytes_read(got.log)
    assert len(read) == 2 and all(r < 0.7 * data for r in read), (read, data)
    reference = shardspec.load_rank(whole, 0, "cpu")
    stages = [shardspec.load_rank(staged, rank, "cpu") for rank in range(2)]
    assert shardspec.open(staged).manifest.layout.pp_size == 2
    assert "model.layers.0.self_attn.qkv_proj.weight" in stages[0]
    assert "model.layers.1.self_attn.qkv_proj.weight" in stages[1]
    assert "model.layers.1.self_attn.qkv_proj.weight" not in stages[0]
    for stage in stages:
        for name, tensor in stage.items():
            assert torch.equal(tensor, reference[name]), name


def test_qwen3_moe_serves_at_tp2(tmp_path: Path) -> None:
    hf = save_qwen3_moe(tmp_path / "moe")
    ckpt = _converted(hf, tmp_path / "ckpt", tp_size=1)
    _same(generate(ckpt, "shardspec", tp=2), generate(hf, "auto", tp=2))


def test_checkpoint_saved_by_dcp_serves(llama: Path, auto: Baseline, tmp_path: Path) -> None:
    """From training to serving: a torch.distributed.checkpoint job (2 ranks, DTensor shards)
    saves through shardspec's DCP Writer; vLLM serves it at TP 1."""
    ckpt = save_with_dcp(llama, tmp_path / "dcp")
    assert shardspec.open(ckpt).manifest.layout.tp_size == 2
    _same(generate(ckpt, "shardspec", tp=1), auto(1))


def test_workers_save_what_they_loaded_and_it_reloads(converted: dict[int, Path],
                                                      auto: Baseline, tmp_path: Path) -> None:
    saved = tmp_path / "saved"
    first = generate(converted[4], "shardspec", tp=2, extra={"save_to": str(saved)})
    _same(first, auto(2))
    manifest = shardspec.open(saved).manifest
    assert manifest.layout.tp_size == 2 and manifest.metadata["vllm_state"] == \
        "before_process_weights_after_loading"
    assert "model.layers.0.self_attn.qkv_proj.weight" in manifest.tensors
    assert "model.layers.0.self_attn.attn._k_scale" in manifest.tensors
    check = subprocess.run([sys.executable, "-c", "from shardspec.cli import main; main()",
                            "validate", str(saved), "--checksums", "--json"],
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    assert json.loads(check.stdout)["valid"] is True
    _same(generate(saved, "shardspec", tp=2, extra={"verify": True}), auto(2))


@pytest.mark.parametrize("tp", [1, 2])
def test_vllm_names_load_in_sharded_state(llama: Path, auto: Baseline, tmp_path: Path,
                                          tp: int) -> None:
    """Issue 25: ``--names vllm`` output is what vLLM's own loader needs, at TP 1 and 2 (at TP 2
    written with ``sharded_state``: vLLM's loader takes a name once per rank)."""
    ckpt = _converted(llama, tmp_path / f"vllm-tp{tp}", tp_size=tp, names="vllm",
                      sharded_state=tp > 1)
    _same(generate(ckpt, "sharded_state", tp=tp, check_boxes=False), auto(tp))


@pytest.mark.parametrize("tp", [1, 2])
def test_vllm_names_serve_in_the_plugin_at_their_own_layout(llama: Path, auto: Baseline,
                                                           tmp_path: Path, tp: int) -> None:
    """Issue 40: ``--names vllm``'s fused tensors are global, each rank holding a piece per
    part; the plugin reads each piece straight into its rows of the parameter (no recording)."""
    ckpt = _converted(llama, tmp_path / f"vllm-tp{tp}", tp_size=tp, names="vllm")
    served = generate(ckpt, "shardspec", tp=tp)
    _same(served, auto(tp))
    assert "checkpoint rank 0, whole" in served.log


@pytest.fixture(scope="module")
def unpadded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama whose vocabulary vLLM need not pad (1024 rows): a ``--names vllm`` checkpoint
    of it holds no rank-local tensor, so it reshards."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=256, num_attention_heads=8, num_key_value_heads=2,
                         head_dim=32, intermediate_size=512, num_hidden_layers=2,
                         vocab_size=1024, max_position_embeddings=256,
                         tie_word_embeddings=False)
    path = tmp_path_factory.mktemp("unpadded") / "hf"
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def unpadded_auto(unpadded: Path) -> Baseline:
    """``auto`` on the unpadded model, one engine per TP, run once."""
    cache: dict[int, Generated] = {}

    def get(tp: int = 1) -> Generated:
        if tp not in cache:
            cache[tp] = generate(unpadded, "auto", tp=tp)
        return cache[tp]

    return get


def test_vllm_names_without_padding_serve_at_another_layout(
        unpadded: Path, unpadded_auto: Baseline, tmp_path: Path) -> None:
    """A vocabulary vLLM need not pad (1024 rows) leaves no rank-local tensor in a ``--names
    vllm`` checkpoint: written at TP 2, it serves at TP 1, by a placement plan recorded from
    vLLM's own weight loaders, which cut the fused tensors per part."""
    ckpt = _converted(unpadded, tmp_path / "tp2", tp_size=2, names="vllm")
    records = shardspec.open(ckpt).manifest.tensors.values()
    assert not any(getattr(r, "rank_local", False) for r in records)
    served = generate(ckpt, "shardspec", tp=1)
    _same(served, unpadded_auto(1))
    assert "resharded on load" in served.log


@pytest.mark.parametrize(("source", "target", "engine_tp"), [(4, 1, 1), (4, 2, 2), (2, 4, 2)])
def test_reshard_of_vllm_names_serves_at_the_new_tp(
        unpadded: Path, unpadded_auto: Baseline, tmp_path: Path, source: int, target: int,
        engine_tp: int) -> None:
    """Issue 50: ``reshard`` of a ``--names vllm`` checkpoint keeps vLLM's parts (SPEC 11.3
    rule 12): at TP 1 and 2 the plugin serves it at its own layout, reading each piece into
    its rows of the parameter, equal to ``auto``; vLLM's CPU build cannot run 4 workers on
    this machine's 2 cores, so the TP-4 output serves at TP 2 (and equals what convert writes
    at TP 4 in tests/convert/test_convert_vllm_names.py). At TP 1, where each name is one piece a
    rank, vLLM's own ``sharded_state`` loader reads it too."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)  # 2 key/value heads over 4 ranks
        ckpt = _converted(unpadded, tmp_path / f"tp{source}", tp_size=source, names="vllm")
    out = tmp_path / f"resharded-tp{target}"
    result = CliRunner().invoke(app, ["reshard", str(ckpt), str(out), "--tp", str(target)])
    assert result.exit_code == 0, result.output
    served = generate(out, "shardspec", tp=engine_tp)
    _same(served, unpadded_auto(engine_tp))
    assert ("resharded on load" in served.log) == (target != engine_tp), served.log
    if target == 1:
        _same(generate(out, "sharded_state", tp=1, check_boxes=False), unpadded_auto(1))


def test_rank_local_checkpoint_at_another_layout_is_refused(llama: Path, tmp_path: Path) -> None:
    ckpt = _converted(llama, tmp_path / "vllm-tp2", tp_size=2, names="vllm")
    with pytest.raises(EngineError) as failed:
        generate(ckpt, "shardspec", tp=1)
    log = failed.value.log
    assert "reshard-rank-local" in log
    assert "tp_size=2 pp_size=1" in log and "tensor_parallel_size=1" in log
    assert re.search(r"tensor '[^']+'", log)  # the first tensor that cannot move


@pytest.mark.parametrize("tp", [1, 2])
def test_checkpoint_larger_than_the_model_is_refused(converted: dict[int, Path], tp: int,
                                                     tmp_path: Path) -> None:
    """Issue 41 item 9: config.json describes a model with half the MLP width the checkpoint
    holds. vLLM's weight loaders narrow to their own width without comparing, so before the
    check a worker took rows of the wrong share (at TP 2, rows never read: NaN here) and the
    engine served. Now the worker refuses before reading, naming the tensor, both shapes and
    the parameter."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(converted[2], ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    config["intermediate_size"] //= 2
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(EngineError) as failed:
        generate(ckpt, "shardspec", tp=tp)
    log = failed.value.log
    assert "reshard-unsupported" in log
    assert re.search(r"tensor 'model\.layers\.\d+\.mlp\.(gate|up|down)_proj\.weight'", log), log
    assert "the checkpoint holds it as [512, 256]" in log or \
        "the checkpoint holds it as [256, 512]" in log
    assert "vLLM's parameter 'model.layers." in log and "config.json" in log
