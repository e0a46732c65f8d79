"""First load in a fresh process: one rank's load as a serving worker does it, once per process.

``bench_load.py`` times repeated loads inside one long-lived process. There, a loader that
allocates each tensor separately (runai-model-streamer returns one allocation per tensor) gets
its memory back from the C allocator's heap on every load after the first, already faulted in;
a loader that allocates one buffer per file (shardspec, fastsafetensors) gets fresh pages from
the kernel every time. A serving worker loads its weights once per process, so this benchmark
times exactly that: each timed load runs in a new process (spawned, with its imports done before
the clock, shardspec's and the peers' modules alike, and shardspec's bytecode compiled as an
installed package's is), and the process exits after it.

Contenders (each result touched, one byte of every 4 KiB page, inside the clock, as in
``bench_load.py``): ``shardspec`` (``open`` + ``load_rank``), ``shardspec-cached`` (every read
through the page cache), ``shardspec-mmap``, ``st-mmap`` (safetensors ``load_file`` of the
rank's files), ``runai`` and ``fastsafe`` where installed, and ``read-fresh`` (plain reads into
a new buffer per file). Cold: every file evicted before every load; warm: every file read once
before the warm loads. Rank TP-1 of the same synthetic checkpoints as ``bench_load.py``; the
contenders are rotated in each repeat; medians with [fastest-slowest].

    PYTHONPATH=reference python benchmarks/load/bench_first_load.py [--size-gib 1] [--tp 1,2,4,8]
        [--repeats 5] [--cache cold,warm] [--json OUT]

Bytes are not compared here (``bench_load.py`` does, in every run); this one exits non-zero only
when a load fails.
"""

from __future__ import annotations

import argparse
import compileall
import datetime as dt
import gc
import importlib
import json
import multiprocessing
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
import shardspec  # noqa: E402
from harness.load import (  # noqa: E402
    AVAILABLE_PEERS,
    MISSING_PEERS,
    PEERS,
    in_workdir,
    load_shardspec,
    load_shardspec_cached,
    load_shardspec_thp,
    load_st,
    read_fresh,
    touch,
    verdict,
    written_model,
)
from harness.synthetic import evict  # noqa: E402

GiB = 1 << 30

METHODS = ("shardspec", "shardspec-cached", "shardspec-thp", "shardspec-mmap", "st-mmap",
           *AVAILABLE_PEERS, "read-fresh")


def _one_load(conn: Any, ckpt: str, rank: int, names: list[str], method: str) -> None:
    """In a fresh process: wait for the parent, then time one load of ``method``.

    Every loader's modules are imported before the clock, as a serving process has them; no
    loader has run yet (shardspec's ``open`` included: its first call is part of the load).
    """
    import torch

    import shardspec.reader  # noqa: F401 - `import shardspec` defers it to the first open()

    for peer in AVAILABLE_PEERS:
        importlib.import_module(PEERS[peer][0])
    path, files = Path(ckpt), [Path(name) for name in names]
    cpu = torch.device("cpu")
    loads = {
        "shardspec": lambda: load_shardspec(path, rank, cpu),
        "shardspec-cached": lambda: load_shardspec_cached(path, rank, cpu),
        "shardspec-thp": lambda: load_shardspec_thp(path, rank, cpu),
        "shardspec-mmap": lambda: load_shardspec(path, rank, cpu, mmap=True),
        "st-mmap": lambda: load_st(files),
        "read-fresh": lambda: read_fresh(files),
        **{name: (lambda fn=PEERS[name][1]: fn(files)) for name in AVAILABLE_PEERS},
    }
    gc.collect()
    conn.send("ready")
    conn.recv()
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    touch(loads[method]())
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    conn.send((seconds, after.ru_minflt - before.ru_minflt, cpu))


