"""Load benchmark: one rank's load from a shardspec checkpoint against what a user would do instead.

A synthetic Llama-shaped bf16 checkpoint (default 1 GiB) is written once as one whole file and as
a shardspec checkpoint per TP size. For each TP size, rank TP-1 (the last) is loaded by every
contender, interleaved in a rotating order in each repeat (the baseline's repeats first, apart:
see ``APART``), from a cold page cache (every file evicted before every timed load) and from a
warm one:

* ``baseline``       - the whole-checkpoint loader: ``safetensors.torch.load_file`` of the whole
  file, then this rank's slice of every tensor copied contiguous to the device;
* ``shardspec``      - ``shardspec.open(path).load_rank(rank, device)``: copies into one fresh
  buffer per file (pinned staging on CUDA); ``open()``'s share is recorded too;
* ``shardspec-thp``  - the same with huge pages on (``host_memory.USE_HUGE_PAGES = True``);
* ``shardspec-cached`` - the same with every read through the page cache
  (``host_reads.DIRECT_READS = False``, what ``SHARDSPEC_DIRECT_READS=0`` gives): where the
  cache is cold, ``shardspec`` reads around it with direct I/O;
* ``shardspec-mmap`` - ``open`` + ``load_rank(mmap=True)``: copy-on-write file mappings (cpu);
* ``st-mmap``        - ``safetensors.torch.load_file`` of the rank's own file(s): lazy mappings,
  what vLLM's sharded-state loader gets;
* ``st-pread``       - the same with ``backend="pread"``: safetensors' copying loader;
* ``runai``, ``fastsafe`` - runai-model-streamer and fastsafetensors (``nogds``) loading the
  rank's own files to owned tensors (:mod:`peers`; left out with a note where not installed);
* ``read-fresh``     - plain ``readinto`` of the rank's files into a new ``torch.empty`` buffer;
* ``read-reused``    - the same into one buffer allocated once, outside the clock (the floor);

and, untimed by the touch below (the zero-copy comparison): ``shardspec-mmap-lazy``
(``load_rank(mmap=True)`` on a checkpoint opened outside the clock) and ``st-lazy``
(``load_file`` of the rank's file), neither touching a byte.

Fair: on CPU every contender's result is *touched* before the clock stops, by the same
function: one byte of every 4 KiB page of every distinct storage is read, so a lazy mapping is
faulted in (from the page cache or the disk) like a copy is. On CUDA the clock stops after
``torch.cuda.synchronize()``; the contenders there are ``baseline``, ``shardspec``, ``st-cuda``
(``load_file(device=...)``), ``read-reused``, ``pinned-h2d`` (one host-to-device copy of the
rank's bytes from a pinned buffer: the copy engine's rate) and ``read-then-h2d`` (a plain read
into a reused pinned buffer, then one copy: reads and copies not overlapped).

``--procs 8`` (default: the largest TP size) also loads all ranks of that TP size at once, one
process per rank, started together; the wall time from start to the last rank done is reported.

This is a benchmark, not a test: it exits non-zero only when loaded tensors are wrong.

    PYTHONPATH=reference python benchmarks/load/bench_load.py [--size-gib 1] [--tp 1,2,4,8]
        [--repeats 5] [--cache cold,warm] [--device cpu|cuda] [--procs 8] [--json OUT] [--keep]
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
import shardspec  # noqa: E402
import shardspec.load.execute  # noqa: E402
from harness.load import (  # noqa: E402
    AVAILABLE_PEERS,
    GB,
    GPU_PEERS,
    LOADERS,
    MISSING_GPU_PEERS,
    MISSING_PEERS,
    GiB,
    MiB,
    PageCache,
    check_equal,
    load_baseline,
    load_shardspec,
    load_shardspec_thp,
    load_st,
    machine_info,
    model_options,
    parse_tps,
    rank_loads,
    read_into,
    sync,
    touch,
    verdict,
    write_checkpoints,
)
from harness.synthetic import LAYERS, bench_workdir, make_weights, model_spec  # noqa: E402

CPU_METHODS = ("baseline", "shardspec", "shardspec-cached", "shardspec-thp", "shardspec-mmap",
               "st-mmap", "st-pread", *AVAILABLE_PEERS, "read-fresh", "read-reused")
CPU_LAZY = ("shardspec-mmap-lazy", "st-lazy")
CUDA_METHODS = ("baseline", "shardspec", "st-cuda", "read-reused", "pinned-h2d", "read-then-h2d")
PROC_METHODS = ("baseline", "shardspec", "shardspec-cached", "shardspec-mmap", "st-mmap",
                "st-pread", *AVAILABLE_PEERS, "read-fresh")


# --------------------------------------------------------------------------------------------
# The contenders


def contenders(
    device: torch.device, ckpt: Path, baseline_file: Path, dims: dict[str, int | None], tp: int,
    rank: int, files: list[Path], open_times: list[float],
) -> dict[str, Callable[[], Any]]:
    """Name -> a function doing one load (touch included on cpu)."""
    nbytes = sum(p.stat().st_size for p in files)
    if device.type == "cpu":
        reused = torch.empty(nbytes, dtype=torch.uint8)
        reused.fill_(0)  # faulted in once, outside the clock
        opened = shardspec.open(ckpt)
        loads = {**rank_loads(ckpt, rank, tp, files, device, baseline_file, dims, open_times),
                 "shardspec-thp": lambda: load_shardspec_thp(ckpt, rank, device),
                 "read-reused": lambda: read_into(files, reused)}
        timed_loads: dict[str, Callable[[], Any]] = {
            name: (lambda fn=fn: (touch(r := fn()), r)[1]) for name, fn in loads.items()}
        timed_loads["shardspec-mmap-lazy"] = lambda: opened.load_rank(rank, "cpu", mmap=True)
        timed_loads["st-lazy"] = lambda: load_st(files)
        return timed_loads
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    read_into(files, pinned)
    host = torch.empty(nbytes, dtype=torch.uint8)
    host.fill_(0)
    return {
        "baseline": lambda: load_baseline(baseline_file, dims, tp, rank, device),
        "shardspec": lambda: load_shardspec(ckpt, rank, device, open_times),
        "st-cuda": lambda: load_st(files, device=str(device)),
        "read-reused": lambda: read_into(files, host),
        "pinned-h2d": lambda: pinned.to(device, non_blocking=True),
        "read-then-h2d": lambda: read_into(files, pinned).to(device, non_blocking=True),
        **{name: (lambda fn=LOADERS[name]: fn(files, device=str(device)))
           for name in (*AVAILABLE_PEERS, *GPU_PEERS) if name not in MISSING_GPU_PEERS},
    }


def cuda_peers(device: torch.device, files: list[Path], info: dict[str, Any]) -> tuple[str, ...]:
    """The peers that load onto ``device`` here (one untimed trial each); why the others not."""
    working = []
    info.update({f"{name} left out": why for name, why in MISSING_GPU_PEERS.items()})
    for name in (*AVAILABLE_PEERS, *(p for p in GPU_PEERS if p not in MISSING_GPU_PEERS)):
        try:
            LOADERS[name](files, device=str(device))
            working.append(name)
        except Exception as exc:  # noqa: BLE001 - a peer that cannot load here is left out
            info[f"{name} left out"] = f"{type(exc).__name__}: {exc}"[:300]
    return tuple(working)


def eviction_check(cache: PageCache, path: Path) -> str:
    """Whether eviction works here: residency of ``path`` warm and right after eviction."""
    read_into([path], torch.empty(path.stat().st_size, dtype=torch.uint8))
    warm = cache.resident(path)
    cache.evict([path])
    cold = cache.resident(path)
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    return f"{path.name} resident warm {pct(warm)}, after evict {pct(cold)}"


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    gc.collect()
    start = time.perf_counter()
    result = fn()
    sync(device)
    elapsed = time.perf_counter() - start
    del result
    gc.collect()
    return elapsed


# --------------------------------------------------------------------------------------------
# Every rank at once, one process each


def _worker(conn: Any, barrier: Any, args: dict[str, Any]) -> None:
    """One rank's process: load by the method it is sent, after the shared start."""
    device = torch.device(args["device"])
    if device.type == "cuda":
        device = torch.device("cuda", args["rank"] % torch.cuda.device_count())
        torch.empty(1, device=device)
    ckpt, rank, tp = Path(args["ckpt"]), args["rank"], args["tp"]
    files = shardspec.open(ckpt).rank_files(rank)
    loads = rank_loads(ckpt, rank, tp, files, device, Path(args["baseline"]), args["dims"])
    conn.send("ready")
    while (method := conn.recv()) is not None:
        barrier.wait()
        start = time.perf_counter()
        result = loads[method]()
        touch(result)
        sync(device)
        end = time.perf_counter()
        del result
        gc.collect()
        conn.send((start, end))


