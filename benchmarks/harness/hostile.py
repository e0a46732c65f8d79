"""The hostile-input benchmarks' harness: one measured operation in a fresh Python process,
and the table of medians against the bound.

Each case runs alone, so that one's memory does not count against the next. The child prints
``RESULT [seconds, peak RSS bytes, answer]`` on its original stderr (its stdout and stderr
otherwise go to /dev/null where it runs a command); :func:`measure` runs it and reads that
line back. :func:`cli_script` is a child that runs one ``shardspec`` command, :func:`op_script`
one that runs an operation named on its command line, as a command or through the API.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from harness import REFERENCE

__all__ = ["BOUND_BYTES", "BOUND_SECONDS", "begin", "cli_script", "finish", "measure", "op_script",
           "parse_args", "start", "within_bound"]

#: The bound of issues 20 and 41: no input under 10 MB takes more than this time or memory.
BOUND_SECONDS, BOUND_BYTES = 5.0, 1024**3

#: Runs ``main`` of the CLI with ``sys.argv`` set, its output to /dev/null: ``code``, timed.
_RUN_MAIN = r"""
from shardspec.cli import main
result = os.dup(2)
null = os.open(os.devnull, os.O_WRONLY); os.dup2(null, 1); os.dup2(null, 2)
started = time.perf_counter()
try:
    main()
except SystemExit as exc:
    code = exc.code
else:
    code = 0
answer = f"exit {code}"
"""
_REPORT = r"""
elapsed = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
os.write(result, ("\nRESULT " + json.dumps([elapsed, peak, answer]) + "\n").encode())
"""


def cli_script(preload: str = "import torch") -> str:
    """A child that runs the ``shardspec`` command whose arguments are its first argument (a
    JSON list), after ``preload`` (imports the command makes lazily: before the clock)."""
    return ("import json, os, resource, sys, time\n" + preload
            + '\nsys.argv = ["shardspec", *json.loads(sys.argv[1])]' + _RUN_MAIN + _REPORT)


def op_script(commands: dict[str, list[str]], api: str, preamble: str = "") -> str:
    """A child run as ``python -c script OP PATH``: an ``OP`` of ``commands`` runs that
    ``shardspec`` command (``"{path}"`` in its arguments is ``PATH``), any other ``api``, code
    that sees ``op`` and ``path``, imports what it needs, then sets ``started`` (the clock)
    and ``answer``. ``preamble`` runs first in either case."""
    body = "\n".join("    " + line for line in _RUN_MAIN.strip().splitlines())
    return (f"import json, os, resource, sys, time\n{preamble}\n"
            "op, path = sys.argv[1], sys.argv[2]\nresult = 2\n"
            f"COMMANDS = {commands!r}\n"
            "if op in COMMANDS:\n"
            "    sys.argv = ['shardspec', *(path if a == '{path}' else a for a in COMMANDS[op])]\n"
            f"{body}\nelse:\n" + "\n".join("    " + line for line in api.strip().splitlines())
            + _REPORT)


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


def parse_args(doc: str, add: Callable[[argparse.ArgumentParser], object] = lambda _: None,
               *, only: bool = True) -> argparse.Namespace:
    """``--repeats``, ``--json`` and (with ``only``) ``--only``, with what ``add`` adds."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    add(parser)
    parser.add_argument("--repeats", type=int, default=3)
    if only:
        parser.add_argument("--only", help="comma-separated case names")
    parser.add_argument("--json", type=Path)
    return parser.parse_args()


Case = TypeVar("Case")


def start(repeats: int, cases: dict[str, Case] | None = None, only: str | None = None,
          *, bound: str = "", table: tuple[str, ...] = ()) -> dict[str, Case]:
    """Print the run's first line (the bound ``bound``, or the time and memory bound, and the
    medians' count), then the lines of ``table`` (its head); return the ``cases`` that
    ``only`` names (all without it)."""
    bound = bound or (f"bound {BOUND_SECONDS:g} s, {BOUND_BYTES / 2**30:g} GiB peak RSS; "
                      f"median of {repeats}")
    print(f"python {platform.python_version()}, {os.cpu_count()} cpus, load average "
          f"{os.getloadavg()[0]:.1f} at start; {bound}")
    for line in table:
        print(line)
    cases = cases or {}
    return {k: v for k, v in cases.items() if k in only.split(",")} if only else cases


def begin(doc: str, cases: dict[str, Case], table: tuple[str, ...]
          ) -> tuple[argparse.Namespace, dict[str, Case]]:
    """:func:`parse_args`, then :func:`start`: the options, and the cases they choose."""
    args = parse_args(doc)
    return args, start(args.repeats, cases, args.only, table=table)


def within_bound(runs: list[tuple[float, int, Any]]) -> tuple[dict[str, Any], str]:
    """A case's repeats: its row's fields (the first answer, every time, the largest peak,
    whether the median time and the peak are within the bound) and its table's last cells
    (median s, peak MiB, pass or FAIL)."""
    seconds = statistics.median(r[0] for r in runs)
    peak = max(r[1] for r in runs)
    ok = seconds <= BOUND_SECONDS and peak <= BOUND_BYTES
    fields = {"answer": runs[0][2], "seconds": [r[0] for r in runs], "peak_rss": peak,
              "within_bound": ok}
    return fields, f"{seconds:.2f} | {peak / 2**20:.0f} | {'pass' if ok else 'FAIL'} |"


def finish(rows: list[dict[str, Any]], json_path: Path | None) -> None:
    """The run's last line, and its rows into ``json_path`` where given."""
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    if json_path:
        json_path.write_text(json.dumps(rows, indent=2))
