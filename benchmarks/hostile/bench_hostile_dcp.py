"""One small DCP object in a large objects file: time and peak memory of loading it and of
``validate --checksums`` (issue 41 item 6).

A ``dcp.save`` through :class:`shardspec.integrations.dcp.Writer` of one tensor and two
non-tensor values (``step``, and ``note``: a 1,000-character string, a pickle of 2.2 KB),
whose objects file then grows by ``--size-mb`` MiB of other bytes after them (default 512 MiB;
its record updated, so the checkpoint is valid: the shape of a save with large non-tensor
values, or of a hostile one). The issue's case was a 3 GiB file; any size shows the bound,
since memory no longer grows with it. Each operation runs in a fresh child process:

- ``load``: ``dcp.load({"note": ""}, storage_reader=Reader(path))``: reads ``note``'s bytes;
- ``load-verify``: the same with ``verify=True``: streams the whole file through its digest;
- ``validate``: ``shardspec.validate(path, checksums=True)``;
- ``validate-cli``: the ``shardspec validate --checksums`` command, its output to /dev/null.

Time is the operation alone (imports before the clock); memory is the child's peak resident set
(``ru_maxrss``), imports (torch for the loads) included. The bound: 5 s and 1 GiB each.

Run: ``PYTHONPATH=reference python benchmarks/hostile/bench_hostile_dcp.py [--size-mb 512]
[--repeats 3] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
import harness.hostile as hostile  # noqa: E402

OBJECTS_FILE = "dcp-objects-rank-0.bin"

_CHILD = hostile.op_script({"validate-cli": ["validate", "--checksums", "{path}"]}, """
if op == "validate":
    import shardspec
    validate = shardspec.validate
    started = time.perf_counter()
    report = validate(path, checksums=True)
    answer = (f"valid={report.ok}, {report.checksums_verified} verified, "
              f"warnings {[f.code for f in report.warnings]}")
else:
    import torch.distributed.checkpoint as dcp
    from shardspec.integrations.dcp import Reader
    started = time.perf_counter()
    state = {"note": ""}
    reader = Reader(path, verify=op == "load-verify")
    dcp.load(state, storage_reader=reader)
    answer = f"{len(state['note'])} chars, {reader.object_bytes} bytes read"
""", preamble=(
    'import warnings\nwarnings.filterwarnings("ignore", message="torch.distributed is disabled")'))


def build(root: Path, size_mb: int) -> int:
    """The checkpoint; returns the objects file's size."""
    import torch
    import torch.distributed.checkpoint as dcp

    from shardspec.integrations.dcp import Writer

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save({"w": torch.ones(4, 4), "step": 5, "note": "x" * 1000},
                 storage_writer=Writer(root))
    path = root / OBJECTS_FILE
    block = hashlib.sha256(b"padding").digest() * (1024 * 1024 // 32)  # 1 MiB, not zeros
    with path.open("ab") as handle:
        for _ in range(size_mb):
            handle.write(block)
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(8 * 1024 * 1024):
            digest.update(chunk)
    manifest = json.loads((root / "shardspec.json").read_text())
    for record in manifest["extra_files"]:
        if record["path"] == OBJECTS_FILE:
            record.update(size=path.stat().st_size, checksums={"sha256": digest.hexdigest()})
    (root / "shardspec.json").write_text(json.dumps(manifest, indent=1))
    return path.stat().st_size


def main() -> None:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--size-mb", type=int, default=512,
                            help="MiB added to the objects file")
        parser.add_argument("--dir", type=Path, help="where to build (default: a temporary folder)")

    args = hostile.parse_args(__doc__, options, only=False)
    hostile.start(args.repeats)
    rows = []
    with tempfile.TemporaryDirectory(prefix="shardspec-hostile-dcp-", dir=args.dir) as tmp:
        root = Path(tmp) / "ckpt"
        size = build(root, args.size_mb)
        print(f"objects file {size / 2**20:.0f} MiB; the object read, 2.2 KB")
        print("| op | answer | s | peak RSS MiB | within bound |")
        print("|---|---|---:|---:|---|")
        for op in ("load", "load-verify", "validate", "validate-cli"):
            fields, cells = hostile.within_bound([hostile.measure(_CHILD, [op, str(root)])
                                              for _ in range(args.repeats)])
            rows.append({"op": op, "file_bytes": size, **fields})
            print(f"| {op} | {fields['answer']} | {cells}", flush=True)
    hostile.finish(rows, args.json)


if __name__ == "__main__":
    main()
