#!/usr/bin/env python3
"""Broken on purpose: it joins a rank's pieces of a tensor in the order the manifest lists
them, not in increasing offset (SPEC 7.2 rule 7), as a loader that concatenates the pieces it
meets would.

The suite must name SPEC 7.2 (pieces); _common.py says what the broken readers share.
"""

from __future__ import annotations

import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import main, minimal_reader  # noqa: E402

#: The SPEC section the suite must name when it catches this reader.
BREAKS = "7.2"
reader = minimal_reader("joins_in_manifest_order")
checked = reader.read_manifest


class Listed(list[int]):
    """A piece's offset that sorts by where the manifest lists the piece: the defect, for the
    reader's join sorts a rank's pieces by their offsets."""

    def __init__(self, offset: list[int], index: int) -> None:
        super().__init__(offset)
        self.index = index

    def __lt__(self, other: Any) -> bool:
        return self.index < other.index


def listed_manifest(root: str, ignore: Collection[str], warnings: list[str]) -> dict[str, Any]:
    """The manifest, checked as the minimal reader checks it, with each offset a Listed."""
    m = checked(root, ignore, warnings)
    for record in m["tensors"].values():
        for index, piece in enumerate(record.get("pieces", [])):
            if "offset" in piece:
                piece["offset"] = Listed(piece["offset"], index)
    return m


reader.read_manifest = listed_manifest
read = reader.read

if __name__ == "__main__":
    sys.exit(main(read, sys.argv[1:]))
