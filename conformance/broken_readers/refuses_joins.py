#!/usr/bin/env python3
"""Broken on purpose: it refuses every rank that holds several pieces of one tensor, as a reader
written before format 1.3 would (one piece a rank), instead of returning their join.

A conformance adapter (``refuses_joins.py CHECKPOINT_DIR RANK OUTPUT_FILE``) built on a
private copy of conformance/examples/minimal_reader.py with one defect. The suite must
catch it and name SPEC 7.2 (pieces: rules 3, 6 and 7 allow and join several pieces a rank);
tests/testing/test_conformance.py checks that it does, with the golden vectors and with the
generated
checkpoints alone.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
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


def read(directory: str, rank: int, output: str, ignore_extensions: Sequence[str] = ()) -> None:
    tensors, _ = reader.load_rank(directory, rank, ignore_extensions=ignore_extensions)
    reader.write_safetensors(output, tensors)

if __name__ == "__main__":
    sys.exit(main(read, sys.argv[1:]))
