"""One measured operation in a fresh Python process, for the hostile-input benchmarks.

Each case runs alone, so that one's memory does not count against the next. The child prints
``RESULT [seconds, peak RSS bytes, answer]`` on its original stderr (its stdout and stderr
otherwise go to /dev/null); :func:`measure` runs it and reads that line back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["BOUND_BYTES", "BOUND_SECONDS", "cli_script", "measure"]

#: The bound of issues 20 and 41: no input under 10 MB takes more than this time or memory.
BOUND_SECONDS, BOUND_BYTES = 5.0, 1024**3

REFERENCE = Path(__file__).resolve().parents[1] / "reference"

_CLI = r"""
import json, os, resource, sys, time
{preload}
from shardspec.cli import main
sys.argv = ["shardspec", *json.loads(sys.argv[1])]
result = os.dup(2)
null = os.open(os.devnull, os.O_WRONLY); os.dup2(null, 1); os.dup2(null, 2)
started = time.perf_counter()
try:
    main()
except SystemExit as exc:
    code = exc.code
else:
    code = 0
elapsed = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
os.write(result, ("\nRESULT " + json.dumps([elapsed, peak, f"exit {code}"]) + "\n").encode())
"""


def cli_script(preload: str = "import torch") -> str:
    """A child that runs the ``shardspec`` command whose arguments are its first argument (a
    JSON list), after ``preload`` (imports the command makes lazily: before the clock)."""
    return _CLI.replace("{preload}", preload)


def measure(script: str, args: Sequence[str], *, timeout: float = 1800,
            env: dict[str, str] | None = None) -> tuple[float, int, Any]:
    """(seconds, peak RSS bytes, answer) of ``script`` run as ``python -c script *args``."""
    env = {**(env if env is not None else os.environ), "PYTHONPATH": str(REFERENCE)}
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                          text=True, env=env, timeout=timeout, stdin=subprocess.DEVNULL)
    line = [x for x in done.stderr.splitlines() if x.startswith("RESULT ")]
    if not line:
        raise RuntimeError(f"{args}: no result\n{done.stderr[-2000:]}")
    elapsed, peak, answer = json.loads(line[-1][len("RESULT "):])
    return elapsed, peak, answer
