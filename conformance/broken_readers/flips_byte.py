#!/usr/bin/env python3
"""Broken on purpose: one bit of the first byte of the first tensor (by name) that has data is
flipped, as a reader with an off-by-one offset or a corrupting copy would return it.

A conformance adapter (``flips_byte.py CHECKPOINT_DIR RANK OUTPUT_FILE``) built on a
private copy of conformance/examples/minimal_reader.py with one defect. The suite must
catch it and name SPEC 7.2 (pieces); tests/testing/test_conformance.py checks that it does.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import main, minimal_reader  # noqa: E402

#: The SPEC section the suite must name when it catches this reader.
BREAKS = "7.2"
reader = minimal_reader("flips_byte")


def read(directory: str, rank: int, output: str, ignore_extensions: Sequence[str] = ()) -> None:
    tensors, _ = reader.load_rank(directory, rank, ignore_extensions=ignore_extensions)
    for name in sorted(tensors):
        tensor = tensors[name]
        if tensor.data and tensor.dtype not in ("F4", "F6_E2M3", "F6_E3M2"):
            data = bytearray(tensor.data)
            data[0] ^= 0x01
            tensors[name] = tensor._replace(data=bytes(data))
            break
    reader.write_safetensors(output, tensors)

if __name__ == "__main__":
    sys.exit(main(read, sys.argv[1:]))
