"""What the benchmarks share, one module a subject (``load``, ``vllm``, ``hostile``), and
what every subject uses: the synthetic model (``synthetic``), the peers a load is compared
with (``peers``), and here the repository's paths and the scratch directory.

A benchmark is run as a script (``python benchmarks/load/bench_load.py``); it puts
``benchmarks/`` on ``sys.path`` first, as its first lines, so that ``import harness`` finds
this package.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: The repository's root.
REPO = Path(__file__).resolve().parents[2]
#: The reference implementation, for the child processes a benchmark starts (``PYTHONPATH``).
REFERENCE = REPO / "reference"
#: The tests' helpers some benchmarks use too: the S3 server, the vLLM runner, the writers of
#: Hugging Face and quantized models.
TEST_HELPERS = REPO / "tests" / "helpers"
#: Where benchmarks write their checkpoints unless told (``SHARDSPEC_BENCH_OUT``).
OUT = Path(os.environ.get("SHARDSPEC_BENCH_OUT", REPO / "benchmarks" / "out"))


def use_test_helpers() -> None:
    """Make the tests' helpers importable (``import s3_server``, ``import hf_helpers``)."""
    if str(TEST_HELPERS) not in sys.path:
        sys.path.insert(0, str(TEST_HELPERS))


@contextmanager
def removed_after(work: Path, keep: bool = False) -> Iterator[Path]:
    """``work``, removed when the benchmark ends, unless ``keep`` or the environment's
    ``KEEP`` is set (then its path is printed)."""
    try:
        yield work
    finally:
        if keep or os.environ.get("KEEP"):
            print("kept", work)
        else:
            shutil.rmtree(work, ignore_errors=True)
