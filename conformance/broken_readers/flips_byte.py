#!/usr/bin/env python3
"""Broken on purpose: one bit of the first byte of the first tensor (by name) that has data is
flipped, as a reader with an off-by-one offset or a corrupting copy would return it. The suite
must name SPEC 7.2 (pieces); _common.py says what the broken readers share.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import changing, main, minimal_reader  # noqa: E402

#: The SPEC section the suite must name when it catches this reader.
BREAKS = "7.2"
reader = minimal_reader("flips_byte")


def flip_a_bit(tensors: dict[str, Any]) -> None:
    """The defect: the low bit of the first tensor's first byte is flipped."""
    for name in sorted(tensors):
        tensor = tensors[name]
        if tensor.data and tensor.dtype not in ("F4", "F6_E2M3", "F6_E3M2"):
            data = bytearray(tensor.data)
            data[0] ^= 0x01
            tensors[name] = tensor._replace(data=bytes(data))
            break


read = changing(reader, flip_a_bit)

if __name__ == "__main__":
    sys.exit(main(read, sys.argv[1:]))
