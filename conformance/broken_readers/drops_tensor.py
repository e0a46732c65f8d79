#!/usr/bin/env python3
"""Broken on purpose: it loads every tensor but drops one (the first by name that has data of
its own), as a loader that filters names too eagerly would.

A conformance adapter (``drops_tensor.py CHECKPOINT_DIR RANK OUTPUT_FILE``) built on a
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
reader = minimal_reader("drops_tensor")


def read(directory: str, rank: int, output: str, ignore_extensions: Sequence[str] = ()) -> None:
    tensors, _ = reader.load_rank(directory, rank, ignore_extensions=ignore_extensions)
    for name in sorted(tensors):
        shared = sum(t is tensors[name] for t in tensors.values()) > 1
        if tensors[name].data and not shared:
            del tensors[name]
            break
    reader.write_safetensors(output, tensors)

if __name__ == "__main__":
    sys.exit(main(read, sys.argv[1:]))
