#!/usr/bin/env python3
"""Broken on purpose: it refuses every rank that holds several pieces of one tensor, as a reader
written before format 1.3 would (one piece a rank), instead of returning their join.

The suite must name SPEC 7.2 (pieces: rules 3, 6 and 7 allow and join several pieces a rank),
with the golden vectors and with the generated checkpoints alone; _common.py says what the
broken readers share.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import main, minimal_reader  # noqa: E402

#: The SPEC section the suite must name when it catches this reader.
BREAKS = "7.2"
reader = minimal_reader("refuses_joins")
joined = reader.join


def one_piece_only(pieces: list[Any]) -> Any:
    """The defect: several pieces on the rank are refused rather than joined."""
    if len(pieces) > 1:
        reader.fail("piece-duplicate", f"this rank holds {len(pieces)} pieces of one tensor")
    return joined(pieces)


reader.join = one_piece_only
read = reader.read

if __name__ == "__main__":
    sys.exit(main(read, sys.argv[1:]))
