#!/usr/bin/env python3
"""Broken on purpose: BF16 tensors come back labelled F16 (same size, another meaning), the
classic bfloat16/float16 mix-up. The suite must name SPEC 6.4 (dtypes); _common.py says what
the broken readers share.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import changing, main, minimal_reader  # noqa: E402

#: The SPEC section the suite must name when it catches this reader.
BREAKS = "6.4"
reader = minimal_reader("mislabels_dtype")


def bf16_as_f16(tensors: dict[str, Any]) -> None:
    """The defect: every BF16 tensor is relabelled F16."""
    for name, tensor in tensors.items():
        if tensor.dtype == "BF16":
            tensors[name] = tensor._replace(dtype="F16")


read = changing(reader, bf16_as_f16)

if __name__ == "__main__":
    sys.exit(main(read, sys.argv[1:]))
