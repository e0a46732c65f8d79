"""Tiny pre-quantized Llama checkpoints in the layouts people serve, written the way their
quantizers write them, for the engine tests and for ``convert``
(``tests/integrations/vllm/test_vllm_quantized.py``).

No quantizer runs on this CPU for GPTQ and AWQ, and the compressed-tensors schemes here need no
calibration, so each layout is written from one random bf16 Llama (:func:`save_llama`) by
round-to-nearest, in the documented layout of its method:

======================  =====================================================================
layout                  tensors of each linear layer ``X`` (``o`` outputs, ``i`` inputs)
======================  =====================================================================
``w8a8-int8-dynamic``   compressed-tensors ``int-quantized``: ``X.weight`` I8 ``[o, i]``,
                        ``X.weight_scale`` ``[o, 1]`` (per channel); activations per token
``w8a8-int8-static``    the same with per-tensor ``X.weight_scale`` ``[1]`` and a static
                        ``X.input_scale`` ``[1]``
``w4a16``               compressed-tensors ``pack-quantized``, group 32: ``X.weight_packed``
                        I32 ``[o, i/8]``, ``X.weight_scale`` ``[o, i/32]``, ``X.weight_shape``
                        I64 ``[2]``
``fp8-dynamic``         compressed-tensors ``float-quantized``: ``X.weight`` F8_E4M3 ``[o, i]``,
                        ``X.weight_scale`` ``[o, 1]``; activations per token
``gptq``                GPTQ 4-bit, group 32, symmetric: ``X.qweight`` I32 ``[i/8, o]``,
                        ``X.qzeros`` I32 ``[i/32, o/8]``, ``X.scales`` F16 ``[i/32, o]``,
                        ``X.g_idx`` I32 ``[i]``
``awq``                 AWQ 4-bit GEMM, group 32, zero points: ``X.qweight`` I32 ``[i, o/8]``
                        and ``X.qzeros`` in AWQ's interleaved order, ``X.scales`` F16
                        ``[i/32, o]``
======================  =====================================================================

The int4 packings are those of vLLM's and compressed-tensors' own packers
(``tests/integrations/vllm/test_vllm_quantized.py`` checks them against both).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

GROUP = 32
#: FP8 blocks (DeepSeek-V3 style, 128 there): 32 x 32 here, so that the tiny model's key/value
#: projection (64 rows) splits over 2 ranks in whole blocks
BLOCK = 32
#: The order in which AWQ packs 8 output features into an int32 (feature ``ORDER[k]`` of a run
#: of 8 in bits ``4k``..``4k + 3``).
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

Tensors = dict[str, torch.Tensor]


def _int_args(bits: int, strategy: str, **more: Any) -> dict[str, Any]:
    return {"num_bits": bits, "type": "int", "symmetric": True, "group_size": None,
            "strategy": strategy, "block_structure": None, "dynamic": False, "actorder": None,
            "observer": "minmax", "observer_kwargs": {}, **more}


def _compressed_tensors(fmt: str, weights: dict[str, Any],
                        activations: dict[str, Any] | None) -> dict[str, Any]:
    """A ``quantization_config`` as compressed-tensors 0.20 writes it for one scheme on every
    ``Linear`` but the LM head and a mixture of experts' router."""
    return {"quant_method": "compressed-tensors", "format": fmt,
            "quantization_status": "compressed", "ignore": ["lm_head", "re:.*mlp.gate$"],
            "kv_cache_scheme": None, "global_compression_ratio": None, "version": "0.20.0",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": activations,
                                          "output_activations": None, "format": fmt}}}


def pack_int4(values: torch.Tensor, dim: int, order: tuple[int, ...] = tuple(range(8))
          ) -> torch.Tensor:
    """Unsigned 4-bit ``values`` packed 8 to an int32 along ``dim``: the ``order[k]``-th of
    each run of 8 in bits ``4k``."""
    moved = values.to(torch.int64).movedim(dim, -1)
    runs = moved.reshape(*moved.shape[:-1], -1, 8)
    packed = torch.zeros(runs.shape[:-1], dtype=torch.int64)
    for k, index in enumerate(order):
        packed |= runs[..., index] << (4 * k)
    # two's complement into int32 (bit 31 is the top nibble's high bit)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return packed.movedim(-1, dim).contiguous()


