"""Block FP8 quantization for ``convert --quantize fp8``.

The layout DeepSeek-V3 and Qwen3's FP8 releases ship and vLLM's ``fp8`` method loads with
``weight_block_size``: each linear ``weight`` becomes F8_E4M3, and ``weight_scale_inv`` (F32,
one value per 128 x 128 block, the last blocks possibly smaller) holds the factor that
dequantizes it, ``weight ≈ weight_fp8 × scale``. A block's scale is its largest magnitude over
448 (E4M3's largest finite value), so no element saturates; an all-zero block has scale 1.

Pieces are quantized one at a time: a tensor-parallel piece that starts and ends on block
boundaries gives exactly the bytes and scales of the same slice of the whole tensor quantized,
which is what lets convert quantize while it streams.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

__all__ = ["BLOCK", "CONFIG", "SCALE_SUFFIX", "quantize_block", "quantizable"]

#: Block edge, in elements, along both dims.
BLOCK = 128
#: The scale tensor's name is the weight's with ``weight`` replaced by this.
SCALE_SUFFIX = "weight_scale_inv"
#: E4M3's largest finite magnitude.
_FP8_MAX = 448.0
#: The ``quantization_config`` written into config.json and the manifest's quantization record.
CONFIG: dict[str, Any] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                          "weight_block_size": [BLOCK, BLOCK]}

#: Linear projections that are quantized; embeddings, norms, routers and the LM head stay.
_LINEAR = re.compile(r"(^|\.)([a-z0-9_]*_proj|w[123]|fc[12]|dense|query_key_value)\.weight$")


def quantizable(name: str, dtype: str, shape: tuple[int, ...]) -> bool:
    """Whether ``--quantize fp8`` turns this tensor into FP8 with block scales."""
    return (len(shape) == 2 and dtype in ("BF16", "F16", "F32") and "lm_head" not in name
            and bool(_LINEAR.search(name)))


def quantize_block(data: bytes | bytearray, dtype: str, shape: tuple[int, ...]
                   ) -> tuple[bytes, bytes]:
    """(F8_E4M3 bytes, F32 scale bytes) of a 2-D piece whose edges lie on block boundaries."""
    import torch

    from ..format.dtypes import DTYPES

    torch_dtype = DTYPES[dtype].torch_dtype
    assert torch_dtype is not None
    source = torch.frombuffer(bytearray(data), dtype=torch_dtype)
    weight = source.reshape(shape).to(torch.float32)
    rows, cols = shape
    blocks_r, blocks_c = -(-rows // BLOCK), -(-cols // BLOCK)
    padded = torch.zeros(blocks_r * BLOCK, blocks_c * BLOCK, dtype=torch.float32)
    padded[:rows, :cols] = weight
    tiles = padded.reshape(blocks_r, BLOCK, blocks_c, BLOCK)
    amax = tiles.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / _FP8_MAX, torch.ones_like(amax))
    quantized = (tiles / scale[:, None, :, None]).reshape(padded.shape)[:rows, :cols]
    fp8 = quantized.clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn).contiguous()
    return (fp8.view(torch.uint8).numpy().tobytes(),
            np.ascontiguousarray(scale.numpy(), dtype="<f4").tobytes())
