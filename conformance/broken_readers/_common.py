"""What the deliberately broken readers share: a private copy of the minimal reader to break,
and the adapter protocol's command line around a ``read`` function."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

MINIMAL_READER = Path(__file__).resolve().parents[1] / "examples" / "minimal_reader.py"


def minimal_reader(tag: str) -> ModuleType:
    """A fresh copy of conformance/examples/minimal_reader.py: patching it breaks no one else."""
    spec = importlib.util.spec_from_file_location(f"minimal_reader_{tag}", MINIMAL_READER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(read: Callable[[str, int, str, Sequence[str]], None], argv: list[str]) -> int:
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