def first_load(ckpt: Path, rank: int, method: str, before: Any) -> tuple[float, int, float]:
    """Seconds, page faults and CPU seconds (all threads, user and system) of ``method``'s load
    in a new process; ``before`` runs once that process is ready, just before its clock
    starts."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    names = [str(p) for p in shardspec.open(ckpt).rank_files(rank)]  # in this process
    proc = context.Process(target=_one_load, args=(child, str(ckpt), rank, names, method))
    proc.start()
    try:
        if not parent.poll(300) or parent.recv() != "ready":
            raise RuntimeError(f"{method}: the load process did not start")
        before()
        parent.send("go")
        if not parent.poll(600):
            raise RuntimeError(f"{method}: the load did not finish")
        seconds, faults, cpu = parent.recv()
    except EOFError:
        raise RuntimeError(f"{method}: the load process failed (exit {proc.exitcode})") from None
    finally:
        proc.join(60)
    return seconds, faults, cpu


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--tp", default="1,2,4,8")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cache", default="cold,warm")
    ap.add_argument("--methods", default=",".join(METHODS),
                    help=f"contenders, comma-separated (default: {','.join(METHODS)})")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    args.tps = [int(t) for t in args.tp.split(",") if t.strip()]
    args.caches = [c.strip() for c in args.cache.split(",") if c.strip()]
    if not args.tps or min(args.tps) < 1 or args.repeats < 1:
        ap.error("--tp needs positive integers and --repeats at least 1")
    if not args.caches or set(args.caches) - {"cold", "warm"}:
        ap.error("--cache takes cold, warm or both")
    args.methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    if not args.methods or set(args.methods) - set(METHODS):
        ap.error(f"--methods takes some of {', '.join(METHODS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    return in_workdir(run, parse_args(argv), "bench-first-")


def run(args: argparse.Namespace, workdir: Path) -> int:
    # As an installed package has them (pip compiles on install): run from a source tree with
    # PYTHONDONTWRITEBYTECODE, every fresh process would compile shardspec's modules again.
    compileall.compile_dir(Path(shardspec.__file__).parent, quiet=1)
    written_model(args, workdir)
    all_files = sorted(p for p in workdir.rglob("*.safetensors"))
    for name, why in MISSING_PEERS.items():
        print(f"left out {name}: {why}")
    rows = []
    for tp in args.tps:
        ckpt, rank = workdir / f"tp{tp}", tp - 1
        for cache in args.caches:
            if cache == "warm":
                for path in all_files:
                    path.read_bytes()
            before = (lambda: evict(all_files)) if cache == "cold" else (lambda: None)
            methods = args.methods
            times: dict[str, list[float]] = {m: [] for m in methods}
            faults: dict[str, list[int]] = {m: [] for m in methods}
            cpu: dict[str, list[float]] = {m: [] for m in methods}
            for repeat in range(args.repeats):
                shift = repeat % len(methods)
                for method in methods[shift:] + methods[:shift]:
                    seconds, taken, used = first_load(ckpt, rank, method, before)
                    times[method].append(seconds)
                    faults[method].append(taken)
                    cpu[method].append(used)
            rows.append({"tp": tp, "cache": cache, "times_s": times, "minflt": faults,
                         "cpu_s": cpu})
            print(f"TP={tp} {cache}: " + ", ".join(
                f"{m} {statistics.median(v) * 1e3:.1f}" for m, v in times.items()) + " ms",
                flush=True)
    report(args, rows)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "rows": rows}, indent=1))
    return 0


def _cell(values: list[float]) -> str:
    return (f"{statistics.median(values) * 1e3:.1f} "
            f"[{min(values) * 1e3:.0f}-{max(values) * 1e3:.0f}]")


def report(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    print(f"\n{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, commit {commit}, "
          f"{args.size_gib} GiB bf16, rank TP-1, one load per fresh process, "
          f"median of {args.repeats} [fastest-slowest] ms\n")
    methods = list(rows[0]["times_s"]) if rows else []
    peers = [p for p in AVAILABLE_PEERS if p in methods]
    copy_goal = "shardspec" in methods and bool(peers)
    mmap_goal = {"shardspec-mmap", "st-mmap"} <= set(methods)
    cols = ["TP", "cache", *methods]
    cols += ["best peer / shardspec", "copy"] if copy_goal else []
    cols += ["st-mmap / shardspec-mmap", "mmap"] if mmap_goal else []
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join("---:" for _ in cols) + "|")
    for row in rows:
        t = row["times_s"]
        med = {m: statistics.median(v) for m, v in t.items()}
        cells = [str(row["tp"]), row["cache"], *(_cell(t[m]) for m in methods)]
        if copy_goal:
            best = min(peers, key=lambda p: med[p])
            cells += [f"{med[best] / med['shardspec']:.2f}", verdict(t["shardspec"], t[best])]
        if mmap_goal:
            cells += [f"{med['st-mmap'] / med['shardspec-mmap']:.2f}",
                      verdict(t["shardspec-mmap"], [x * 1.1 for x in t["st-mmap"]])]
        print("| " + " | ".join(cells) + " |")
    if copy_goal or mmap_goal:
        print("\ncopy: against the best peer; mmap: against st-mmap x 1.1. ahead = median no "
              "slower; noise = slower, but each median within the other's repeats; behind = "
              "neither")
    print("\nCPU time of the loading process during the load, all threads, user + system "
          "(median ms):")
    for row in rows:
        print(f"  TP={row['tp']} {row['cache']}: " + ", ".join(
            f"{m} {statistics.median(v) * 1e3:.0f}" for m, v in row["cpu_s"].items()))
    print("\nMinor page faults taken by the loading process during the load (median; one per "
          "4 KiB page of fresh memory, or per 2 MiB where huge pages back it):")
    for row in rows:
        print(f"  TP={row['tp']} {row['cache']}: " + ", ".join(
            f"{m} {statistics.median(v):.0f}" for m, v in row["minflt"].items()))

if __name__ == "__main__":
    sys.exit(main())
