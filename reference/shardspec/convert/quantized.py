"""Pre-quantized Hugging Face checkpoints: which tensors are quantizer outputs, and of what.

``convert`` must split a scale with its weight, never on its own (SPEC 8.4). This module reads
the names, shapes and ``quantization_config`` of a source checkpoint and says, for each
quantized weight (a *base*), the logical dtype and shape it stands for and how its grid is
oriented, and for each scale, zero point or group index, its
:class:`~shardspec.format.manifest.Tie`.

Recognised layouts (the names vLLM and transformers load):

========================  ==============================  =====================================
method                    base (grid)                     tied tensors
========================  ==============================  =====================================
FP8 blocks (DeepSeek-V3)  ``X.weight`` F8 ``[o, i]``      ``X.weight_scale_inv`` (block from
                                                          ``weight_block_size`` or the shapes)
FP8 per channel / tensor  ``X.weight`` F8 ``[o, i]``      ``X.weight_scale``, ``X.input_scale``
compressed-tensors int8   ``X.weight`` I8 ``[o, i]``      ``X.weight_scale``, ``X.input_scale``,
                                                          ``X.weight_zero_point``
compressed-tensors packed ``X.weight_packed`` I32         ``X.weight_scale``,
                          ``[o, i/p]``                    ``X.weight_zero_point``
AWQ                       ``X.qweight`` I32 ``[i, o/p]``  ``X.scales``, ``X.qzeros``
GPTQ                      ``X.qweight`` I32 ``[i/p, o]``  ``X.scales``, ``X.qzeros``, ``X.g_idx``
MXFP4 (gpt-oss)           ``X_blocks`` U8 ``[.., o, i/32, 16]``  ``X_scales``
========================  ==============================  =====================================

AWQ and GPTQ store the grid input-major (``[i, o]``): a column-parallel split cuts grid dim 1.
compressed-tensors' ``X.weight_shape`` (the logical shape, two values) is no grid of blocks: it
is replicated whole on every rank, as vLLM reads it (:attr:`Quantized.replicated`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..format.dtypes import DType
from ..format.manifest import Logical, Tie
from .tp_plan import PlanError

__all__ = ["Base", "Quantized", "Stored", "find_quantized", "infer_tie"]

#: config ``torch_dtype`` / ``dtype`` -> safetensors dtype of the weights a quantizer replaced.
_LOGICAL_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "half": "F16"}


class Stored(Protocol):
    """What is read of each tensor: a source file's entry, or a manifest's record."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> DType: ...


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
    #: quantizer outputs that describe the whole weight, not blocks of it: whole on every rank
    replicated: set[str] = field(default_factory=set)


def _logical_dtype(config: Mapping[str, Any]) -> str:
    name = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return _LOGICAL_DTYPES.get(name.removeprefix("torch."), "BF16")


