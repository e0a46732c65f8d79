"""Architectures out of the box (``tests/helpers/architectures.py``): each tiny model, saved by
transformers, converts with no plan at TP 2, TP 4 and TP 2 x PP 2, validates, and merges back to
its own files bit-exact, with attention and MLP projections cut into shares and fused ones kept
whole; a representative subset serves in the real vLLM engine with ``auto``'s tokens and
logprobs at TP 1 and 2."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
from safetensors.torch import load_file

import shardspec
from architectures import ARCHITECTURES, Architecture, save_tiny
from shardspec.convert import convert, merge
from shardspec.convert.tp_plan import PlanError, load_plan_file, resolve_plan

pytest.importorskip("transformers")

#: Projections every architecture's plan must cut (weights; biases follow their weight).
SPLIT = re.compile(r"\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj|c_fc|c_proj"
                   r"|dense_h_to_4h|dense_4h_to_h|attention\.dense|fc1|fc2)\.weight$")
#: Fused projections: kept whole, with a notice.
FUSED = re.compile(r"\.(qkv_proj|gate_up_proj|query_key_value)\.weight$")
LAYOUTS = [pytest.param(2, 1, id="tp2"), pytest.param(4, 1, id="tp4"),
           pytest.param(2, 2, id="tp2-pp2")]
BY_TYPE = {a.model_type: a for a in ARCHITECTURES}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """model_type -> its tiny Hugging Face directory, saved once."""
    root = tmp_path_factory.mktemp("architectures")
    return {a.model_type: root / a.model_type for a in ARCHITECTURES}


def _hf(saved: dict[str, Path], arch: Architecture) -> Path:
    path = saved[arch.model_type]
    if not path.exists():
        save_tiny(arch, path)
    return path


def _tensors(directory: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for file in sorted(directory.glob("*.safetensors")):
        out.update(load_file(file))
    return out


@pytest.mark.parametrize(("tp", "pp"), LAYOUTS)
@pytest.mark.parametrize("arch", ARCHITECTURES, ids=lambda a: a.model_type)
def test_converts_with_no_plan_and_merges_back_bit_exact(
        saved: dict[str, Path], tmp_path: Path, arch: Architecture, tp: int, pp: int) -> None:
    hf = _hf(saved, arch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        convert(hf, tmp_path / "ckpt", tp_size=tp, pp_size=pp)
    assert shardspec.validate(tmp_path / "ckpt", checksums=True).ok
    manifest = json.loads((tmp_path / "ckpt" / "shardspec.json").read_text())
    split = fused = 0
    for name, record in manifest["tensors"].items():
        offsets = {tuple(p["offset"]) for p in record.get("pieces", [])}
        if SPLIT.search(name) and arch.split:
            assert len(offsets) > 1, f"{name} is not cut into tensor-parallel shares"
            split += 1
        elif len(offsets) > 1 and len(record["shape"]) == 2:
            split += 1
        elif FUSED.search(name):
            assert offsets == {(0, 0)}, f"{name} is fused and must be kept whole"
            fused += 1
    if arch.split:
        assert split >= 4 * 2 or fused  # every layer's attention and MLP
    else:  # no plan anywhere: matrices whole (the embedding may be split), and the user is
        # told how to split more
        assert split <= 2 and any("kept whole" in str(w.message) and "--plan" in
                                  str(w.message) for w in caught)
    if fused and arch.split:  # a plan cut them but for being fused: told so
        assert any("fused projections" in str(w.message) for w in caught)
    merge(tmp_path / "ckpt", tmp_path / "merged")
    want, got = _tensors(hf), _tensors(tmp_path / "merged")
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and got[name].equal(tensor), name  # type: ignore[attr-defined]


def test_a_plan_file_may_use_transformers_relative_patterns(tmp_path: Path,
                                                            saved: dict[str, Path]) -> None:
    """transformers' own GPT-NeoX plan names ``layers.*...`` of a base model whose tensors
    are ``gpt_neox.layers...``: given as a file, it matches them (defect 2)."""
    import transformers

    plan = dict(transformers.GPTNeoXConfig.base_model_tp_plan)
    plan["layers.*.attention.query_key_value"] = "replicate"  # fused: not one slice
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    tp_plan = resolve_plan({"model_type": "gpt_neox"}, load_plan_file(plan_file))
    assert tp_plan.style_of("gpt_neox.layers.1.attention.dense.weight") == "rowwise"
    assert tp_plan.style_of("gpt_neox.embed_in.weight") == "embedding_rowwise"
    with pytest.raises(PlanError, match="final_layer_norm"):  # a bare plan names everything
        convert(_hf(saved, BY_TYPE["gpt_neox"]), tmp_path / "strict", tp_size=2,
                plan=load_plan_file(plan_file))
    # In transformers' own wrapping, what it does not name is kept whole, as transformers does.
    plan_file.write_text(json.dumps({"base_model_tp_plan": plan}))
    convert(_hf(saved, BY_TYPE["gpt_neox"]), tmp_path / "ckpt", tp_size=2,
            plan=load_plan_file(plan_file))
    manifest = json.loads((tmp_path / "ckpt" / "shardspec.json").read_text())
    pieces = manifest["tensors"]["gpt_neox.layers.0.attention.dense.weight"]["pieces"]
    assert [p["offset"] for p in pieces] == [[0, 0], [0, 64]]


def test_a_fused_gate_up_projection_cut_by_a_users_plan_is_refused(
        tmp_path: Path, saved: dict[str, Path]) -> None:
    """Cut as one matrix, the first rank would hold every gate row (defect 4): refused, with
    what to do."""
    import transformers

    plan = {**transformers.Phi3Config.base_model_tp_plan, "embed_tokens": "embedding",
            "norm": "replicate", "layers.*.input_layernorm": "replicate",
            "layers.*.post_attention_layernorm": "replicate", "lm_head": "colwise_rep",
            "layers.*.self_attn.qkv_proj": "replicate"}
    with pytest.raises(PlanError, match="gate and the up projection.*'replicate'"):
        convert(_hf(saved, BY_TYPE["phi3"]), tmp_path / "ckpt", tp_size=2, plan=plan)
    assert not (tmp_path / "ckpt" / "shardspec.json").exists()


@pytest.mark.parametrize("arch", [a for a in ARCHITECTURES if a.experts],
                         ids=lambda a: a.model_type)
def test_experts_are_found_by_structure_and_move_between_expert_ranks(
        saved: dict[str, Path], tmp_path: Path, arch: Architecture) -> None:
    """GraniteMoE's stacked experts have no ``experts`` in their names (defect 3): ``--ep 2``
    deals them by their dim 0, and loading at one expert rank gathers them back."""
    hf = _hf(saved, arch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        convert(hf, tmp_path / "ckpt", tp_size=2, ep_size=2)
    assert shardspec.validate(tmp_path / "ckpt", checksums=True).ok
    manifest = json.loads((tmp_path / "ckpt" / "shardspec.json").read_text())
    stacked = [n for n, r in manifest["tensors"].items() if len(r.get("shape", [])) == 3]
    assert stacked, "the tiny model has stacked experts"
    for name in stacked:
        experts = manifest["tensors"][name]["shape"][0]
        starts = {p["offset"][0] for p in manifest["tensors"][name]["pieces"]}
        assert starts == {0, experts // 2}, name  # each expert rank holds half the experts
    checkpoint = shardspec.open(tmp_path / "ckpt")
    whole = checkpoint.load_rank(0, "cpu", layout=shardspec.Layout(tp_size=1, pp_size=1,
                                                                   ep_size=1))
    want = _tensors(hf)
    for name, tensor in want.items():
        assert whole[name].equal(tensor), name  # type: ignore[attr-defined]


# --- served by the real vLLM engine -----------------------------------------------------------

SERVED = [a for a in ARCHITECTURES if a.served]


@pytest.fixture(scope="module")
def baselines() -> dict[tuple[str, int], object]:
    return {}  # (model_type, tp) -> ``auto``'s output on the Hugging Face directory, run once


@pytest.mark.vllm
@pytest.mark.parametrize("engine_tp", [1, 2])
@pytest.mark.parametrize("arch", SERVED, ids=lambda a: a.model_type)
def test_served_from_a_checkpoint_converted_with_no_plan_like_auto(
        saved: dict[str, Path], baselines: dict[tuple[str, int], object], arch: Architecture,
        engine_tp: int) -> None:
    from vllm_engine import generate

    hf = _hf(saved, arch)
    ckpt = hf.parent / f"{arch.model_type}-tp2"
    if not ckpt.exists():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            convert(hf, ckpt, tp_size=2)
    key = (arch.model_type, engine_tp)
    if key not in baselines:
        baselines[key] = generate(hf, "auto", tp=engine_tp)
    want = baselines[key]
    got = generate(ckpt, "shardspec", tp=engine_tp)
    assert got.tokens == want.tokens  # type: ignore[attr-defined]
    assert got.logprobs == want.logprobs  # type: ignore[attr-defined]


@pytest.mark.vllm
def test_gemma2_with_its_lm_head_written_untied_serves_like_auto(
        saved: dict[str, Path], baselines: dict[tuple[str, int], object]) -> None:
    """``convert --untie-embeddings`` (for transformers) writes Gemma 2's tied LM head as a
    tensor of its own. vLLM then unties the config, but its Gemma 2 has no LM head to take the
    tensor; the plugin keeps the tie config.json declares and serves with the embedding."""
    from vllm_engine import generate

    arch = BY_TYPE["gemma2"]
    hf = _hf(saved, arch)
    ckpt = hf.parent / "gemma2-untied"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        convert(hf, ckpt, tp_size=2, untie_embeddings=True)
    assert "lm_head.weight" in {n for f in ckpt.glob("*.safetensors") for n in load_file(f)}
    if (arch.model_type, 1) not in baselines:
        baselines[arch.model_type, 1] = generate(hf, "auto", tp=1)
    want = baselines[arch.model_type, 1]
    got = generate(ckpt, "shardspec", tp=1)
    assert got.tokens == want.tokens  # type: ignore[attr-defined]
    assert got.logprobs == want.logprobs  # type: ignore[attr-defined]
