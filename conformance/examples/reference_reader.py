#!/usr/bin/env python3
"""The reference reader (the ``shardspec`` package) as a conformance adapter.

    python reference_reader.py CHECKPOINT_DIR RANK OUTPUT_FILE

Loads the rank with ``shardspec.open(...).load_rank(rank, "cpu", verify=True)`` and writes
every tensor it returns (aliases as entries of their own) to OUTPUT_FILE as a plain safetensors
file, with the spec dtype and element shape the manifest records (torch holds F4 and F6
packed; the bytes are the same). On an invalid checkpoint it prints the finding and exits 1,
writing nothing. ``SHARDSPEC_IGNORE_EXTENSIONS`` (comma-separated) names must-understand
extensions the user allows ignoring. Importing torch makes each call take a second or two.
"""

from __future__ import annotations

import os
import re
import sys


def main(argv: list[str]) -> int:
    if len(argv) != 3 or not re.fullmatch(r"[0-9]{1,9}", argv[1]):
        print("usage: reference_reader.py CHECKPOINT_DIR RANK OUTPUT_FILE", file=sys.stderr)
        return 2
    try:
        import shardspec
    except ImportError:  # a source checkout: the package lives in reference/
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "reference"))
        import shardspec
    from shardspec.testing.adapter import reference_read

    ignore = [n for n in os.environ.get("SHARDSPEC_IGNORE_EXTENSIONS", "").split(",") if n]
    try:
        reference_read(argv[0], int(argv[1]), argv[2], ignore)
    except shardspec.ShardspecError as exc:
        print(f"error {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
