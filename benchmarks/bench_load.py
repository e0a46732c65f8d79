"""Load benchmark: one rank's load from a shardspec checkpoint vs. the single-file baseline.

On a synthetic Llama-shaped bf16 checkpoint (default 1 GiB), for each TP size this times, in one
run and interleaved per repeat, the load of one rank (rank TP-1, the last) three ways:

* ``baseline``  - what the pre-sharded format replaced: ``safetensors.torch.load_file`` of the
  whole single-file checkpoint, then slicing this rank's part of every tensor (``narrow`` along
  the TP dim) and copying it, contiguous, to the device;
* ``shardspec`` - ``shardspec.open(path).load_rank(rank, device)``, manifest parse included;
* ``raw``       - plain ``readinto`` of exactly the rank's data files, in large chunks, into one
  preallocated host buffer: the floor any loader pays for those bytes.

Cold by default: before every timed load every file of the benchmark is flushed and evicted from
the page cache (``fsync`` + ``posix_fadvise(POSIX_FADV_DONTNEED)``, no root needed). Whether that
took effect is checked with ``mincore`` and reported. ``--drop-caches`` also writes
``/proc/sys/vm/drop_caches`` (when writable) before every timed load; that is off by default
because it empties the page cache of the whole machine and, with the ``sync`` it needs, adds
other processes' I/O to the measurement.

This is a benchmark, not a test: it exits non-zero only when the loaded tensors are wrong.

    PYTHONPATH=reference python benchmarks/bench_load.py [--size-gib 1] [--tp 1,2,4,8]
        [--repeats 3] [--device cpu|cuda] [--warm] [--drop-caches] [--json OUT] [--keep]
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import datetime as dt
import gc
import json
import mmap
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import torch
from safetensors.torch import load_file, save_file

import shardspec
from synthetic import LAYERS, evict, make_weights, model_spec

HERE = Path(__file__).resolve().parent
GiB = 1 << 30
MiB = 1 << 20
GB = 1e9  # rates are decimal GB/s

METHODS = ("baseline", "shardspec", "raw")


# --------------------------------------------------------------------------------------------
# Synthetic model


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoints(
    weights: dict[str, torch.Tensor], dims: dict[str, int | None], workdir: Path, tps: list[int]
) -> None:
    baseline = workdir / "model.safetensors"
    save_file(weights, str(baseline), metadata={"format": "pt"})
    fsync_path(baseline)
    for tp in tps:
        states: dict[int, dict[str, torch.Tensor]] = {r: {} for r in range(tp)}
        sharding: dict[int, dict[str, shardspec.Shard]] = {r: {} for r in range(tp)}
        for name, tensor in weights.items():
            for rank, (piece, shard) in enumerate(shardspec.split(tensor, dims[name], tp)):
                states[rank][name] = piece
                sharding[rank][name] = shard
        shardspec.save(states, workdir / f"tp{tp}", layout=shardspec.Layout(tp_size=tp),
                       sharding=sharding, metadata={"model": "synthetic-llama"})


# --------------------------------------------------------------------------------------------
# Page cache control


class PageCache:
    """Evict files from the page cache, and measure how much of a file is resident."""

    def __init__(self, drop_caches: bool = False) -> None:
        self.drop_caches = drop_caches and self._try_drop_caches()
        self._libc: Any = None
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_int, ctypes.c_long]
            libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
            self._libc = libc
        except (OSError, AttributeError):
            pass

    @staticmethod
    def _try_drop_caches() -> bool:
        try:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("1\n")
            return True
        except OSError:
            return False

    def evict(self, paths: list[Path]) -> None:
        evict(paths)
        if self.drop_caches:
            self._try_drop_caches()

    def resident(self, path: Path) -> float | None:
        """Fraction of ``path``'s pages in the page cache (mincore), None if unavailable."""
        if self._libc is None:
            return None
        size = path.stat().st_size
        if size == 0:
            return 0.0
        page = os.sysconf("SC_PAGE_SIZE")
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = self._libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            try:
                vec = np.zeros((size + page - 1) // page, dtype=np.uint8)
                if self._libc.mincore(ctypes.c_void_p(addr), size, vec.ctypes.data) != 0:
                    return None
                return float((vec & 1).sum()) / len(vec)
            finally:
                self._libc.munmap(ctypes.c_void_p(addr), size)
        finally:
            os.close(fd)


# --------------------------------------------------------------------------------------------
# The three loads


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def load_baseline(
    path: Path, dims: dict[str, int | None], tp: int, rank: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """The seed's way: read the whole file, keep this rank's slice of each tensor.

    The slice is copied (as vLLM's weight loaders copy it into the parameter), so the result is
    owned memory on ``device``, not a view into safetensors' memory map of the whole file.
    """
    full = load_file(str(path), device="cpu")
    out = {}
    for name, tensor in full.items():
        dim = dims[name]
        part = tensor if dim is None else torch.tensor_split(tensor, tp, dim=dim)[rank]
        out[name] = part.to(device, copy=True, memory_format=torch.contiguous_format)
    return out


def load_shardspec(
    path: Path, rank: int, device: torch.device, open_times: list[float] | None = None
) -> dict[str, torch.Tensor]:
    """open (manifest read, schema and semantic checks) + load_rank; open's share is noted."""
    start = time.perf_counter()
    checkpoint = shardspec.open(path)
    if open_times is not None:
        open_times.append(time.perf_counter() - start)
    return checkpoint.load_rank(rank, device)


def raw_read(paths: list[Path], chunk: int, buffer_kind: str = "mmap") -> Any:
    """Read ``paths`` end to end into one preallocated buffer with large readinto calls.

    ``mmap``: an anonymous mapping, ordinary 4 KiB pages like the loader's ``torch.empty``
    buffer. ``numpy``: ``np.empty``, which numpy madvises for transparent huge pages; where
    THP is in ``madvise`` mode that changes the cost of faulting the buffer in (measured on the
    benchmark's VM: faster from a warm cache, slower from a cold one).
    """
    total = sum(p.stat().st_size for p in paths)
    buffer: Any = mmap.mmap(-1, total) if buffer_kind == "mmap" else np.empty(total, np.uint8)
    view = memoryview(buffer)
    position = 0
    try:
        for path in paths:
            with open(path, "rb", buffering=0) as f:
                while True:
                    got = f.readinto(view[position : position + chunk])
                    if not got:
                        break
                    position += got
    finally:
        view.release()
    if position != total:
        raise RuntimeError(f"raw read got {position} bytes, expected {total}")
    return buffer


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    gc.collect()
    start = time.perf_counter()
    result = fn()
    sync(device)
    elapsed = time.perf_counter() - start
    del result
    gc.collect()
    return elapsed


def check_equal(
    got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]
) -> list[str]:
    problems = []
    if set(got) != set(expected):
        problems.append(f"names differ: only shardspec {sorted(set(got) - set(expected))[:5]}, "
                        f"only baseline {sorted(set(expected) - set(got))[:5]}")
    for name in sorted(set(got) & set(expected)):
        a, b = got[name], expected[name]
        if a.dtype != b.dtype or a.shape != b.shape:
            problems.append(f"{name}: {a.dtype} {list(a.shape)} vs {b.dtype} {list(b.shape)}")
        elif not torch.equal(a.view(torch.int16).cpu(), b.view(torch.int16).cpu()):
            problems.append(f"{name}: values differ")
    return problems


# --------------------------------------------------------------------------------------------
# Machine description


def machine_info(workdir: Path, device: torch.device) -> dict[str, Any]:
    cpu, virtual = "unknown", False
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu == "unknown":
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags") and " hypervisor" in line:
                virtual = True
    except OSError:
        pass
    try:
        thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
    except OSError:
        thp = "unknown"
    ram = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        df = subprocess.run(["df", "-T", str(workdir)], capture_output=True, text=True,
                            check=True).stdout.splitlines()[-1].split()
        filesystem = f"{df[1]} ({df[0]})"
    except (OSError, subprocess.CalledProcessError, IndexError):
        filesystem = "unknown"
    try:
        root = str(HERE.parent)
        commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "reference"],
                               capture_output=True, text=True, check=True).stdout.strip()
        commit += " (reference/ has uncommitted changes)" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    info: dict[str, Any] = {
        "cpu": cpu + (" (virtual machine: hypervisor flag set)" if virtual else ""),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "ram_gib": round(ram / GiB, 1) if ram else None,
        "filesystem": filesystem,
        "kernel": platform.release(),
        "transparent_hugepage": thp,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
        "shardspec": shardspec.__version__,
        "commit": commit,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


# --------------------------------------------------------------------------------------------
# Main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gib", type=float, default=1.0,
                    help="checkpoint size (at least this much bf16 data; default 1.0)")
    ap.add_argument("--tp", default="1,2,4,8", help="TP sizes, comma-separated (default 1,2,4,8)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="timed loads per method and TP; the median is reported (default 3)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where to write the checkpoints (default: a new temp dir under "
                    "benchmarks/out)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--cold", dest="cold", action="store_true", default=True,
                      help="evict the files from the page cache before every timed load "
                      "(default)")
    mode.add_argument("--warm", dest="cold", action="store_false",
                      help="page cache left warm (one untimed load of each kind first)")
    ap.add_argument("--drop-caches", action="store_true",
                    help="with --cold, also write /proc/sys/vm/drop_caches before every timed "
                    "load (needs root and a writable /proc/sys; machine-wide)")
    ap.add_argument("--raw-chunk-mib", type=int, default=64,
                    help="read size of the raw read, MiB (default 64, as the loader's)")
    ap.add_argument("--raw-buffer", choices=("mmap", "numpy"), default="mmap",
                    help="buffer of the raw read: anonymous mmap, 4 KiB pages like the loader's "
                    "(default), or np.empty (transparent huge pages where THP=madvise)")
    ap.add_argument("--json", type=Path, default=None, help="write all results to this file")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoints afterwards")
    args = ap.parse_args(argv)
    args.tps = [int(t) for t in args.tp.split(",") if t.strip()]
    if not args.tps or min(args.tps) < 1:
        ap.error("--tp needs positive integers")
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    return args


def eviction_check(cache: PageCache, path: Path, device: torch.device) -> dict[str, Any]:
    """Warm read vs. read right after eviction, and page-cache residency after eviction."""
    chunk = 64 * MiB
    size = path.stat().st_size
    raw_read([path], chunk)  # make it warm
    warm_resident = cache.resident(path)
    warm = timed(lambda: raw_read([path], chunk), device)
    cache.evict([path])
    cold_resident = cache.resident(path)
    cold = timed(lambda: raw_read([path], chunk), device)
    return {
        "file_bytes": size,
        "resident_when_warm": warm_resident,
        "resident_after_evict": cold_resident,
        "warm_read_gbps": size / warm / GB,
        "read_after_evict_gbps": size / cold / GB,
    }


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

    if args.workdir is None:
        out = Path(os.environ.get("SHARDSPEC_BENCH_OUT", HERE / "out"))
        out.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="bench-", dir=out))
        made_workdir = True
    else:
        workdir = args.workdir
        made_workdir = not workdir.exists()
        workdir.mkdir(parents=True, exist_ok=True)
        if any(workdir.iterdir()):
            print(f"--workdir {workdir} is not empty", file=sys.stderr)
            return 2
    try:
        return run(args, device, workdir)
    finally:
        if not args.keep:
            if made_workdir:
                shutil.rmtree(workdir, ignore_errors=True)
            else:
                for child in workdir.iterdir():
                    if child.is_dir():
                        shutil.rmtree(child, ignore_errors=True)
                    else:
                        child.unlink(missing_ok=True)
        else:
            print(f"kept the checkpoints in {workdir}")


