"""The load benchmarks' harness (``load/``): the checkpoints they write, the page cache, the
loads they time and how they time them, the machine they ran on.

``bench_load.py`` times every contender in one process, ``bench_mmap.py`` the zero-copy ones
warm, ``bench_first_load.py`` one load per fresh process, ``bench_staging.py`` the CUDA staging
settings; each takes its contenders from here.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import datetime as dt
import gc
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import torch
from safetensors.torch import load_file, save_file

import shardspec
import shardspec.load.execute
import shardspec.load.host_memory
import shardspec.load.host_reads
from harness import REPO
from harness.peers import GPU_PEERS, PEERS, missing_peers
from harness.synthetic import bench_workdir, evict, make_weights, model_spec

GiB = 1 << 30


MiB = 1 << 20


GB = 1e9  # rates are decimal GB/s


PAGE = 4096


CHUNK = 64 * MiB


MISSING_PEERS = missing_peers()


AVAILABLE_PEERS = tuple(name for name in PEERS if name not in MISSING_PEERS)


MISSING_GPU_PEERS = missing_peers(GPU_PEERS)  # tried on --device cuda only


LOADERS = {name: fn for name, (_, fn) in {**PEERS, **GPU_PEERS}.items()}


def fsync_path(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


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


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def touch(result: Any) -> int:
    """Read one byte of every 4 KiB page of every distinct storage in ``result``.

    A lazy mapping is faulted in by this (from the page cache, or the disk when cold); memory a
    copy already wrote is only read. The same function runs on every contender's result.
    """
    if isinstance(result, dict):
        tensors = list(result.values())
    else:
        tensors = list(result) if isinstance(result, list) else [result]
    seen: set[int] = set()
    total = 0
    for tensor in tensors:
        storage = tensor.untyped_storage()
        if storage.nbytes() == 0 or storage.data_ptr() in seen or tensor.device.type != "cpu":
            continue
        seen.add(storage.data_ptr())
        flat = torch.empty(0, dtype=torch.uint8).set_(storage)
        total += int(flat[::PAGE].sum()) + int(flat[-1])
    return total


def load_baseline(
    path: Path, dims: dict[str, int | None], tp: int, rank: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """Read the whole file, keep this rank's slice of each tensor, copied (as vLLM's weight
    loaders copy it into the parameter): owned memory on ``device``, not a view of the map."""
    full = load_file(str(path), device="cpu")
    out = {}
    for name, tensor in full.items():
        dim = dims[name]
        part = tensor if dim is None else torch.tensor_split(tensor, tp, dim=dim)[rank]
        out[name] = part.to(device, copy=True, memory_format=torch.contiguous_format)
    return out


def load_shardspec(
    path: Path, rank: int, device: torch.device, open_times: list[float] | None = None,
    **kwargs: Any,
) -> dict[str, torch.Tensor]:
    start = time.perf_counter()
    checkpoint = shardspec.open(path)
    if open_times is not None:
        open_times.append(time.perf_counter() - start)
    return checkpoint.load_rank(rank, device, **kwargs)


def load_shardspec_set(module: Any, setting: str, value: object, path: Path, rank: int,
                       device: torch.device) -> dict[str, torch.Tensor]:
    """``load_shardspec`` with one module-level setting changed for the load."""
    saved = getattr(module, setting)
    setattr(module, setting, value)
    try:
        return load_shardspec(path, rank, device)
    finally:
        setattr(module, setting, saved)


load_shardspec_thp = partial(load_shardspec_set, shardspec.load.host_memory, "USE_HUGE_PAGES", True)


load_shardspec_cached = partial(load_shardspec_set, shardspec.load.host_reads, "DIRECT_READS",
                                False)


def load_st(files: list[Path], device: str = "cpu", backend: str = "mmap"
            ) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for path in files:
        out.update(load_file(str(path), device=device, backend=backend))
    return out


def read_into(paths: list[Path], buffer: torch.Tensor) -> torch.Tensor:
    """Fill ``buffer`` with ``paths`` end to end, 64 MiB ``readinto`` calls."""
    view = memoryview(buffer.numpy())
    position = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while got := f.readinto(view[position : position + CHUNK]):
                position += got
    if position != len(view):
        raise RuntimeError(f"read {position} bytes, expected {len(view)}")
    return buffer


def read_fresh(paths: list[Path]) -> list[torch.Tensor]:
    """One new torch.empty buffer per file (what a loader that allocates per file pays)."""
    return [read_into([p], torch.empty(p.stat().st_size, dtype=torch.uint8)) for p in paths]


def check_equal(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> list[str]:
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


def peer_versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for package in ("runai-model-streamer", "fastsafetensors", "instanttensor"):
        try:
            out.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            out.append(f"{package} not installed")
    return ", ".join(out)


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
        root = str(REPO)
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
        "peers": peer_versions(),
        "read_threads": shardspec.load.execute.READ_THREADS,
        "numpy": np.__version__,
        "shardspec": shardspec.__version__,
        "commit": commit,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def verdict(ours: list[float], theirs: list[float]) -> str:
    """"ahead" when our median is no slower; "noise" when it is slower but each median lies
    within the other's repeats (between their fastest and slowest); "behind" otherwise."""
    mine, other = statistics.median(ours), statistics.median(theirs)
    if mine <= other:
        return "ahead"
    return "noise" if mine <= max(theirs) and other >= min(ours) else "behind"



