"""Quantized checkpoints (``tests/helpers/quantized_models.py``: compressed-tensors W8A8 int8
dynamic
and static, W4A16, FP8 dynamic, GPTQ and AWQ 4-bit) through ``convert`` and in the real vLLM
engine.

- ``convert`` with no plan takes each (FP8 blocks, DeepSeek-V3 style, too) at TP 1, 2, 4 and
  TP 2 x PP 2: every scale, zero point, group index and activation scale tied to its weight
  (SPEC 8.4), ``weight_shape`` whole on every rank; the checkpoint validates with checksums,
  reshards, and merges back bit-exact; a TP that would cut a quantization group is refused
  with the TP sizes that work.
- The plugin serves each layout at TP 1 and 2 from a TP-1 and a TP-2 checkpoint. Where this
  CPU's vLLM build has the layout's kernels (int8 and FP8: :data:`SERVED`), greedy tokens and
  logprobs equal ``auto``'s on the Hugging Face directory; the int4 layouts' kernel
  (``cpu_gemm_wna16``) is built only for AVX-512, so there (:data:`PLACED`) the engine stops
  right after loading and every worker's parameters and buffers are compared with ``auto``'s,
  byte for byte (``vllm_engine.loaded_state``). Every shardspec engine runs with what a worker
  does not read poisoned (NaN, integers all ones).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import shardspec
from quantized_models import AWQ_ORDER, LAYOUTS, pack_int4, save_quantized
from shardspec.convert import convert, merge
from shardspec.convert.tp_plan import PlanError
from shardspec.reshard import reshard
from vllm_engine import Generated, generate, loaded_state, vllm_python

#: Layouts whose kernels vLLM's CPU build has on this machine (AVX2): served and compared.
SERVED = [name for name, layout in LAYOUTS.items() if layout.in_vllm == "served"]
#: int4 layouts: loaded and their placed bytes compared (vLLM's int4 CPU kernel needs AVX-512).
PLACED = [name for name, layout in LAYOUTS.items() if layout.in_vllm == "loaded"]
#: (engine TP, checkpoint TP): each at its own layout and resharded on load.
CELLS = [pytest.param(1, 1, id="tp1-own"), pytest.param(1, 2, id="tp1-from-tp2"),
         pytest.param(2, 2, id="tp2-own"), pytest.param(2, 1, id="tp2-from-tp1")]
#: Quantizer outputs tied to their weights (SPEC 8.4), by suffix.
TIED = ("weight_scale", "weight_scale_inv", "input_scale", "weight_zero_point", "scales", "qzeros",
         "g_idx")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("quantized")


@pytest.fixture(scope="module")
def hf(root: Path) -> Callable[[str], Path]:
    """layout -> its Hugging Face directory, written once."""
    def get(layout: str) -> Path:
        path = root / layout
        if not path.exists():
            save_quantized(layout, path, root / "bf16")
        return path
    return get


@pytest.fixture(scope="module")
def converted(hf: Callable[[str], Path], root: Path) -> Callable[[str, int], Path]:
    """(layout, tp) -> ``convert --tp tp`` of it, once."""
    def get(layout: str, tp: int) -> Path:
        path = root / f"{layout}-tp{tp}"
        if not path.exists():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # 2 KV heads over 4 ranks: noticed, not news
                convert(hf(layout), path, tp_size=tp)
        return path
    return get


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        out.update(load_file(file))
    return out


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 1), (4, 1), (2, 2)],
                         ids=["tp1", "tp2", "tp4", "tp2-pp2"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_converts_with_every_companion_tied_and_merges_back_bit_exact(
        hf: Callable[[str], Path], tmp_path: Path, layout: str, tp: int, pp: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        convert(hf(layout), tmp_path / "ckpt", tp_size=tp, pp_size=pp)
    assert shardspec.validate(tmp_path / "ckpt", checksums=True).ok
    manifest = json.loads((tmp_path / "ckpt" / "shardspec.json").read_text())
    assert manifest["quantization"]["method"] == LAYOUTS[layout].config["quant_method"]
    companions = 0
    for name, record in manifest["tensors"].items():
        stem, _, suffix = name.rpartition(".")
        if suffix in TIED:
            base = record["tied_to"]["tensor"]
            assert base.rpartition(".")[0] == stem, name
            companions += 1
        if suffix == "weight_shape":  # the logical shape: whole on every rank of its weight
            assert "tied_to" not in record
            assert {(tuple(p["offset"]), tuple(p["shape"])) for p in record["pieces"]} == \
                {((0,), (2,))}
            base = manifest["tensors"][stem + ".weight_packed"]
            assert {p["rank"] for p in record["pieces"]} == {p["rank"] for p in base["pieces"]}
    assert companions >= 7 * 2  # every linear layer of both layers has at least one
    merge(tmp_path / "ckpt", tmp_path / "merged")
    want, got = _tensors(hf(layout)), _tensors(tmp_path / "merged")
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert _same_bytes(got[name], tensor), name


@pytest.mark.parametrize(("source_tp", "target_tp"), [(2, 1), (1, 2), (2, 4)],
                         ids=["tp2-to-tp1", "tp1-to-tp2", "tp2-to-tp4"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_reshards_with_every_tie_kept_and_merges_back_bit_exact(
        converted: Callable[[str, int], Path], hf: Callable[[str], Path], tmp_path: Path,
        layout: str, source_tp: int, target_tp: int) -> None:
    """Resharding moves each scale with the blocks of its weight (SPEC 8.4, 11.3): the result
    validates, and its merge is the original files' tensors."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reshard(converted(layout, source_tp), tmp_path / "ckpt",
                shardspec.Layout(tp_size=target_tp))
    assert shardspec.validate(tmp_path / "ckpt", checksums=True).ok
    manifest = json.loads((tmp_path / "ckpt" / "shardspec.json").read_text())
    assert manifest["layout"]["tp_size"] == target_tp
    merge(tmp_path / "ckpt", tmp_path / "merged")
    want, got = _tensors(hf(layout)), _tensors(tmp_path / "merged")
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert _same_bytes(got[name], tensor), name


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_quantized_mixture_of_experts_converts_over_expert_and_tensor_ranks(
        root: Path, tmp_path: Path, layout: str) -> None:
    """A Qwen3-MoE with every expert quantized (its router not) at TP 2 x EP 2: each expert's
    scales go with its weight to its expert rank, and cut with it on the tensor ranks. (No
    quantized mixture of experts builds in vLLM's CPU build on this machine: its FP8, int8 and
    WNA16 MoE backends all refuse the CPU, so there is no engine case.)"""
    from vllm_engine import save_qwen3_moe

    source = save_quantized(layout, tmp_path / "hf", root / "moe-bf16", save_qwen3_moe)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        convert(source, tmp_path / "ckpt", tp_size=2, ep_size=2)
    assert shardspec.validate(tmp_path / "ckpt", checksums=True).ok
    manifest = json.loads((tmp_path / "ckpt" / "shardspec.json").read_text())
    experts = [n for n, r in manifest["tensors"].items() if ".experts.3." in n and "tied_to" in r]
    assert experts  # expert 3's scales are tied to its weights...
    for name in experts:  # ...and only on the ranks of expert rank 1 (ranks 2 and 3)
        assert {p["rank"] for p in manifest["tensors"][name]["pieces"]} <= {2, 3}, name
    merge(tmp_path / "ckpt", tmp_path / "merged")
    want, got = _tensors(source), _tensors(tmp_path / "merged")
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert _same_bytes(got[name], tensor), name


