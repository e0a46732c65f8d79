"""What `validate` costs: metadata-only checks grow with pieces, `--checksums` with bytes.

1. A synthetic checkpoint of ``--pieces`` tensor pieces (default 100,000) over ``--ranks``
   ranks (default 64): tiny tensors, so the cost is the manifest and the headers, not data.
   Timed: ``shardspec.validate(path)`` in process, and the ``shardspec validate`` command
   (which includes the interpreter and torch start-up).
2. A checkpoint of ``--gib`` of data (default 1 GiB, TP=4): ``validate(path, checksums=True)``
   against a raw read of the same files (64 MiB reads, no hashing; one file after another, and
   four files at once as validate reads them), all from a cold page cache
   (``posix_fadvise(DONTNEED)``), interleaved in a rotating order; median of ``--repeats``.

Run: ``PYTHONPATH=reference python benchmarks/format/bench_validate.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
import shardspec  # noqa: E402
from harness import OUT, REFERENCE, removed_after  # noqa: E402
from harness.synthetic import evict  # noqa: E402


def raw_read_file(path: Path) -> int:
    view = memoryview(bytearray(64 * 1024 * 1024))
    total = 0
    with path.open("rb", buffering=0) as handle:
        while got := handle.readinto(view):
            total += got
    return total


def raw_read(directory: Path) -> int:
    """The files one after another, 64 MiB reads: what `cat` does."""
    return sum(raw_read_file(path) for path in sorted(directory.iterdir()))


def raw_read_parallel(directory: Path) -> int:
    """Up to four files at once, as validate reads them: a virtual disk may serve that faster."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return sum(pool.map(raw_read_file, sorted(directory.iterdir())))


def write_many_pieces(path: Path, pieces: int, ranks: int) -> None:
    tensors = -(-pieces // ranks)
    states: dict[int, dict[str, torch.Tensor]] = {r: {} for r in range(ranks)}
    sharding: dict[int, dict[str, shardspec.Shard]] = {r: {} for r in range(ranks)}
    for i in range(tensors):
        full = torch.zeros(ranks, 2, dtype=torch.bfloat16)
        for r, (piece, shard) in enumerate(shardspec.split(full, 0, ranks)):
            states[r][f"model.layers.{i // 8}.w{i % 8}"] = piece
            sharding[r][f"model.layers.{i // 8}.w{i % 8}"] = shard
    shardspec.save(states, path, layout=shardspec.Layout(tp_size=ranks), sharding=sharding)


def write_big(path: Path, gib: float, tp: int) -> None:
    rows = int(gib * 1024**3 / 2 / 4096 / 16)
    g = torch.Generator().manual_seed(0)
    states: dict[int, dict[str, torch.Tensor]] = {r: {} for r in range(tp)}
    sharding: dict[int, dict[str, shardspec.Shard]] = {r: {} for r in range(tp)}
    for i in range(16):
        full = torch.randint(-32768, 32767, (rows, 4096), dtype=torch.int16, generator=g)
        for r, (piece, shard) in enumerate(shardspec.split(full.view(torch.bfloat16), 0, tp)):
            states[r][f"w{i}"], sharding[r][f"w{i}"] = piece, shard
    shardspec.save(states, path, layout=shardspec.Layout(tp_size=tp), sharding=sharding)


def timed(function: object) -> float:
    start = time.perf_counter()
    function()  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pieces", type=int, default=100_000)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-validate-", dir=OUT))
    with removed_after(work):
        many = work / "many"
        write_many_pieces(many, args.pieces, args.ranks)
        manifest = shardspec.open(many).manifest
        count = sum(len(t.pieces) for t in manifest.tensors.values() if hasattr(t, "pieces"))
        api = [timed(lambda: shardspec.validate(many)) for _ in range(args.repeats)]
        env = {**os.environ, "PYTHONPATH": str(REFERENCE)}
        command = [sys.executable, "-c", "from shardspec.cli import main; main()",
                   "validate", str(many)]
        cli = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            subprocess.run(command, env=env, check=True, capture_output=True)
            cli.append(time.perf_counter() - start)
        start_up = [timed(lambda: subprocess.run(
            [sys.executable, "-c", "import shardspec.cli"], env=env, check=True))
            for _ in range(args.repeats)]
        size = (many / "shardspec.json").stat().st_size

        big = work / "big"
        write_big(big, args.gib, 4)
        nbytes = sum(p.stat().st_size for p in big.iterdir())
        files = sorted(p for p in big.iterdir() if p.is_file())
        runs: dict[str, list[float]] = {"checksums": [], "raw": [], "raw4": []}

        def check() -> None:
            report = shardspec.validate(big, checksums=True)
            assert report.ok and report.checksums_verified == report.files_checked

        methods = [("checksums", check), ("raw", lambda: raw_read(big)),
                   ("raw4", lambda: raw_read_parallel(big))]
        for repeat in range(args.repeats):  # a rotating order, so drift falls on all alike
            for name, method in methods[repeat % 3:] + methods[:repeat % 3]:
                evict(files)
                runs[name].append(timed(method))
        check_s, raw_s, raw4_s = (statistics.median(runs[k]) for k in ("checksums", "raw", "raw4"))

        print(f"machine: {os.cpu_count()} cores; torch {torch.__version__}; "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
        print("\n| metadata-only validate | value |\n|---|---:|")
        print(f"| pieces / ranks / tensors | {count} / {args.ranks} / "
              f"{len(manifest.tensors)} |")
        print(f"| manifest size | {size / 1024**2:.1f} MiB |")
        print(f"| `shardspec.validate(path)`, median of {args.repeats} | "
              f"{statistics.median(api):.2f} s |")
        print(f"| `shardspec validate PATH` (command), median | {statistics.median(cli):.2f} s |")
        print(f"| of which interpreter + `import shardspec.cli` | "
              f"{statistics.median(start_up):.2f} s |")
        print("\n| validate --checksums, cold | value |\n|---|---:|")
        print(f"| bytes | {nbytes / 1024**3:.2f} GiB in {len(list(big.iterdir()))} files |")
        print(f"| `validate(checksums=True)`, median of {args.repeats} | {check_s:.2f} s "
              f"({nbytes / check_s / 1e9:.2f} GB/s) |")
        print(f"| raw read of the same files one by one, median | {raw_s:.2f} s "
              f"({nbytes / raw_s / 1e9:.2f} GB/s) |")
        print(f"| raw read, four files at once, median | {raw4_s:.2f} s "
              f"({nbytes / raw4_s / 1e9:.2f} GB/s) |")
        print(f"| checksums rate / raw rate, one by one (goal >= 0.8) | {raw_s / check_s:.2f} |")
        print(f"| checksums rate / raw rate, four at once (goal >= 0.8) | "
              f"{raw4_s / check_s:.2f} |")
        print(f"\nruns (s): api {[round(x, 2) for x in api]}, cli {[round(x, 2) for x in cli]}, "
              + ", ".join(f"{k} {[round(x, 2) for x in v]}" for k, v in runs.items()))


if __name__ == "__main__":
    main()
