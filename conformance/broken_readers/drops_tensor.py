#!/usr/bin/env python3
"""Broken on purpose: it loads every tensor but drops one (the first by name that has data of
its own), as a loader that filters names too eagerly would. The suite must name SPEC 7.2
(pieces); _common.py says what the broken readers share.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import changing, main, minimal_reader  # noqa: E402

#: The SPEC section the suite must name when it catches this reader.
BREAKS = "7.2"
reader = minimal_reader("drops_tensor")


def drop_one(tensors: dict[str, Any]) -> None:
    """The defect: the first tensor by name with data of its own is left out."""
    for name in sorted(tensors):
        shared = sum(t is tensors[name] for t in tensors.values()) > 1
        if tensors[name].data and not shared:
            del tensors[name]
            break


read = changing(reader, drop_one)

if __name__ == "__main__":
    sys.exit(main(read, sys.argv[1:]))
