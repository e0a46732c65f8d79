#!/usr/bin/env python3
"""Broken on purpose: it ignores the rank argument and always loads rank 0, as a loader that
takes the tensor-parallel rank for the global rank would on another stage.

The suite must name SPEC 11.1 (the reader procedure); _common.py says what the broken
readers share.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import main, minimal_reader  # noqa: E402

#: The SPEC section the suite must name when it catches this reader.
BREAKS = "11.1"
reader = minimal_reader("ignores_rank")


def read(directory: str, rank: int, output: str, ignore_extensions: Sequence[str] = ()) -> None:
    tensors, _ = reader.load_rank(directory, 0, ignore_extensions=ignore_extensions)
    reader.write_safetensors(output, tensors)

if __name__ == "__main__":
    sys.exit(main(read, sys.argv[1:]))
