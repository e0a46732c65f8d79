"""Pre-quantized Hugging Face checkpoints: which tensors are quantizer outputs, and of what.

``convert`` must split a scale with its weight, never on its own (SPEC 8.4). This module reads
the names, shapes and ``quantization_config`` of a source checkpoint and says, for each
quantized weight (a *base*), the logical dtype and shape it stands for and how its grid is
oriented, and for each scale, zero point or group index, its :class:`~shardspec.manifest.Tie`.

Recognised layouts (the names vLLM and transformers load):

========================  ==============================  =====================================
method                    base (grid)                     tied tensors
========================  ==============================  =====================================
FP8 blocks (DeepSeek-V3)  ``X.weight`` F8 ``[o, i]``      ``X.weight_scale_inv`` (block from
                                                          ``weight_block_size`` or the shapes)
FP8 per channel / tensor  ``X.weight`` F8 ``[o, i]``      ``X.weight_scale``, ``X.input_scale``
AWQ                       ``X.qweight`` I32 ``[i, o/p]``  ``X.scales``, ``X.qzeros``
GPTQ                      ``X.qweight`` I32 ``[i/p, o]``  ``X.scales``, ``X.qzeros``, ``X.g_idx``
MXFP4 (gpt-oss)           ``X_blocks`` U8 ``[.., o, i/32, 16]``  ``X_scales``
========================  ==============================  =====================================

AWQ and GPTQ store the grid input-major (``[i, o]``): a column-parallel split cuts grid dim 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .hf import SourceTensor
from .manifest import Logical, Tie

__all__ = ["Base", "Quantized", "find_quantized", "infer_tie"]

#: config ``torch_dtype`` / ``dtype`` -> safetensors dtype of the weights a quantizer replaced.
_LOGICAL_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "half": "F16"}


@dataclass(frozen=True)
class Base:
    """A quantized weight: what it stands for, and whether its grid is ``[in, out]``."""

    logical: Logical
    input_major: bool = False
    #: GPTQ with act-order: its groups are not blocks of the input features.
    act_order: bool = False


@dataclass(frozen=True)
class Quantized:
    """The quantized weights of a checkpoint and the tensors tied to them."""

    bases: dict[str, Base] = field(default_factory=dict)
    ties: dict[str, Tie] = field(default_factory=dict)


def _logical_dtype(config: Mapping[str, Any]) -> str:
    name = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return _LOGICAL_DTYPES.get(name.removeprefix("torch."), "BF16")


def infer_tie(base: str, grid: tuple[int, ...], shape: tuple[int, ...],
              block: tuple[int, ...] | None = None) -> Tie | None:
    """The tie of a tensor of ``shape`` describing blocks of ``grid``: one value (no block),
    the given ``block``, or the block each dim's size implies (``ceil(L / size)``); None where
    no block gives that shape."""
    if math.prod(shape) == 1 and block is None:
        return Tie(tensor=base)
    rank = min(len(shape), len(grid))
    if block is None:
        # Trailing dims of size 1 are inner: a per-channel [o, 1] scale broadcasts over the
        # input features, so a row-parallel split keeps it whole on every rank.
        while rank > 1 and shape[rank - 1] == 1 and grid[rank - 1] > 1:
            rank -= 1
        if any(s == 0 for s in shape[:rank]):
            return None
        block = tuple(-(-grid[d] // shape[d]) for d in range(rank))
    if len(block) > len(shape) or any(-(-grid[d] // b) != shape[d]
                                      for d, b in enumerate(block)):
        return None
    axes = None if len(block) == len(grid) else tuple(range(len(block)))
    return Tie(tensor=base, block=tuple(block), axes=axes)


def find_quantized(tensors: Mapping[str, SourceTensor], config: Mapping[str, Any] | None
                   ) -> Quantized:
    """The bases and ties of a source checkpoint (empty when nothing is quantized)."""
    config = config or {}
    quant = config.get("quantization_config")
    quant = quant if isinstance(quant, dict) else {}
    method = str(quant.get("quant_method", "")).lower()
    logical_dtype = _logical_dtype(config)
    out = Quantized()

    def tie(companion: str, base: str, grid: tuple[int, ...],
            block: tuple[int, ...] | None = None) -> None:
        shape = tensors[companion].shape
        found = infer_tie(base, grid, shape, block)
        if found is None:
            from .tp_plan import PlanError
            raise PlanError(f"tensor {companion!r} of shape {list(shape)} is not a grid of "
                            f"blocks of {base!r} (grid {list(grid)}"
                            f"{'' if block is None else f', block {list(block)}'}); convert "
                            "cannot tell which of its elements go with which slice of the "
                            "weight (SPEC 8.4)")
        out.ties[companion] = found

    fp8_block = quant.get("weight_block_size")
    block = tuple(fp8_block) if isinstance(fp8_block, list) and all(
        isinstance(b, int) and b > 0 for b in fp8_block) else None
    for name, src in tensors.items():
        if name.endswith(".weight") and src.dtype.name.startswith("F8_"):
            stem = name[: -len("weight")]
            companions = [stem + s for s in ("weight_scale_inv", "weight_scale", "input_scale")
                          if stem + s in tensors]
            if not companions:
                continue
            out.bases[name] = Base(Logical(dtype=logical_dtype, shape=src.shape))
            for companion in companions:
                wanted = block if companion.endswith("_scale_inv") and block and \
                    len(block) <= len(src.shape) else None
                if wanted is not None and len(wanted) < len(src.shape):
                    wanted = (1,) * (len(src.shape) - len(wanted)) + wanted  # stacked experts
                tie(companion, name, src.shape, wanted)
        elif name.endswith(".qweight") and method in ("awq", "gptq"):
            stem = name[: -len("qweight")]
            bits = int(quant.get("bits") or quant.get("w_bit") or 4)
            pack = 32 // bits
            rows, cols = src.shape
            grid: tuple[int, ...] = (rows, cols * pack) if method == "awq" else (rows * pack, cols)
            act_order = method == "gptq" and bool(quant.get("desc_act"))
            out.bases[name] = Base(Logical(dtype="F16", shape=grid), input_major=True,
                                   act_order=act_order)
            for suffix in ("scales", "qzeros", "g_idx"):
                if stem + suffix in tensors:
                    tie(stem + suffix, name, grid)
        elif name.endswith("_blocks") and src.dtype.name == "U8" and len(src.shape) >= 3:
            scales = name[: -len("_blocks")] + "_scales"
            if scales not in tensors:
                continue
            grid = (*src.shape[:-2], src.shape[-2] * src.shape[-1] * 2)  # two F4 a byte
            out.bases[name] = Base(Logical(dtype=logical_dtype, shape=grid))
            tie(scales, name, grid)
    return out
