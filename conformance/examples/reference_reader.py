#!/usr/bin/env python3
"""The reference reader (the ``shardspec`` package) as a conformance adapter.

    python reference_reader.py CHECKPOINT_DIR RANK OUTPUT_FILE
    python reference_reader.py --batch        (requests on stdin, one a line)

Loads the rank with ``shardspec.open(...).load_rank(rank, "cpu", verify=True)`` and writes
every tensor it returns (aliases as entries of their own) to OUTPUT_FILE as a plain safetensors
file, with the spec dtype and element shape the manifest records (torch holds F4 and F6
packed; the bytes are the same). On an invalid checkpoint it prints the finding and exits 1,
writing nothing. ``SHARDSPEC_IGNORE_EXTENSIONS`` (comma-separated) names must-understand
extensions the user allows ignoring.

Importing torch makes each call of the first form take a second or two. The batch form
(``shardspec conformance --batch --reader "python reference_reader.py --batch"``) imports it
once: each line ``CHECKPOINT_DIR<TAB>RANK<TAB>OUTPUT_FILE<TAB>IGNORE_EXTENSIONS`` is answered
with ``ok`` or ``error ...`` on a line of its own (conformance/README.md).
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from collections.abc import Sequence


def _import_shardspec() -> None:
    try:
        import shardspec  # noqa: F401
    except ImportError:  # a source checkout: the package lives in reference/
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "reference"))


def load(checkpoint: str, rank: str, output: str, ignore: Sequence[str]) -> str | None:
    """Write the rank's tensors to ``output``; the error to report, or None."""
    import shardspec
    from shardspec.testing.adapter import reference_read

    if not re.fullmatch(r"[0-9]{1,9}", rank):
        return f"the rank {rank!r} is not a decimal integer"
    try:
        reference_read(checkpoint, int(rank), output, ignore)
    except shardspec.ShardspecError as exc:
        return str(exc)
    return None


def extension_names(text: str) -> list[str]:
    """SHARDSPEC_IGNORE_EXTENSIONS's names: cut at commas, spaces and tabs around each removed,
    empty items skipped (conformance/README.md)."""
    return [name for item in text.split(",") if (name := item.strip(" \t"))]


def batch() -> int:
    """Answer one request a line until stdin closes."""
    for line in sys.stdin:
        fields = line.rstrip("\n").split("\t")
        if len(fields) != 4:
            print(f"error a request has 4 tab-separated fields, got {len(fields)}", flush=True)
            continue
        checkpoint, rank, output, ignore = fields
        try:
            problem = load(checkpoint, rank, output, extension_names(ignore))
        except Exception as exc:  # noqa: BLE001 - any failure refuses this request only
            traceback.print_exc()
            problem = f"{type(exc).__name__}: {exc}"
        print("ok" if problem is None else f"error {' '.join(problem.split())}", flush=True)
    return 0


def main(argv: list[str]) -> int:
    _import_shardspec()
    if argv == ["--batch"]:
        return batch()
    if len(argv) != 3:
        print("usage: reference_reader.py CHECKPOINT_DIR RANK OUTPUT_FILE | --batch",
              file=sys.stderr)
        return 2
    ignore = extension_names(os.environ.get("SHARDSPEC_IGNORE_EXTENSIONS", ""))
    problem = load(argv[0], argv[1], argv[2], ignore)
    if problem is not None:
        print(f"error {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