class RankProcesses:
    """``tp`` worker processes, one per rank, kept for every run of every method."""

    def __init__(self, args: dict[str, Any], tp: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.barrier = context.Barrier(tp + 1)
        self.pipes, self.procs = [], []
        for rank in range(tp):
            parent, child = context.Pipe()
            proc = context.Process(target=_worker, args=(child, self.barrier,
                                                         {**args, "rank": rank, "tp": tp}))
            proc.start()
            self.pipes.append(parent)
            self.procs.append(proc)
        for pipe in self.pipes:
            if pipe.recv() != "ready":
                raise RuntimeError("a rank process failed to start")

    def run(self, method: str) -> float:
        """Seconds from the common start to the last rank done."""
        for pipe in self.pipes:
            pipe.send(method)
        self.barrier.wait()
        start = time.perf_counter()
        ends = [pipe.recv()[1] for pipe in self.pipes]
        return max(ends) - start

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(None)
        for proc in self.procs:
            proc.join(timeout=60)


# --------------------------------------------------------------------------------------------
# Main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    model_options(ap, 5, "timed loads per contender, TP and cache state; medians are "
                  "reported (default 5)")
    ap.add_argument("--cache", default="cold,warm",
                    help="page cache states to run, comma-separated: cold, warm (default both)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    ap.add_argument("--procs", type=int, default=None,
                    help="also load every rank of this TP size at once, one process per rank "
                    "(default: the largest --tp; 0: skip)")
    ap.add_argument("--proc-methods", default=None,
                    help="the methods of the --procs run, comma-separated (default: all; "
                    "shardspec and read-fresh always run: the goal compares them)")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where to write the checkpoints (default: a new temp dir under "
                    "benchmarks/out)")
    ap.add_argument("--staging", default=None, metavar="READERSxBUFFERSxCHUNK_MIB",
                    help="CUDA staging: reads in flight, pinned buffers and their size, e.g. "
                    "2x4x32 (default: shardspec.load.execute's STAGING_READERS, STAGING_BUFFERS, "
                    "CHUNK_BYTES)")
    ap.add_argument("--read-threads", type=int, default=None,
                    help="shardspec's reads in flight for a copying load (default: "
                    "shardspec.load.execute.READ_THREADS, the usable cores up to 8)")
    ap.add_argument("--json", type=Path, default=None, help="write all results to this file")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoints afterwards")
    args = ap.parse_args(argv)
    parse_tps(ap, args)
    args.caches = [c.strip() for c in args.cache.split(",") if c.strip()]
    if not args.caches or set(args.caches) - {"cold", "warm"}:
        ap.error("--cache takes cold, warm or both")
    if args.procs is None:
        args.procs = max(args.tps)
    if args.proc_methods is not None:
        chosen = {m.strip() for m in args.proc_methods.split(",") if m.strip()}
        unknown = chosen - set(PROC_METHODS)
        if unknown:
            ap.error(f"--proc-methods: unknown {sorted(unknown)}; known: {', '.join(PROC_METHODS)}")
        chosen |= {"shardspec", "read-fresh"}
        args.proc_methods = tuple(m for m in PROC_METHODS if m in chosen)
    if args.read_threads is not None:
        if args.read_threads < 1:
            ap.error("--read-threads must be at least 1")
        shardspec.load.execute.READ_THREADS = args.read_threads
        os.environ["SHARDSPEC_READ_THREADS"] = str(args.read_threads)  # the rank processes
    if args.staging is not None:
        try:
            readers, buffers, chunk_mib = (int(x) for x in args.staging.split("x"))
        except ValueError:
            ap.error("--staging takes READERSxBUFFERSxCHUNK_MIB, e.g. 2x4x32")
        if min(readers, buffers, chunk_mib) < 1:
            ap.error("--staging needs positive numbers")
        shardspec.load.execute.STAGING_READERS = readers
        shardspec.load.execute.STAGING_BUFFERS = buffers
        shardspec.load.execute.CHUNK_BYTES = chunk_mib * MiB
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print("--device cuda: CUDA is not available", file=sys.stderr)
            return 2
        device = torch.device("cuda", device.index or 0)
        torch.empty(1, device=device)  # create the context before any clock starts
        torch.cuda.synchronize(device)
    with bench_workdir(args.workdir, keep=args.keep) as workdir:
        return run(args, device, workdir)


