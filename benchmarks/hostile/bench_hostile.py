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

Run: ``PYTHONPATH=reference python benchmarks/hostile/bench_hostile.py [--repeats 3]
[--json OUT]``. A small DCP object in a large objects file (issue 41 item 6) is
benchmarks/hostile/bench_hostile_dcp.py.
Hostile readers against the conformance runner (``shardspec conformance``) are
benchmarks/hostile/bench_hostile_runner.py.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
import harness.hostile as hostile  # noqa: E402
from shardspec.testing.adversarial import (  # noqa: E402
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


_CHILD = hostile.op_script({"inspect": ["inspect", "{path}", "--json"],
                     "validate-cli": ["validate", "{path}"]}, """
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
""")


def main() -> None:
    args, chosen = hostile.begin(__doc__, cases(), (
        "| manifest | MB | op | answer | s | peak RSS MiB | within bound |",
        "|---|---:|---|---|---:|---:|---|"))
    rows = []
    with tempfile.TemporaryDirectory(prefix="shardspec-hostile-") as tmp:
        for name, (build, what) in chosen.items():
            root = Path(tmp) / name
            root.mkdir()
            data = build()
            (root / "shardspec.json").write_bytes(data)
            for op in ("open", "validate", "validate-cli", "inspect"):
                fields, cells = hostile.within_bound([hostile.measure(_CHILD, [op, str(root)])
                                                      for _ in range(args.repeats)])
                rows.append({"manifest": name, "what": what, "bytes": len(data), "op": op,
                             **fields})
                print(f"| {name} | {len(data) / 1e6:.1f} | {op} | {fields['answer']} | {cells}",
                      flush=True)
    hostile.finish(rows, args.json)


if __name__ == "__main__":
    main()
