#!/usr/bin/env python3
"""Broken on purpose: it ignores every extension, must_understand or not, so it loads data an
unknown extension changed (encrypted or repacked) as if nothing were there.

A conformance adapter (``ignores_must_understand.py CHECKPOINT_DIR RANK OUTPUT_FILE``) built on a
private copy of conformance/examples/minimal_reader.py with one defect. The suite must
catch it and name SPEC 4.4 (extensions); tests/testing/test_conformance.py checks that it does.
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


def read(directory: str, rank: int, output: str, ignore_extensions: Sequence[str] = ()) -> None:
    reader.read(directory, rank, output, ignore_extensions)

if __name__ == "__main__":
    sys.exit(main(read, sys.argv[1:]))
