#!/usr/bin/env python3
"""Broken on purpose: it reads any format version, taking an unknown major version for a
newer minor one (unknown fields ignored), so it loads a 2.0 checkpoint it cannot understand.

The suite must name SPEC 4.2 (version rules); _common.py says what the broken readers share.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import main, minimal_reader  # noqa: E402

#: The SPEC section the suite must name when it catches this reader.
BREAKS = "4.2"
reader = minimal_reader("reads_newer_major")


def _any_version(manifest: object, warnings: list[str]) -> bool:
    """The defect: another major version is read as if it were a newer minor version."""
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    match = re.fullmatch(reader._VERSION, version) if isinstance(version, str) else None
    return match is not None and (int(match[1]), int(match[2])) != (1, 0)


reader.check_version = _any_version
read = reader.read

if __name__ == "__main__":
    sys.exit(main(read, sys.argv[1:]))
