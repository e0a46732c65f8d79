"""What "cold" is on this machine: the floor a cold load pays, and how much it varies.

Every cold figure of the load benchmarks (``bench_load.py``, ``bench_vllm.py``, ...) evicts the
files from the page cache with ``posix_fadvise(DONTNEED)`` before each load. This benchmark
measures, on one file of ``--size-gib`` (default 1.5), what such a load cannot go below and
what its spread comes from, each way timed alike (the file read whole in 16 MiB requests into
memory faulted in before the clock), in a rotating order each repeat:

* ``cold-fadvise``  - evicted with ``posix_fadvise(DONTNEED)``, read through the page cache:
  what the benchmarks call cold;
* ``cold-drop``     - also ``echo 1 > /proc/sys/vm/drop_caches`` first (root only): the guest's
  whole page cache dropped;
* ``direct``        - ``O_DIRECT`` reads, past the guest's page cache: the virtual disk itself;
* ``warm``          - read once before, from the page cache;
* ``fresh-memory``  - no file: a fresh buffer of the same size faulted in by writing one byte
  a page, what every loader pays for the memory it fills (vLLM's parameters, a copy's buffer).

The resident fraction of the file (``mincore``) after each eviction shows what the eviction
reached. What no eviction inside the guest reaches is below it: the host's cache of the virtual
disk and the other tenants of the disk. Where ``direct`` varies as much as ``cold-fadvise``, the
spread of cold loads comes from there, and no loader can remove it; the ratio of
``cold-fadvise`` to ``direct`` is what the guest's page cache adds.

``--never-read FILE ...`` adds ``first-read``: each of those files (large ones this machine has
not read since it started, such as a disk image's own files) read once with ``O_DIRECT``. A
file the benchmark just wrote may still be in the host's cache however it is evicted here; a
file nobody read since boot comes from the storage below it, what a truly cold load meets.

    PYTHONPATH=reference python benchmarks/load/bench_cold.py [--size-gib 1.5] [--repeats 9]
        [--never-read FILE ...] [--workdir DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness.load import GiB, PageCache, fsync_path, machine_info  # noqa: E402
from harness.synthetic import bench_workdir  # noqa: E402

REQUEST = 16 << 20
WAYS = ("cold-fadvise", "cold-drop", "direct", "warm", "fresh-memory")
BLOCK = 4096  # O_DIRECT's alignment


def read_whole(path: Path, buffer: mmap.mmap, flags: int = 0) -> None:
    """``path`` read into ``buffer`` (page-aligned, as ``O_DIRECT`` needs) in ``REQUEST`` reads."""
    view = memoryview(buffer)
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        offset, size = 0, os.fstat(fd).st_size
        while offset < size:
            got = os.preadv(fd, [view[offset : offset + REQUEST]], offset)
            if got <= 0:
                raise OSError(f"{path}: short read at {offset}")
            offset += got
    finally:
        view.release()
        os.close(fd)


def first_reads(paths: list[Path]) -> list[tuple[Path, int, float]]:
    """Each of ``paths`` read once with ``O_DIRECT``: (path, bytes, seconds)."""
    out = []
    for path in paths:
        size = path.stat().st_size // BLOCK * BLOCK  # a direct read ends on a block
        buffer = mmap.mmap(-1, max(size, BLOCK))
        for page in range(0, size, mmap.PAGESIZE):
            buffer[page] = 1
        view = memoryview(buffer)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            start = time.perf_counter()
            for offset in range(0, size, REQUEST):
                os.preadv(fd, [view[offset : min(offset + REQUEST, size)]], offset)
            out.append((path, size, time.perf_counter() - start))
        finally:
            os.close(fd)
            view.release()
            buffer.close()
    return out


def fault_in(size: int) -> None:
    fresh = torch.empty(size, dtype=torch.uint8)
    fresh[:: mmap.PAGESIZE] = 1
    del fresh


def measure(path: Path, repeats: int) -> tuple[dict[str, list[float]],
                                                  dict[str, list[float | None]]]:
    """Each way's seconds per repeat, and the file's resident fraction before each."""
    size = path.stat().st_size
    buffer = mmap.mmap(-1, size)
    for page in range(0, size, mmap.PAGESIZE):  # faulted in here, out of every clock
        buffer[page] = 1
    fadvise, drop = PageCache(), PageCache(drop_caches=True)
    ways: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {
        "cold-fadvise": (lambda: fadvise.evict([path]), lambda: read_whole(path, buffer)),
        "direct": (lambda: fadvise.evict([path]),
                   lambda: read_whole(path, buffer, os.O_DIRECT)),
        "warm": (lambda: read_whole(path, buffer), lambda: read_whole(path, buffer)),
        "fresh-memory": (lambda: None, lambda: fault_in(size)),
    }
    if drop.drop_caches:  # root only
        ways["cold-drop"] = (lambda: drop.evict([path]), lambda: read_whole(path, buffer))
    names = [w for w in WAYS if w in ways]
    times: dict[str, list[float]] = {name: [] for name in names}
    resident: dict[str, list[float | None]] = {name: [] for name in names}
    for repeat in range(repeats):
        for name in names[repeat % len(names):] + names[: repeat % len(names)]:
            prepare, load = ways[name]
            prepare()
            resident[name].append(None if name == "fresh-memory" else fadvise.resident(path))
            start = time.perf_counter()
            load()
            times[name].append(time.perf_counter() - start)
    buffer.close()
    return times, resident


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gib", type=float, default=1.5, help="file size (default 1.5)")
    ap.add_argument("--repeats", type=int, default=9, help="reads per way (default 9)")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="an empty directory for the file (default: a temp dir under "
                    "benchmarks/out, removed afterwards)")
    ap.add_argument("--never-read", type=Path, nargs="*", default=[],
                    help="files not read since boot, each read once with O_DIRECT")
    ap.add_argument("--json", type=Path, default=None, help="write all results to this file")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.size_gib <= 0:
        ap.error("--repeats and --size-gib must be positive")
    with bench_workdir(args.workdir, prefix="bench-cold-") as workdir:
        path = workdir / "data.bin"
        size = int(args.size_gib * GiB) // mmap.PAGESIZE * mmap.PAGESIZE
        with open(path, "wb") as f:
            for offset in range(0, size, REQUEST):
                f.write(os.urandom(min(REQUEST, size - offset)))
        fsync_path(path)
        firsts = first_reads(args.never_read)  # first: nothing of ours in the caches yet
        times, resident = measure(path, args.repeats)
        info = machine_info(workdir, torch.device("cpu"))
    report(info, size, args.repeats, times, resident)
    for first, nbytes, seconds in firsts:
        print(f"| first-read {first.name[:40]} ({nbytes / GiB:.2f} GiB) | {seconds:.2f} | | | "
              f"{nbytes / seconds / 1e9:.2f} | |")
    if args.json:
        args.json.write_text(json.dumps({
            "machine": info, "size": size, "times_s": times, "resident": resident,
            "first_reads": [[str(p), n, t] for p, n, t in firsts]}, indent=1))
    return 0


def report(info: dict[str, Any], size: int, repeats: int, times: dict[str, list[float]],
           resident: dict[str, list[float | None]]) -> None:
    print(f"\n{info['cpu']}, {info['cores']} cores; {info['filesystem']}; commit "
          f"{info['commit']}; {info['date']}")
    print(f"one file of {size / GiB:.2f} GiB read whole in {REQUEST >> 20} MiB requests; "
          f"{repeats} repeats a way, in a rotating order\n")
    print("| way | median s | min-max s | max / min | median GB/s | resident before |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, values in times.items():
        med = statistics.median(values)
        known = [r for r in resident[name] if r is not None]
        print(f"| {name} | {med:.2f} | {min(values):.2f}-{max(values):.2f} | "
              f"{max(values) / min(values):.2f} | {size / med / 1e9:.2f} | "
              f"{f'{max(known):.0%}' if known else '-'} |")


if __name__ == "__main__":
    sys.exit(main())