def run(args: argparse.Namespace, device: torch.device, workdir: Path) -> int:
    spec, hidden = model_spec(int(args.size_gib * GiB))
    dims = {name: dim for name, _, dim in spec}
    t0 = time.perf_counter()
    weights = make_weights(spec)
    total = sum(t.numel() * t.element_size() for t in weights.values())
    print(f"synthetic model: {len(weights)} bf16 tensors, hidden {hidden}, {LAYERS} layers, "
          f"{total / GiB:.3f} GiB; generated in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    tps = sorted(set(args.tps) | ({args.procs} if args.procs else set()))
    write_checkpoints(weights, dims, workdir, tps)
    del weights
    gc.collect()
    print(f"wrote the baseline file and {len(tps)} shardspec checkpoints in "
          f"{time.perf_counter() - t0:.1f} s")
    baseline_file = workdir / "model.safetensors"
    all_files = sorted(p for p in workdir.rglob("*") if p.is_file())
    cache = PageCache()
    info = machine_info(workdir, device)
    if device.type == "cuda":
        info["staging"] = (f"{shardspec.load.execute.STAGING_READERS} reads in flight, "
                           f"{shardspec.load.execute.STAGING_BUFFERS} pinned buffers of "
                           f"{shardspec.load.execute.CHUNK_BYTES // MiB} MiB")
    info["eviction"] = ("fsync + posix_fadvise(DONTNEED) of every file before every cold load; "
                        + eviction_check(cache, baseline_file))
    methods = CPU_METHODS + CPU_LAZY if device.type == "cpu" else CUDA_METHODS + cuda_peers(
        device, shardspec.open(workdir / f"tp{max(args.tps)}").rank_files(max(args.tps) - 1),
        info)
    results: list[dict[str, Any]] = []
    failed = False

    for tp in args.tps:
        rank = tp - 1
        ckpt = workdir / f"tp{tp}"
        files = shardspec.open(ckpt).rank_files(rank)
        nbytes = sum(p.stat().st_size for p in files)
        problems = check_equal(load_shardspec(ckpt, rank, device),
                               load_baseline(baseline_file, dims, tp, rank, device))
        if device.type == "cpu":
            problems += check_equal(load_shardspec(ckpt, rank, device, mmap=True),
                                    load_baseline(baseline_file, dims, tp, rank, device))
        failed |= bool(problems)
        for state in args.caches:
            open_times: list[float] = []
            fns = contenders(device, ckpt, baseline_file, dims, tp, rank, files, open_times)
            if state == "warm":
                for fn in fns.values():
                    timed(fn, device)  # fill the page cache; first-use costs out of the clock
            open_times.clear()
            times = rotate(methods, args.repeats, lambda m, fns=fns: timed(fns[m], device),
                           (lambda: cache.evict(all_files)) if state == "cold" else None)
            del open_times[:-args.repeats]  # rotate's untimed load may have opened one more
            med = {m: statistics.median(v) for m, v in times.items()}
            row = {"tp": tp, "rank": rank, "cache": state, "device": device.type,
                   "rank_bytes": nbytes, "baseline_bytes": baseline_file.stat().st_size,
                   "times_s": times,
                   "median_s": med, "open_s": open_times,
                   "open_median_s": statistics.median(open_times),
                   "load_rank_median_s": statistics.median(
                       t - o for t, o in zip(times["shardspec"], open_times, strict=True)),
                   "bit_exact": not problems}
            results.append(row)
            print(f"TP={tp} rank {rank} {state}: " + ", ".join(
                f"{m} {med[m] * 1e3:.1f}" for m in methods) + f" ms; open "
                f"{row['open_median_s'] * 1e3:.1f} ms" + ("" if not problems else " MISMATCH"))
            del fns
            gc.collect()
        if problems:
            print(f"TP={tp}: shardspec differs from the baseline's slices: {problems[:5]}")

    procs: list[dict[str, Any]] = []
    if args.procs:
        procs = run_processes(args, device, workdir, dims, cache, all_files)

    report(args, device, info, total, len(spec), results, procs)
    if args.json:
        args.json.write_text(json.dumps({
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "machine": info, "model_bytes": total, "hidden": hidden, "tensors": len(spec),
            "results": results, "processes": procs}, indent=1))
        print(f"results written to {args.json}")
    if failed:
        print("FAILED: shardspec's tensors differ from the baseline's slices", file=sys.stderr)
        return 1
    return 0


#: Timed in a block of its own before the others: the baseline maps and copies the whole
#: checkpoint (1.1 GiB in one process, 8.8 GiB across the 8), and on the benchmark's VM the load
#: made right after it was up to 2.5x slower, whichever contender it was (benchmarks/README.md).
APART = ("baseline",)


def rotate(
    methods: tuple[str, ...], repeats: int, measure: Callable[[str], float],
    before_each: Callable[[], None] | None,
) -> dict[str, list[float]]:
    """``repeats`` rounds over ``methods`` in a rotating order, so drift and noise fall on all
    alike; ``before_each`` (the cold-cache eviction) runs before every measurement. The
    methods in :data:`APART` are measured first, then one untimed load of another method
    takes their after-effects."""
    times: dict[str, list[float]] = {m: [] for m in methods}
    apart = [m for m in methods if m in APART]
    rotated = [m for m in methods if m not in APART]
    for method in apart:
        for _ in range(repeats):
            if before_each is not None:
                before_each()
            times[method].append(measure(method))
    if apart and rotated:
        if before_each is not None:
            before_each()
        measure(rotated[0])
    for repeat in range(repeats):
        shift = repeat % max(len(rotated), 1)
        for method in rotated[shift:] + rotated[:shift]:
            if before_each is not None:
                before_each()
            times[method].append(measure(method))
    return times


def run_processes(
    args: argparse.Namespace, device: torch.device, workdir: Path, dims: dict[str, int | None],
    cache: PageCache, all_files: list[Path],
) -> list[dict[str, Any]]:
    tp = args.procs
    ckpt = workdir / f"tp{tp}"
    ranks = RankProcesses({"device": str(device), "ckpt": str(ckpt), "dims": dims,
                           "baseline": str(workdir / "model.safetensors")}, tp)
    methods = PROC_METHODS if device.type == "cpu" else ("baseline", "shardspec", "read-fresh")
    if args.proc_methods is not None:
        methods = tuple(m for m in methods if m in args.proc_methods)
    rows = []
    try:
        for state in args.caches:
            if state == "warm":
                for method in methods:
                    ranks.run(method)
            times = rotate(methods, args.repeats, ranks.run,
                           (lambda: cache.evict(all_files)) if state == "cold" else None)
            med = {m: statistics.median(v) for m, v in times.items()}
            rows.append({"tp": tp, "cache": state, "times_s": times, "median_s": med,
                         "bytes": sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))})
            print(f"{tp} processes at once, {state}: " + ", ".join(
                f"{m} {med[m]:.3f} s" for m in methods))
    finally:
        ranks.close()
    return rows