def infer_tie(base: str, grid: tuple[int, ...], shape: tuple[int, ...],
              blocks: tuple[int | None, ...] = ()) -> Tie | None:
    """The tie of a tensor of ``shape`` describing blocks of ``grid``, or None where the shape
    does not say which block each element covers.

    One element: one value for the whole base. Otherwise dim d of the tensor follows grid dim d,
    with trailing dims of size 1 inner (a per-channel ``[o, 1]`` scale broadcasts over the
    input features, so a row-parallel split keeps it whole). A dim's block is ``blocks[d]``
    where the config gives it (``weight_block_size``, ``group_size``), 1 where the tensor is as
    long as the grid, the whole grid dim where it has one element; any other size fits many
    blocks (ceil(256 / b) is 2 for every b from 128 to 255), so it is not guessed."""
    if math.prod(shape) == 1:
        return Tie(tensor=base)
    rank = min(len(shape), len(grid))
    while rank > 1 and shape[rank - 1] == 1 and grid[rank - 1] > 1 and (
            rank > len(blocks) or blocks[rank - 1] is None):
        rank -= 1
    block = []
    for d in range(rank):
        given = blocks[d] if d < len(blocks) else None
        if given is not None:
            size = given
        elif shape[d] == grid[d]:
            size = 1
        elif shape[d] == 1:
            size = max(grid[d], 1)
        else:
            return None
        if -(-grid[d] // size) != shape[d]:
            return None
        block.append(size)
    axes = None if len(block) == len(grid) else tuple(range(len(block)))
    return Tie(tensor=base, block=tuple(block), axes=axes)


def _aligned(block: tuple[int, ...] | None, ndim: int) -> tuple[int | None, ...]:
    """A config's block sizes for the last dims of an ``ndim``-dim grid (stacked experts lead
    with their expert dim)."""
    if not block or len(block) > ndim:
        return ()
    return (None,) * (ndim - len(block)) + tuple(block)


def _compressed_weights(quant: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(bits, group size) of a compressed-tensors config's weights, where its groups agree."""
    groups = quant.get("config_groups")
    found = {(w.get("num_bits"), w.get("group_size"))
             for g in (groups.values() if isinstance(groups, dict) else ())
             if isinstance(g, dict) and isinstance(w := g.get("weights"), dict)}
    if len(found) != 1:
        return None, None
    bits, group = found.pop()
    return (bits if isinstance(bits, int) else None), (group if isinstance(group, int) else None)


def find_quantized(tensors: Mapping[str, Stored], config: Mapping[str, Any] | None
                   ) -> Quantized:
    """The bases and ties of a source checkpoint (empty when nothing is quantized)."""
    config = config or {}
    quant = config.get("quantization_config")
    quant = quant if isinstance(quant, dict) else {}
    method = str(quant.get("quant_method", "")).lower()
    logical_dtype = _logical_dtype(config)
    out = Quantized()

    def tie(companion: str, base: str, grid: tuple[int, ...],
            blocks: tuple[int | None, ...] = ()) -> None:
        shape = tensors[companion].shape
        found = infer_tie(base, grid, shape, blocks)
        if found is None:
            raise PlanError(f"tensor {companion!r} of shape {list(shape)} is not a grid of "
                            f"blocks of {base!r} (grid {list(grid)}) that convert can tell: "
                            "give the block in config.json's quantization_config "
                            "(weight_block_size, group_size), SPEC 8.4")
        out.ties[companion] = found

    fp8_block = quant.get("weight_block_size")
    block = tuple(fp8_block) if isinstance(fp8_block, list) and fp8_block and all(
        isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in fp8_block) else None
    group = quant.get("group_size", quant.get("q_group_size"))
    group = group if isinstance(group, int) and not isinstance(group, bool) and group > 0 \
        else None
    compressed = method == "compressed-tensors"
    if compressed:
        bits, ct_group = _compressed_weights(quant)
        group = ct_group or group
    for name, src in tensors.items():
        if name.endswith(".weight") and (src.dtype.name.startswith("F8_") or (
                compressed and src.dtype.name in ("I8", "U8"))):
            stem = name[: -len("weight")]
            companions = [stem + s for s in ("weight_scale_inv", "weight_scale", "input_scale",
                                             "weight_zero_point") if stem + s in tensors]
            if not companions:
                continue
            out.bases[name] = Base(Logical(dtype=logical_dtype, shape=src.shape))
            for companion in companions:
                if companion.endswith("input_scale") and math.prod(tensors[companion].shape) != 1:
                    raise PlanError(f"tensor {companion!r} has shape "
                                    f"{list(tensors[companion].shape)}: an activation scale "
                                    "of more than one value is not a block of its weight, and "
                                    "convert cannot tell how to split it (SPEC 8.4)")
                tie(companion, name, src.shape, _aligned(
                    block or ((1, group) if group else None), len(src.shape)))
        elif compressed and name.endswith(".weight_packed") and src.dtype.name == "I32":
            stem = name[: -len("weight_packed")]
            if bits not in (2, 4, 8) or len(src.shape) != 2:
                raise PlanError(f"tensor {name!r}: compressed-tensors with {bits}-bit values "
                                f"in shape {list(src.shape)} is not a packing convert knows "
                                "(2, 4 or 8 bits packed in I32 along the input features)")
            grid: tuple[int, ...] = (src.shape[0], src.shape[1] * (32 // bits))
            out.bases[name] = Base(Logical(dtype=logical_dtype, shape=grid))
            if stem + "weight_scale" in tensors:
                tie(stem + "weight_scale", name, grid, (None, group))
            if stem + "weight_zero_point" in tensors:  # asymmetric: packed along the outputs
                packed = tensors[stem + "weight_zero_point"].dtype.name == "I32"
                tie(stem + "weight_zero_point", name, grid,
                    ((32 // bits) if packed else None, group))
            if stem + "weight_shape" in tensors:
                out.replicated.add(stem + "weight_shape")
        elif name.endswith(".qweight") and method in ("awq", "gptq"):
            stem = name[: -len("qweight")]
            bits = quant.get("bits") or quant.get("w_bit") or 4
            if bits not in (2, 4, 8) or len(src.shape) < 2:
                raise PlanError(f"tensor {name!r}: {method} with {bits}-bit values in shape "
                                f"{list(src.shape)} is not a packing convert knows (2, 4 or 8 "
                                "bits in I32, at least 2 dims)")
            pack = 32 // bits
            *lead, rows, cols = src.shape
            grid = (*lead, rows, cols * pack) if method == "awq" else (*lead, rows * pack, cols)
            act_order = method == "gptq" and bool(quant.get("desc_act"))
            out.bases[name] = Base(Logical(dtype="F16", shape=grid), input_major=True,
                                   act_order=act_order)
            lead_blocks = (None,) * len(lead)
            # act-order: the scales' and zero points' rows follow g_idx's groups, which are no
            # blocks of the grid (SPEC 8.4); they stay untied and such a weight is not split
            tied: dict[str, tuple[int | None, ...]] = {"g_idx": ()} if act_order else {
                "scales": (*lead_blocks, group, None), "qzeros": (*lead_blocks, group, pack),
                "g_idx": ()}
            for suffix, blocks in tied.items():
                if stem + suffix in tensors:
                    tie(stem + suffix, name, grid, blocks)
        elif name.endswith("_blocks") and src.dtype.name == "U8" and len(src.shape) >= 3:
            scales = name[: -len("_blocks")] + "_scales"
            if scales not in tensors:
                continue
            grid = (*src.shape[:-2], src.shape[-2] * src.shape[-1] * 2)  # two F4 a byte
            out.bases[name] = Base(Logical(dtype=logical_dtype, shape=grid))
            tie(scales, name, grid, (*(None,) * (len(grid) - 1), 32))
    return out
