#!/usr/bin/env python3
"""Broken on purpose: BF16 tensors come back labelled F16 (same size, another meaning), the
classic bfloat16/float16 mix-up.

A conformance adapter (``mislabels_dtype.py CHECKPOINT_DIR RANK OUTPUT_FILE``) built on a
private copy of conformance/examples/minimal_reader.py with one defect. The suite must
catch it and name SPEC 6.4 (dtypes); tests/testing/test_conformance.py checks that it does.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import main, minimal_reader  # noqa: E402

#: The SPEC section the suite must name when it catches this reader.
BREAKS = "6.4"
reader = minimal_reader("mislabels_dtype")


def read(directory: str, rank: int, output: str, ignore_extensions: Sequence[str] = ()) -> None:
    tensors, _ = reader.load_rank(directory, rank, ignore_extensions=ignore_extensions)
    for name, tensor in tensors.items():
        if tensor.dtype == "BF16":
            tensors[name] = tensor._replace(dtype="F16")
    reader.write_safetensors(output, tensors)

if __name__ == "__main__":
    sys.exit(main(read, sys.argv[1:]))
