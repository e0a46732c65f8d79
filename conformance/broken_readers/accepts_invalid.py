#!/usr/bin/env python3
"""Broken on purpose: it skips the coverage check, so it accepts checkpoints whose pieces
overlap or leave gaps, and returns data that no global tensor has.

The suite must name SPEC 7.3 (coverage); _common.py says what the broken readers share.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import main, minimal_reader  # noqa: E402

#: The SPEC section the suite must name when it catches this reader.
BREAKS = "7.3"
reader = minimal_reader("accepts_invalid")


def _no_coverage_check(name: str, shape: list[int], pieces: list[dict[str, object]]) -> None:
    """The defect: pieces are never checked to cover their tensor exactly once."""


reader.check_coverage = _no_coverage_check
read = reader.read

if __name__ == "__main__":
    sys.exit(main(read, sys.argv[1:]))