def test_a_tp_that_cuts_a_quantization_group_is_refused_with_the_sizes_that_work(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups of 128 input features: o_proj's 256 inputs give 4 ranks 64 each."""
    import quantized_models

    config = json.loads(json.dumps(LAYOUTS["w4a16"].config))
    config["config_groups"]["group_0"]["weights"]["group_size"] = 128
    monkeypatch.setattr(quantized_models, "GROUP", 128)
    monkeypatch.setitem(LAYOUTS, "w4a16", dataclasses.replace(LAYOUTS["w4a16"], config=config))
    save_quantized("w4a16", tmp_path / "hf", root / "bf16")
    with pytest.raises(PlanError) as refused:
        convert(tmp_path / "hf", tmp_path / "ckpt", tp_size=4)
    text = str(refused.value)
    assert "o_proj.weight_packed" in text and "inside a block or pack of 128" in text
    assert "(1, 2 do)" in text and "SPEC 8.4" in text
    assert not (tmp_path / "ckpt" / "shardspec.json").exists()
    convert(tmp_path / "hf", tmp_path / "ckpt2", tp_size=2)  # one that works, does


_PACKERS = """
import sys, torch
from safetensors.torch import load_file
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
from vllm.model_executor.layers.quantization.utils.quant_utils import awq_pack, gptq_pack
t = load_file(sys.argv[1])
q = t["q"]  # unsigned 4-bit values, [in, out]
k, n = q.shape
assert torch.equal(gptq_pack(q, 4, k, n), t["gptq"]), "gptq"
assert torch.equal(awq_pack(q, 4, k, n), t["awq"]), "awq"
assert torch.equal(pack_to_int32((q.t() - 8).to(torch.int8), 4), t["ct"]), "compressed-tensors"
print("PACKED ALIKE")
"""


@pytest.mark.vllm
def test_the_int4_packings_are_vllms_and_compressed_tensors_own(tmp_path: Path) -> None:
    """The test checkpoints pack as GPTQ, AWQ and compressed-tensors do: each packing against
    the packers vLLM and compressed-tensors ship (in vLLM's environment)."""
    q = torch.randint(0, 16, (64, 96), generator=torch.Generator().manual_seed(3),
                      dtype=torch.int32)
    save_file({"q": q, "gptq": pack_int4(q, dim=0), "awq": pack_int4(q, dim=1, order=AWQ_ORDER),
               "ct": pack_int4(q.t(), dim=1)}, tmp_path / "packed.safetensors")
    done = subprocess.run([str(vllm_python()), "-c", _PACKERS,
                           str(tmp_path / "packed.safetensors")],
                          capture_output=True, text=True, timeout=300)
    assert "PACKED ALIKE" in done.stdout, done.stderr[-3000:]


@pytest.fixture(scope="module")
def auto(hf: Callable[[str], Path]) -> Callable[[str, int], Generated]:
    """``auto`` on a layout's Hugging Face directory at a TP, one engine each, once."""
    cache: dict[tuple[str, int], Generated] = {}

    def get(layout: str, tp: int) -> Generated:
        if (layout, tp) not in cache:
            cache[layout, tp] = generate(hf(layout), "auto", tp=tp)
        return cache[layout, tp]
    return get


@pytest.fixture(scope="module")
def auto_state(hf: Callable[[str], Path]) -> Callable[[str, int], dict[int, dict[str, str]]]:
    cache: dict[tuple[str, int], dict[int, dict[str, str]]] = {}

    def get(layout: str, tp: int) -> dict[int, dict[str, str]]:
        if (layout, tp) not in cache:
            cache[layout, tp] = loaded_state(hf(layout), "auto", tp=tp)
        return cache[layout, tp]
    return get


@pytest.mark.vllm
@pytest.mark.parametrize(("tp", "checkpoint_tp"), CELLS)
@pytest.mark.parametrize("layout", SERVED)
def test_serves_equal_to_auto(converted: Callable[[str, int], Path],
                              auto: Callable[[str, int], Generated], layout: str, tp: int,
                              checkpoint_tp: int) -> None:
    got = generate(converted(layout, checkpoint_tp), "shardspec", tp=tp)
    want = auto(layout, tp)
    assert got.tokens == want.tokens
    assert got.logprobs == want.logprobs
    assert "recording failed" not in got.log  # every byte placed or checked against the boxes


@pytest.mark.vllm
@pytest.mark.parametrize(("tp", "checkpoint_tp"), CELLS)
@pytest.mark.parametrize("layout", PLACED)
def test_places_the_bytes_auto_places(converted: Callable[[str, int], Path],
                                      auto_state: Callable[[str, int], dict[int, dict[str, str]]],
                                      layout: str, tp: int, checkpoint_tp: int) -> None:
    got = loaded_state(converted(layout, checkpoint_tp), "shardspec", tp=tp)
    want = auto_state(layout, tp)
    for rank in range(tp):
        assert sorted(got[rank]) == sorted(want[rank])
        differ = sorted(n for n in want[rank] if got[rank][n] != want[rank][n])
        assert not differ, f"rank {rank}: {differ}"


@pytest.mark.vllm
def test_a_served_quantized_model_saved_by_its_workers_reloads_and_serves_equal(
        converted: Callable[[str, int], Path], auto: Callable[[str, int], Generated],
        tmp_path: Path) -> None:
    """``save_to`` at TP 2 (resharded from TP 1), then that checkpoint at its own layout: both
    serve ``auto``'s outputs. Per-tensor scales of fused layers (one per part) included."""
    layout = "w8a8-int8-static"
    first = generate(converted(layout, 1), "shardspec", tp=2,
                     extra={"save_to": str(tmp_path / "saved")})
    assert (first.tokens, first.logprobs) == (auto(layout, 2).tokens, auto(layout, 2).logprobs)
    assert shardspec.validate(tmp_path / "saved", checksums=True).ok
    again = generate(tmp_path / "saved", "shardspec", tp=2)
    assert "checkpoint rank" in again.log and "whole" in again.log  # its own layout
    assert (again.tokens, again.logprobs) == (first.tokens, first.logprobs)


@pytest.mark.vllm
@pytest.mark.parametrize("layout", ["gptq", "awq"])
def test_an_int4_model_saved_by_its_workers_reloads_the_bytes_auto_loads(
        converted: Callable[[str, int], Path],
        auto_state: Callable[[str, int], dict[int, dict[str, str]]], tmp_path: Path,
        layout: str) -> None:
    """Saved under vLLM's fused names (``qkv_proj.qweight``), where vLLM's GPTQ would look
    for ``q_proj`` to tell that the layer is quantized: config.json lists the quantized
    modules, and the fused layers load quantized."""
    loaded_state(converted(layout, 2), "shardspec", tp=2,
                 extra={"save_to": str(tmp_path / "saved")})
    assert shardspec.validate(tmp_path / "saved", checksums=True).ok
    assert loaded_state(tmp_path / "saved", "shardspec", tp=2) == auto_state(layout, 2)


@pytest.mark.vllm
def test_a_scale_the_checkpoint_lacks_is_refused_by_name(hf: Callable[[str], Path],
                                                         tmp_path: Path) -> None:
    """vLLM's own loader lets a quantized checkpoint lack only what it exempts (KV-cache
    scales...); a weight scale it lacks would serve whatever the allocator left there (``auto``
    does not check quantized models): the plugin refuses, naming the parameter."""
    from vllm_engine import EngineError

    layout = "w8a8-int8-dynamic"
    lacking = "model.layers.1.mlp.down_proj.weight_scale"
    source = tmp_path / "hf"
    source.mkdir()
    tensors = load_file(hf(layout) / "model.safetensors")
    del tensors[lacking]
    save_file(tensors, source / "model.safetensors", metadata={"format": "pt"})
    (source / "config.json").write_text((hf(layout) / "config.json").read_text())
    convert(source, tmp_path / "ckpt", tp_size=1)
    with pytest.raises(EngineError) as refused:
        generate(tmp_path / "ckpt", "shardspec", tp=1)
    assert "reshard-unsupported" in refused.value.log and lacking in refused.value.log