# --------------------------------------------------------------------------------------------
# Report


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}"


def _spread(row: dict[str, Any], name: str) -> str:
    times = row["times_s"][name]
    return f"{row['median_s'][name] * 1e3:.1f} [{min(times) * 1e3:.0f}-{max(times) * 1e3:.0f}]"


def peer_table(results: list[dict[str, Any]], caches: list[str]) -> None:
    """shardspec against the loaders a user picks instead, one row per TP size and cache state
    (median ms, and the range of the repeats; a ratio above 1 means shardspec is faster)."""
    if not results:
        return
    if results[0]["device"] != "cpu":
        cuda_peer_table(results, caches)
        return
    peers = [p for p in AVAILABLE_PEERS if p in results[0]["median_s"]]
    print("\n#### Against the peers (median ms, [fastest-slowest repeat]; every result "
          "touched)\n")
    for name, why in MISSING_PEERS.items():
        print(f"{name} left out: {why}")
    cols = (["TP", "cache", "shardspec copy", *peers, "best peer / copy", "copy",
             "shardspec mmap", "st-mmap", "st-mmap / shardspec mmap", "mmap"])
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join("---:" for _ in cols) + "|")
    for state in caches:
        for r in (r for r in results if r["cache"] == state):
            m, times = r["median_s"], r["times_s"]
            best = min(peers, key=lambda p: m[p], default=None)
            cell = partial(_spread, r)
            cells = [str(r["tp"]), state, cell("shardspec"), *(cell(p) for p in peers),
                     "n/a" if best is None else _ratio(m[best], m["shardspec"]),
                     "n/a" if best is None else verdict(times["shardspec"], times[best]),
                     cell("shardspec-mmap"), cell("st-mmap"),
                     _ratio(m["st-mmap"], m["shardspec-mmap"]),
                     verdict(times["shardspec-mmap"], [t * 1.1 for t in times["st-mmap"]])]
            print("| " + " | ".join(cells) + " |")
    print("\ncopy: against the best peer; mmap: against st-mmap x 1.1 (the goal: within 1.1x). "
          "ahead = median no slower; noise = median slower, but each median within the other's "
          "repeats; behind = neither")