def run(args: argparse.Namespace, device: torch.device, workdir: Path) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=160)
    spec, hidden = model_spec(int(args.size_gib * GiB))
    dims = {name: dim for name, _, dim in spec}
    for name, shape, dim in spec:
        if dim is not None and any(shape[dim] % tp for tp in args.tps):
            console.print(f"note: {name} dim {dim} ({shape[dim]}) does not divide evenly by "
                          f"every TP in {args.tps}; tensor_split sizes are used")
            break

    t0 = time.perf_counter()
    weights = make_weights(spec)
    total = sum(t.numel() * t.element_size() for t in weights.values())
    console.print(f"synthetic model: {len(weights)} bf16 tensors, hidden {hidden}, "
                  f"{LAYERS} layers, {total / GiB:.3f} GiB; generated in "
                  f"{time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    write_checkpoints(weights, dims, workdir, args.tps)
    del weights
    gc.collect()
    console.print(f"wrote the baseline file and {len(args.tps)} shardspec checkpoints to "
                  f"{workdir} in {time.perf_counter() - t0:.1f} s")

    baseline_path = workdir / "model.safetensors"
    all_files = sorted(p for p in workdir.rglob("*") if p.is_file())
    cache = PageCache(drop_caches=args.cold and args.drop_caches)
    info = machine_info(workdir, device)
    evict = eviction_check(cache, baseline_path, device) if args.cold else None
    info["page_cache"] = "cold" if args.cold else "warm"
    info["eviction"] = (
        ("posix_fadvise(DONTNEED) after fsync"
         + (" + /proc/sys/vm/drop_caches" if cache.drop_caches
            else "; drop_caches not used" + (" (not writable)" if args.drop_caches else "")))
        if args.cold else "none (--warm)")
    info["eviction_check"] = evict

    chunk = args.raw_chunk_mib * MiB
    results: list[dict[str, Any]] = []
    failed = False
    for tp in args.tps:
        rank = tp - 1
        ckpt_path = workdir / f"tp{tp}"
        rank_files = shardspec.open(ckpt_path).rank_files(rank)
        open_times: list[float] = []
        rank_bytes = sum(p.stat().st_size for p in rank_files)
        base_bytes = baseline_path.stat().st_size
        fns: dict[str, Callable[[], Any]] = {
            "baseline": lambda tp=tp, rank=rank: load_baseline(baseline_path, dims, tp, rank,
                                                               device),
            "shardspec": lambda p=ckpt_path, rank=rank, opens=open_times: load_shardspec(
                p, rank, device, opens),
            "raw": lambda files=rank_files: raw_read(files, chunk, args.raw_buffer),
        }
        if not args.cold:
            for fn in fns.values():
                timed(fn, device)  # warm-up
        open_times.clear()
        times: dict[str, list[float]] = {m: [] for m in METHODS}
        for rep in range(args.repeats):
            order = METHODS[rep % 3:] + METHODS[: rep % 3]  # rotate to spread drift and noise
            for method in order:
                if args.cold:
                    cache.evict(all_files)
                times[method].append(timed(fns[method], device))

        # correctness, untimed
        expected = load_baseline(baseline_path, dims, tp, rank, device)
        got = load_shardspec(ckpt_path, rank, device)
        problems = check_equal(got, expected)
        del expected, got
        gc.collect()
        if problems:
            failed = True
            console.print(f"[red]TP={tp} rank {rank}: shardspec differs from the baseline "
                          f"slices:[/red] " + escape("; ".join(problems[:5])))

        med = {m: statistics.median(v) for m, v in times.items()}
        # the same shardspec loads without their open(): the data path alone
        load_only = statistics.median(
            t - o for t, o in zip(times["shardspec"], open_times, strict=True))
        row = {
            "tp": tp, "rank": rank,
            "baseline_bytes": base_bytes, "rank_bytes": rank_bytes, "rank_files": len(rank_files),
            "manifest_bytes": (ckpt_path / "shardspec.json").stat().st_size,
            "times_s": times, "median_s": med,
            "shardspec_open_s": open_times,
            "shardspec_open_median_s": statistics.median(open_times),
            "shardspec_load_only_median_s": load_only,
            "baseline_gbps": base_bytes / med["baseline"] / GB,
            "shardspec_gbps": rank_bytes / med["shardspec"] / GB,
            "raw_gbps": rank_bytes / med["raw"] / GB,
            "speedup": med["baseline"] / med["shardspec"],
            "rate_vs_raw": med["raw"] / med["shardspec"],
            "load_only_vs_raw": med["raw"] / load_only,
            "bit_exact": not problems,
        }
        results.append(row)
        console.print(escape(f"TP={tp} rank {rank}: " + ", ".join(
            f"{m} {med[m]:.3f} s [{' '.join(f'{x:.3f}' for x in times[m])}]" for m in METHODS)
            + f", shardspec open [{' '.join(f'{x:.3f}' for x in open_times)}] "
            f"({'bit-exact' if not problems else 'MISMATCH'})"))

    # ---- report
    console.print()
    console.print("[bold]Machine[/bold]")
    for key in ("cpu", "cores", "cores_usable", "ram_gib", "filesystem", "kernel",
                "transparent_hugepage", "python",
                "torch", "safetensors", "numpy", "shardspec", "commit", "gpu", "date", "page_cache",
                "eviction"):
        if key in info:
            console.print(f"  {key}: {escape(str(info[key]))}")
    if evict:
        res_w, res_c = evict["resident_when_warm"], evict["resident_after_evict"]
        console.print(
            f"  eviction check on model.safetensors ({evict['file_bytes'] / GiB:.2f} GiB): "
            f"resident warm {_pct(res_w)}, after evict {_pct(res_c)}; read warm "
            f"{evict['warm_read_gbps']:.2f} GB/s, right after evict "
            f"{evict['read_after_evict_gbps']:.2f} GB/s")
    console.print(f"  model: {total / GiB:.3f} GiB bf16, {len(spec)} tensors; device {device}; "
                  f"median of {args.repeats}; rank timed = TP-1; GB = 1e9 bytes; "
                  f"raw read: {args.raw_chunk_mib} MiB readinto into one {args.raw_buffer} buffer")

    headers = ["TP", "rank", "baseline reads", "baseline s", "baseline GB/s", "rank reads",
               "shardspec s", "of which open s", "shardspec GB/s", "raw s", "raw GB/s",
               "speedup", "goal >= 0.8*TP", "shardspec/raw", "goal >= 0.8",
               "without open: s", "speedup", "/raw"]
    short = ["TP", "rank", "base\nreads", "base\ns", "base\nGB/s", "rank\nreads", "shardspec\ns",
             "open\ns", "shardspec\nGB/s", "raw\ns", "raw\nGB/s", "speedup", "goal\n0.8*TP",
             "shardspec\n/raw", "goal\n0.8", "w/o open\ns", "w/o open\nspeedup",
             "w/o open\n/raw"]
    rows = []
    for r in results:
        goal = 0.8 * r["tp"]
        rows.append([
            str(r["tp"]), str(r["rank"]), f"{r['baseline_bytes'] / MiB:.0f} MiB",
            f"{r['median_s']['baseline']:.3f}", f"{r['baseline_gbps']:.2f}",
            f"{r['rank_bytes'] / MiB:.0f} MiB",
            f"{r['median_s']['shardspec']:.3f}", f"{r['shardspec_open_median_s']:.3f}",
            f"{r['shardspec_gbps']:.2f}",
            f"{r['median_s']['raw']:.3f}", f"{r['raw_gbps']:.2f}",
            f"{r['speedup']:.2f}x", ("met" if r["speedup"] >= goal else "NOT met")
            + f" ({goal:.1f})",
            f"{r['rate_vs_raw']:.2f}", "met" if r["rate_vs_raw"] >= 0.8 else "NOT met",
            f"{r['shardspec_load_only_median_s']:.3f}",
            f"{r['median_s']['baseline'] / r['shardspec_load_only_median_s']:.2f}x",
            f"{r['load_only_vs_raw']:.2f}",
        ])
    table = Table(title=f"One rank's load, {total / GiB:.2f} GiB checkpoint, "
                  f"{'cold' if args.cold else 'warm'} cache, device {device}")
    for h in short:
        table.add_column(h, justify="right")
    for row_cells in rows:
        table.add_row(*row_cells)
    console.print()
    console.print(table)

    print()
    print("| " + " | ".join(headers) + " |")
    print("|" + "|".join("---:" for _ in headers) + "|")
    for row_cells in rows:
        print("| " + " | ".join(row_cells) + " |")
    print()

    if args.json:
        args.json.write_text(json.dumps({
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "machine": info, "model_bytes": total, "hidden": hidden, "tensors": len(spec),
            "results": results,
        }, indent=2))
        print(f"results written to {args.json}")
    if failed:
        print("FAILED: shardspec's tensors differ from the baseline's slices", file=sys.stderr)
        return 1
    return 0


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


if __name__ == "__main__":
    sys.exit(main())
