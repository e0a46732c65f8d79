"""Adversarial manifests of up to about 10 MB: time and peak memory of open, validate, inspect.

The stated bound (issue 20): no manifest under 10 MB takes more than 5 s or 1 GB to open,
validate or inspect. Each manifest of :mod:`shardspec.testing.adversarial` (and the invalid
variants below) is written alone into a directory (no data file: open and inspect read the
manifest only, validate reports each data file missing), and each operation runs in a fresh
child process, so that one's memory does not count against the next:

- ``open``: ``shardspec.open(path)`` (a ShardspecError is an answer, counted like a return);
- ``validate``: ``shardspec.validate(path)``, and ``len(report.to_dict())`` of its findings;
- ``validate-cli``: the ``shardspec validate`` command (text), its output to /dev/null;
- ``inspect``: the ``shardspec inspect --json`` command, its output to /dev/null.

Time is the operation alone (after imports, torch's included: the commands import it lazily,
and it is resolved before the clock in the API cases); memory is the child's peak resident set
(``ru_maxrss``), imports (torch for validate) included, so the bound is checked on the
whole process. Median of ``--repeats`` for time, largest peak for memory.

Run: ``PYTHONPATH=reference python benchmarks/bench_hostile.py [--repeats 3] [--json OUT]``.
A small DCP object in a large objects file (issue 41 item 6) is benchmarks/bench_hostile_dcp.py.
Hostile readers against the conformance runner (``shardspec conformance``) are
benchmarks/bench_hostile_runner.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

from child import BOUND_BYTES as BYTES
from child import BOUND_SECONDS as SECONDS
from child import measure
from shardspec.testing.adversarial import (
    ADVERSARIAL,
    floats_in_config,
    many_unknown_members,
    split_ways,
    staircase,
)


#: name -> (manifest bytes, what it attacks); every one at most 10 MB.
def cases() -> dict[str, tuple[Callable[[], bytes], str]]:
    out: dict[str, tuple[Callable[[], bytes], str]] = {}
    for name, (build, size, what) in ADVERSARIAL.items():
        if name == "staircase":
            size = 16384  # 2n - 1 = 32,767 pieces: 9 MB (the 65,535-piece one is 18 MB)
        if name == "floats-in-config":
            size = 75000  # 9.7 MB
        out[name] = ((lambda b=build, s=size: b(s)), what)
    out["staircase-overlap"] = (lambda: staircase(16384, overlap=True),
                                "the staircase with one overlap: the strict path reports it")
    out["unknown-members-newer-minor"] = (
        lambda: many_unknown_members(85000).replace(b'"1.2"', b'"1.3"', 1),
        "85,000 unknown fields in a newer minor version: warnings, bounded")
    out["split-ways-one-error"] = (
        lambda: split_ways(32768).replace(b'"dtype":"I8"', b'"dtype":"I8","x":1', 1),
        "32,768 ranks and one schema error: the strict path on a large manifest")
    out["floats-one-error"] = (
        lambda: floats_in_config(75000).replace(b'"dtype":"I8"', b'"dtype":"I8","x":1', 1),
        "a float in the config and one schema error: no jsonschema-rs pruning (known slow)")
    return out


_CHILD = r"""
import json, resource, sys, time, os
op, path = sys.argv[1], sys.argv[2]
result = 2
if op in ("inspect", "validate-cli"):
    from shardspec.cli import main
    sys.argv = (["shardspec", "inspect", path, "--json"] if op == "inspect"
                else ["shardspec", "validate", path])
    result = os.dup(2)
    out = os.open(os.devnull, os.O_WRONLY); os.dup2(out, 1); os.dup2(out, 2)
    started = time.perf_counter()
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    else:
        code = 0
    answer = f"exit {code}"
else:
    import shardspec
    # shardspec imports its reader (and torch) on first use: before the clock, not on it
    open_checkpoint, validate, error = shardspec.open, shardspec.validate, shardspec.ShardspecError
    started = time.perf_counter()
    if op == "open":
        try:
            answer = f"{open_checkpoint(path).world_size} ranks"
        except error as exc:
            answer = exc.code
    else:
        report = validate(path)
        codes = sorted({f.code for f in report.findings})
        answer = f"{len(report.findings)} findings {codes[:3]}"
elapsed = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
os.write(result, ("\nRESULT " + json.dumps([elapsed, peak, answer]) + "\n").encode())
"""


def run(op: str, path: Path) -> tuple[float, int, str]:
    answer: tuple[float, int, str] = measure(_CHILD, [op, str(path)])
    return answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", help="comma-separated case names")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    print(f"python {platform.python_version()}, {os.cpu_count()} cpus, "
          f"load average {os.getloadavg()[0]:.1f} at start; bound {SECONDS:g} s, "
          f"{BYTES / 2**30:g} GiB peak RSS; median of {args.repeats}")
    print("| manifest | MB | op | answer | s | peak RSS MiB | within bound |")
    print("|---|---:|---|---|---:|---:|---|")
    rows = []
    chosen = cases()
    if args.only:
        chosen = {k: v for k, v in chosen.items() if k in args.only.split(",")}
    with tempfile.TemporaryDirectory(prefix="shardspec-hostile-") as tmp:
        for name, (build, what) in chosen.items():
            root = Path(tmp) / name
            root.mkdir()
            data = build()
            (root / "shardspec.json").write_bytes(data)
            for op in ("open", "validate", "validate-cli", "inspect"):
                runs = [run(op, root) for _ in range(args.repeats)]
                seconds = statistics.median(r[0] for r in runs)
                peak = max(r[1] for r in runs)
                ok = seconds <= SECONDS and peak <= BYTES
                rows.append({"manifest": name, "what": what, "bytes": len(data), "op": op,
                             "answer": runs[0][2], "seconds": [r[0] for r in runs],
                             "peak_rss": peak, "within_bound": ok})
                print(f"| {name} | {len(data) / 1e6:.1f} | {op} | {runs[0][2]} | "
                      f"{seconds:.2f} | {peak / 2**20:.0f} | {'pass' if ok else 'FAIL'} |",
                      flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