def rank_loads(ckpt: Path, rank: int, tp: int, files: list[Path], device: torch.device,
               baseline: Path, dims: dict[str, int | None],
               open_times: list[float] | None = None) -> dict[str, Callable[[], Any]]:
    """Name -> one load of ``rank`` on cpu, untouched, by each contender that every run of the
    load benchmark has (``open_times``: where ``shardspec``'s ``open`` times go)."""
    return {
        "baseline": lambda: load_baseline(baseline, dims, tp, rank, device),
        "shardspec": lambda: load_shardspec(ckpt, rank, device, open_times),
        "shardspec-cached": lambda: load_shardspec_cached(ckpt, rank, device),
        "shardspec-mmap": lambda: load_shardspec(ckpt, rank, device, mmap=True),
        "st-mmap": lambda: load_st(files),
        "st-pread": lambda: load_st(files, backend="pread"),
        "read-fresh": lambda: read_fresh(files),
        **{name: (lambda fn=PEERS[name][1]: fn(files)) for name in AVAILABLE_PEERS},
    }


def model_options(ap: argparse.ArgumentParser, repeats: int, repeats_help: str) -> None:
    """The options of the synthetic model and its repeats: ``--size-gib``, ``--tp``,
    ``--repeats``."""
    ap.add_argument("--size-gib", type=float, default=1.0,
                    help="checkpoint size (at least this much bf16 data; default 1.0)")
    ap.add_argument("--tp", default="1,2,4,8", help="TP sizes, comma-separated (default 1,2,4,8)")
    ap.add_argument("--repeats", type=int, default=repeats, help=repeats_help)


def parse_tps(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``args.tps`` from ``--tp``; an error where it or ``--repeats`` is not positive."""
    args.tps = [int(t) for t in args.tp.split(",") if t.strip()]
    if not args.tps or min(args.tps) < 1:
        ap.error("--tp needs positive integers")
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")


def written_model(args: argparse.Namespace, workdir: Path) -> int:
    """The synthetic model of ``--size-gib``, written into ``workdir`` whole and at each TP of
    ``args.tps``, its memory freed; its count of tensors."""
    spec, _ = model_spec(int(args.size_gib * GiB))
    write_checkpoints(make_weights(spec), {name: dim for name, _, dim in spec}, workdir, args.tps)
    gc.collect()
    return len(spec)


def in_workdir(run: Callable[[argparse.Namespace, Path], int], args: argparse.Namespace,
               prefix: str) -> int:
    """``run(args, workdir)`` in the ``--workdir`` of ``args`` or a new one (``prefix``)."""
    with bench_workdir(args.workdir, prefix=prefix) as workdir:
        return run(args, workdir)