def cuda_peer_table(results: list[dict[str, Any]], caches: list[str]) -> None:
    """The same on a GPU: the peers that loaded onto it, safetensors' own CUDA load, and the
    rate of one pinned host-to-device copy of the rank's bytes (the copy engine's ceiling)."""
    peers = [p for p in (*AVAILABLE_PEERS, *GPU_PEERS) if p in results[0]["median_s"]]
    print("\n#### Against the peers on the GPU (median ms, [fastest-slowest repeat])\n")
    cols = ["TP", "cache", "shardspec", *peers, "st-cuda", "best peer / shardspec", "verdict",
            "shardspec GB/s", "pinned-h2d GB/s"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join("---:" for _ in cols) + "|")
    for state in caches:
        for r in (r for r in results if r["cache"] == state):
            m, times, nb = r["median_s"], r["times_s"], r["rank_bytes"]
            rivals = [*peers, "st-cuda"]
            best = min(rivals, key=lambda p: m[p])
            cell = partial(_spread, r)
            print("| " + " | ".join([
                str(r["tp"]), state, cell("shardspec"), *(cell(p) for p in rivals),
                f"{_ratio(m[best], m['shardspec'])} ({best})",
                verdict(times["shardspec"], times[best]),
                f"{nb / m['shardspec'] / GB:.2f}", f"{nb / m['pinned-h2d'] / GB:.2f}"]) + " |")
    print("\nbest peer: the fastest of the peers and st-cuda; ahead = median no slower; noise = "
          "median slower, but each median within the other's repeats; behind = neither")


