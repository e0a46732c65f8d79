"""The shardspec conformance suite as a library, for any implementation to reuse.

- :mod:`~shardspec.testing.strategies`: Hypothesis strategies for valid checkpoints (written
  with the reference writer, with what each rank must load; what that writer cannot write is
  done by :mod:`~shardspec.testing.handwritten`).
- :mod:`~shardspec.testing.broken`: broken checkpoints derived from them, with the error a
  reader must refuse them with (:mod:`~shardspec.testing.mutations`, the machinery;
  :mod:`~shardspec.testing.broken_manifest` and :mod:`~shardspec.testing.broken_files`, the
  ways to break them).
- :mod:`~shardspec.testing.adapter`: the adapter protocol (``CMD CHECKPOINT_DIR RANK
  OUTPUT_FILE``): run a reader command or a Python function, read its output strictly.
- :mod:`~shardspec.testing.checks`: judge one load or refusal, naming the SPEC requirement a
  failure breaks.
- :mod:`~shardspec.testing.runner`: the whole suite (vectors, then generated checkpoints), its
  report and JUnit XML; ``shardspec conformance`` is its command line.
- :mod:`~shardspec.testing.profiles`: Hypothesis profiles ``ci`` and ``thorough``, picked by
  ``SHARDSPEC_HYPOTHESIS_PROFILE``.
- :mod:`~shardspec.testing.adversarial`: large manifests built to cost a reader time or
  memory (tests and ``benchmarks/hostile/bench_hostile.py``).

Needs Hypothesis (``pip install 'shardspec[conformance]'``).
"""

from __future__ import annotations

from .adapter import (
    DEFAULT_TIMEOUT,
    IGNORE_EXTENSIONS_ENV,
    CommandReader,
    Outcome,
    PythonReader,
    RankTensors,
    Reader,
    TensorData,
    read_output,
    reference_load,
    reference_read,
    write_output,
)
from .broken import broken_checkpoints, mutation_kinds
from .checks import CheckResult, diagnose, judge_load, judge_refusal
from .mutations import Mutation
from .profiles import PROFILE_ENV, load_profile
from .runner import SuiteResult, find_vectors, print_report, run_suite, write_junit
from .strategies import CheckpointSpec, GeneratedCheckpoint, checkpoint_specs, checkpoints

__all__ = [
    "DEFAULT_TIMEOUT",
    "IGNORE_EXTENSIONS_ENV",
    "PROFILE_ENV",
    "CheckResult",
    "CheckpointSpec",
    "CommandReader",
    "GeneratedCheckpoint",
    "Mutation",
    "Outcome",
    "PythonReader",
    "RankTensors",
    "Reader",
    "SuiteResult",
    "TensorData",
    "broken_checkpoints",
    "checkpoint_specs",
    "checkpoints",
    "diagnose",
    "find_vectors",
    "judge_load",
    "judge_refusal",
    "load_profile",
    "mutation_kinds",
    "print_report",
    "read_output",
    "reference_load",
    "reference_read",
    "run_suite",
    "write_junit",
    "write_output",
]
