#!/usr/bin/env python3
"""Broken on purpose: it ignores every extension, must_understand or not, so it loads data an
unknown extension changed (encrypted or repacked) as if nothing were there.

The suite must name SPEC 4.4 (extensions); _common.py says what the broken readers share.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import main, minimal_reader  # noqa: E402

#: The SPEC section the suite must name when it catches this reader.
BREAKS = "4.4"
reader = minimal_reader("ignores_must_understand")


def _ignore_all(manifest: dict[str, object], ignore: Sequence[str], warnings: list[str]) -> None:
    """The defect: must_understand is never looked at."""


reader.check_extensions = _ignore_all
read = reader.read

if __name__ == "__main__":
    sys.exit(main(read, sys.argv[1:]))