def report(
    args: argparse.Namespace, device: torch.device, info: dict[str, Any], total: int,
    tensors: int, results: list[dict[str, Any]], procs: list[dict[str, Any]],
) -> None:
    print("\nMachine")
    for key, value in info.items():
        print(f"  {key}: {value}")
    print(f"  model: {total / GiB:.3f} GiB bf16, {tensors} tensors; device {device}; median of "
          f"{args.repeats}; rank timed = TP-1; GB = 1e9 bytes")
    cpu = device.type == "cpu"
    for state in args.caches:
        rows = [r for r in results if r["cache"] == state]
        if not rows:
            continue
        print(f"\n#### One rank's load, {state} cache, {device} (median seconds)\n")
        if cpu:
            cols = ["TP", "rank reads", "baseline reads", "baseline s", "shardspec s",
                    "of which open s", "shardspec-cached s", "shardspec-thp s",
                    "shardspec-mmap s", "st-mmap s",
                    "st-pread s", "raw s", "read-reused s", "speedup"]
        else:
            cols = ["TP", "rank reads", "baseline reads", "baseline s", "shardspec s",
                    "of which open s", "st-cuda s", "read-reused s", "pinned-h2d s",
                    "read-then-h2d s", "shardspec GB/s", "speedup"]
        print("| " + " | ".join(cols) + " |")
        print("|" + "|".join("---:" for _ in cols) + "|")
        for r in rows:
            m = r["median_s"]
            cells = {"TP": str(r["tp"]), "rank reads": f"{r['rank_bytes'] / MiB:.0f} MiB",
                     "baseline reads": f"{r['baseline_bytes'] / MiB:.0f} MiB",
                     "of which open s": f"{r['open_median_s']:.4f}",
                     "raw s": f"{m.get('read-fresh', 0):.4f}",
                     "shardspec GB/s": f"{r['rank_bytes'] / m['shardspec'] / GB:.2f}",
                     "speedup": f"{m['baseline'] / m['shardspec']:.2f}x"}
            for name in m:
                cells.setdefault(f"{name} s", f"{m[name]:.4f}")
            print("| " + " | ".join(cells[c] for c in cols) + " |")
        print(f"\n#### Goals, {state} cache ({device})\n")
        if cpu:
            cols = ["TP", "load_rank s (opened)", "read-fresh / load_rank (>= 0.9)",
                    "read-fresh / shardspec incl. open", "st-mmap touched / shardspec (>= 1)",
                    "st-pread / shardspec", "shardspec-mmap-lazy ms", "st-lazy ms",
                    "mmap-lazy / st-lazy (<= 1.2)"]
        else:
            cols = ["TP", "load_rank s (opened)", "shardspec GB/s", "pinned-h2d GB/s",
                    "read-reused GB/s", "st-cuda / shardspec"]
        print("| " + " | ".join(cols) + " |")
        print("|" + "|".join("---:" for _ in cols) + "|")
        for r in rows:
            m, lr, nb = r["median_s"], r["load_rank_median_s"], r["rank_bytes"]
            if cpu:
                cells = [str(r["tp"]), f"{lr:.4f}", _ratio(m["read-fresh"], lr),
                         _ratio(m["read-fresh"], m["shardspec"]),
                         _ratio(m["st-mmap"], m["shardspec"]),
                         _ratio(m["st-pread"], m["shardspec"]),
                         f"{m['shardspec-mmap-lazy'] * 1e3:.2f}", f"{m['st-lazy'] * 1e3:.2f}",
                         _ratio(m["shardspec-mmap-lazy"], m["st-lazy"])]
            else:
                cells = [str(r["tp"]), f"{lr:.4f}", f"{nb / m['shardspec'] / GB:.2f}",
                         f"{nb / m['pinned-h2d'] / GB:.2f}", f"{nb / m['read-reused'] / GB:.2f}",
                         _ratio(m["st-cuda"], m["shardspec"])]
            print("| " + " | ".join(cells) + " |")
    peer_table(results, args.caches)
    if procs:
        methods = list(procs[0]["median_s"])
        print(f"\n#### {procs[0]['tp']} ranks at once, one process each (median wall seconds, "
              "start to last rank done)\n")
        print("| cache | " + " | ".join(methods) + " | baseline / shardspec |")
        print("|---|" + "|".join("---:" for _ in methods) + "|---:|")
        for row in procs:
            m = row["median_s"]
            speedup = f"{m['baseline'] / m['shardspec']:.2f}x" if "baseline" in m else "n/a"
            print(f"| {row['cache']} | " + " | ".join(f"{m[x]:.3f}" for x in methods)
                  + f" | {speedup} |")
        print("\nread-fresh / shardspec (the goal: >= 0.9): " + ", ".join(
            f"{row['cache']} {row['median_s']['read-fresh'] / row['median_s']['shardspec']:.2f}"
            for row in procs))
    print("\nEvery repeat (seconds):")
    for r in results:
        print(f"  TP={r['tp']} {r['cache']}: " + "; ".join(
            f"{k} [{' '.join(f'{x:.4f}' for x in v)}]" for k, v in r["times_s"].items())
            + f"; open [{' '.join(f'{x:.4f}' for x in r['open_s'])}]")
    for row in procs:
        print(f"  {row['tp']} processes {row['cache']}: " + "; ".join(
            f"{k} [{' '.join(f'{x:.3f}' for x in v)}]" for k, v in row["times_s"].items()))


if __name__ == "__main__":
    sys.exit(main())
