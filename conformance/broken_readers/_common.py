"""What the deliberately broken readers share: a private copy of the minimal reader to break,
the read that loads a rank, changes its tensors and writes them, and the adapter protocol's
command line around a ``read`` function.

Each reader in this folder is a conformance adapter (``NAME.py CHECKPOINT_DIR RANK
OUTPUT_FILE``) built on a private copy of conformance/examples/minimal_reader.py with one
defect. The suite must catch it and name the SPEC section in its ``BREAKS``;
tests/testing/test_conformance.py checks that it does.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

MINIMAL_READER = Path(__file__).resolve().parents[1] / "examples" / "minimal_reader.py"

#: An adapter's read: ``(CHECKPOINT_DIR, RANK, OUTPUT_FILE, ignored extensions)``.
Read = Callable[[str, int, str, Sequence[str]], None]


def minimal_reader(tag: str) -> ModuleType:
    """A fresh copy of conformance/examples/minimal_reader.py: patching it breaks no one else."""
    spec = importlib.util.spec_from_file_location(f"minimal_reader_{tag}", MINIMAL_READER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def changing(reader: ModuleType, change: Callable[[dict[str, Any]], None]) -> Read:
    """A read that loads the rank as ``reader`` does, hands its tensors (by name) to ``change``,
    the defect, and writes what ``change`` leaves."""

    def read(directory: str, rank: int, output: str, ignore_extensions: Sequence[str] = ()) -> None:
        tensors, _ = reader.load_rank(directory, rank, ignore_extensions=ignore_extensions)
        change(tensors)
        reader.write_safetensors(output, tensors)

    return read


def main(read: Read, argv: list[str]) -> int:
    """``CHECKPOINT_DIR RANK OUTPUT_FILE``: exit 0 with the output written, 1 on refusal."""
    if len(argv) != 3 or not re.fullmatch(r"[0-9]{1,9}", argv[1]):
        print("usage: CHECKPOINT_DIR RANK OUTPUT_FILE", file=sys.stderr)
        return 2
    ignore = [n for item in os.environ.get("SHARDSPEC_IGNORE_EXTENSIONS", "").split(",")
            if (n := item.strip(" \t"))]
    try:
        read(argv[0], int(argv[1]), argv[2], ignore)
    except Exception as exc:  # noqa: BLE001 - every refusal, whatever its type
        print(f"error {exc}", file=sys.stderr)
        return 1
    return 0