def _per_group(weight: torch.Tensor, group: int) -> torch.Tensor:
    """``[o, i]`` -> ``[o, i/group, group]``."""
    return weight.reshape(weight.shape[0], -1, group)


def _int8_channel(weight: torch.Tensor) -> Tensors:
    scale = (weight.abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-8)
    q = (weight / scale).round().clamp(-128, 127)
    return {"weight": q.to(torch.int8), "weight_scale": scale.to(torch.bfloat16)}


def _int8_tensor(weight: torch.Tensor) -> Tensors:
    scale = (weight.abs().amax() / 127).clamp(min=1e-8).reshape(1)
    q = (weight / scale).round().clamp(-128, 127)
    # hidden states after RMSNorm stay within about 4: a static activation scale covering that
    return {"weight": q.to(torch.int8), "weight_scale": scale.to(torch.float32),
            "input_scale": torch.tensor([4.0 / 127], dtype=torch.float32)}


def _fp8_channel(weight: torch.Tensor) -> Tensors:
    scale = (weight.abs().amax(dim=1, keepdim=True) / 448).clamp(min=1e-8).to(torch.bfloat16)
    return {"weight": (weight / scale.float()).to(torch.float8_e4m3fn), "weight_scale": scale}


def _fp8_block(weight: torch.Tensor) -> Tensors:
    o, i = weight.shape
    blocks = weight.reshape(o // BLOCK, BLOCK, i // BLOCK, BLOCK)
    scale = (blocks.abs().amax(dim=(1, 3)) / 448).clamp(min=1e-8)
    q = (blocks / scale[:, None, :, None]).reshape(o, i).to(torch.float8_e4m3fn)
    return {"weight": q, "weight_scale_inv": scale}


def _w4a16(weight: torch.Tensor) -> Tensors:
    groups = _per_group(weight, GROUP)
    scale = (groups.abs().amax(dim=2) / 7).clamp(min=1e-8).to(torch.bfloat16)
    q = (groups / scale.float()[..., None]).round().clamp(-8, 7)
    packed = pack_int4((q + 8).reshape(weight.shape), dim=1)  # compressed-tensors' +8 offset
    return {"weight_packed": packed, "weight_scale": scale,
            "weight_shape": torch.tensor(list(weight.shape), dtype=torch.int64)}


def _gptq(weight: torch.Tensor) -> Tensors:
    groups = _per_group(weight, GROUP)
    scale = (groups.abs().amax(dim=2) / 7).clamp(min=1e-8).to(torch.float16)
    q = ((groups / scale.float()[..., None]).round().clamp(-8, 7) + 8).reshape(weight.shape)
    o, i = weight.shape
    return {"qweight": pack_int4(q.t(), dim=0),  # [i/8, o]
            # GPTQ's v1 format stores each zero point less one: 8 as 7
            "qzeros": pack_int4(torch.full((i // GROUP, o), 7), dim=1),
            "scales": scale.t().contiguous(),
            "g_idx": torch.arange(i, dtype=torch.int32) // GROUP}


def _awq(weight: torch.Tensor) -> Tensors:
    groups = _per_group(weight, GROUP)
    low, high = groups.amin(dim=2), groups.amax(dim=2)
    scale = ((high - low) / 15).clamp(min=1e-8).to(torch.float16)
    zero = (-low / scale.float()).round().clamp(0, 15)
    q = ((groups / scale.float()[..., None]).round() + zero[..., None]).clamp(0, 15)
    return {"qweight": pack_int4(q.reshape(weight.shape).t(), dim=1, order=AWQ_ORDER),
            "qzeros": pack_int4(zero.t(), dim=1, order=AWQ_ORDER),
            "scales": scale.t().contiguous()}


Quantizer = Callable[[torch.Tensor], Tensors]


@dataclass(frozen=True)
class QuantizedLayout:
    """One layout of the matrix (the tests' and the vLLM guide's table)."""

    quantize: Quantizer  # one linear weight -> its tensors, by suffix
    config: dict[str, Any]  # config.json's quantization_config
    dtype: str  # config.json's dtype
    #: what vLLM's CPU build does with it here: "served" (its kernels need no AVX-512: tokens
    #: are compared), "loaded" (its kernel needs AVX-512: the bytes each worker loaded are
    #: compared), "" (vLLM cannot build its layers here: convert and reshard only)
    in_vllm: str
    tensors: str  # what each linear layer holds, for the docs


LAYOUTS: dict[str, QuantizedLayout] = {
    "w8a8-int8-dynamic": QuantizedLayout(_int8_channel, _compressed_tensors(
        "int-quantized", _int_args(8, "channel"),
        _int_args(8, "token", dynamic=True, observer=None)), "bfloat16", "served",
        "`weight` I8, `weight_scale` `[o, 1]`"),
    "w8a8-int8-static": QuantizedLayout(_int8_tensor, _compressed_tensors(
        "int-quantized", _int_args(8, "tensor"), _int_args(8, "tensor")), "bfloat16", "served",
        "`weight` I8, `weight_scale` and `input_scale` `[1]`"),
    "w4a16": QuantizedLayout(_w4a16, _compressed_tensors(
        "pack-quantized", _int_args(4, "group", group_size=GROUP), None), "bfloat16", "loaded",
        "`weight_packed` I32 `[o, i/8]`, `weight_scale` `[o, i/32]`, `weight_shape`"),
    "fp8-dynamic": QuantizedLayout(_fp8_channel, _compressed_tensors(
        "float-quantized", {**_int_args(8, "channel"), "type": "float"},
        {**_int_args(8, "token", dynamic=True, observer=None), "type": "float"}), "bfloat16",
        "served", "`weight` F8_E4M3, `weight_scale` `[o, 1]`"),
    "fp8-block": QuantizedLayout(_fp8_block, {
        "quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
        "weight_block_size": [BLOCK, BLOCK]}, "bfloat16", "",
        f"`weight` F8_E4M3, `weight_scale_inv` `[o/{BLOCK}, i/{BLOCK}]` (DeepSeek-V3 style)"),
    "gptq": QuantizedLayout(_gptq, {"quant_method": "gptq", "bits": 4, "group_size": GROUP,
                                    "desc_act": False, "sym": True,
                                    "checkpoint_format": "gptq"}, "float16", "loaded",
                            "`qweight` I32 `[i/8, o]`, `qzeros`, `scales` `[i/32, o]`, `g_idx`"),
    "awq": QuantizedLayout(_awq, {"quant_method": "awq", "bits": 4, "group_size": GROUP,
                                  "zero_point": True, "version": "gemm"}, "float16", "loaded",
                           "`qweight` I32 `[i, o/8]`, `qzeros`, `scales` `[i/32, o]`"),
}


def _is_linear(name: str) -> bool:
    return name.endswith(".weight") and name.rpartition(".")[0].rpartition(".")[2] in LINEAR


def save_quantized(layout: str, path: Path, source: Path,
                   save_source: Callable[[Path], Path] | None = None) -> Path:
    """The tiny bf16 model at ``source`` (a Llama, :func:`vllm_engine.save_llama`, saved there
    by ``save_source`` unless it is there) quantized in ``layout`` at ``path``: every linear
    layer's weight (experts' too; not a router's, not the LM head)."""
    from vllm_engine import save_llama  # (the docs import this module for its table alone)

    chosen = LAYOUTS[layout]
    if not source.exists():
        (save_source or save_llama)(source)
    tensors: Tensors = {}
    for name, tensor in ((n, t) for f in sorted(source.glob("*.safetensors"))
                         for n, t in load_file(f).items()):
        if not _is_linear(name):
            tensors[name] = tensor
            continue
        stem = name[: -len("weight")]
        tensors.update({stem + suffix: t
                        for suffix, t in chosen.quantize(tensor.float()).items()})
    config = json.loads((source / "config.json").read_text())
    _write(path, tensors, {**config, "torch_dtype": chosen.dtype, "dtype": chosen.dtype,
                           "quantization_config": chosen.config})
    return path


def _write(path: Path, tensors: Tensors, config: dict[str, Any]) -> None:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config, indent=2))
