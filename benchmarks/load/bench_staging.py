"""CUDA staging settings side by side: one rank's load onto a GPU per setting, warm and cold.

The pinned staging ring of a CUDA load (``shardspec.load.execute``: ``STAGING_READERS`` reads in
flight, ``STAGING_BUFFERS`` pinned buffers of ``CHUNK_BYTES``) is set per load, and the settings
are timed in a rotating order in each repeat, in one process, on the same synthetic Llama-shaped
bf16 checkpoint as ``bench_load.py`` (rank TP-1 of each TP size). The clock stops after
``torch.cuda.synchronize()``. Cold loads evict every file first. Each setting's result is
checked bit for bit against a CPU load of the same rank.

A setting ending in ``-cached`` reads through the page cache where the file is cold too
(``SHARDSPEC_DIRECT_READS=0``): whether a disk rewards ``O_DIRECT`` chunks or buffered reads
with readahead. ``--peers`` adds the loaders of ``peers.py`` that load onto the device, and
safetensors' own ``load_file(device=...)`` (``st-cuda``), to the same rotation.

    PYTHONPATH=reference python benchmarks/load/bench_staging.py [--settings 1x2x64,default-cached]
        [--peers] [--tp 1,8] [--repeats 3] [--cache warm,cold] [--size-gib 1] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
import shardspec  # noqa: E402
import shardspec.load.execute as execute  # noqa: E402
import shardspec.load.host_reads as host_reads  # noqa: E402
from harness.load import GB, MiB, PageCache, write_checkpoints  # noqa: E402
from harness.peers import GPU_PEERS, PEERS, missing_peers  # noqa: E402
from harness.synthetic import bench_workdir, make_weights, model_spec  # noqa: E402

DEFAULT = "default"
CACHED = "-cached"

Setting = tuple[int, int, int, bool]  # readers, buffers, chunk MiB, direct reads when cold


def setting_of(text: str) -> Setting:
    """READERSxBUFFERSxCHUNK_MIB, or ``default`` for the module's own values; ``-cached`` at
    the end: no direct reads."""
    direct = not text.endswith(CACHED)
    text = text.removesuffix(CACHED)
    if text == DEFAULT:
        return (execute.STAGING_READERS, execute.STAGING_BUFFERS, execute.CHUNK_BYTES // MiB,
                direct)
    readers, buffers, chunk_mib = (int(x) for x in text.split("x"))
    if min(readers, buffers, chunk_mib) < 1:
        raise ValueError(f"{text}: every number must be positive")
    return readers, buffers, chunk_mib, direct


def load_with(setting: Setting, ckpt: Path, rank: int, device: torch.device
              ) -> dict[str, torch.Tensor]:
    saved = (execute.STAGING_READERS, execute.STAGING_BUFFERS, execute.CHUNK_BYTES,
             host_reads.DIRECT_READS)
    execute.STAGING_READERS, execute.STAGING_BUFFERS = setting[0], setting[1]
    execute.CHUNK_BYTES, host_reads.DIRECT_READS = setting[2] * MiB, setting[3]
    try:
        return shardspec.open(ckpt).load_rank(rank, device)
    finally:
        (execute.STAGING_READERS, execute.STAGING_BUFFERS, execute.CHUNK_BYTES,
         host_reads.DIRECT_READS) = saved


def device_peers(device: torch.device, files: list[Path]) -> dict[str, Callable[[], Any]]:
    """The peers that load ``files`` onto ``device`` here (one untimed trial each), and
    ``st-cuda``; a peer that fails is left out with a line saying why."""
    loads: dict[str, Callable[[], Any]] = {
        "st-cuda": lambda: {k: v for p in files
                            for k, v in load_file(str(p), device=str(device)).items()}}
    candidates = {**PEERS, **GPU_PEERS}
    missing = {**missing_peers(PEERS), **missing_peers(GPU_PEERS)}
    for name, (_, fn) in candidates.items():
        if name in missing:
            print(f"{name} left out: {missing[name]}")
            continue
        try:
            fn(files, device=str(device))
        except Exception as exc:  # noqa: BLE001 - a peer that cannot load here is left out
            print(f"{name} left out: {type(exc).__name__}: {exc}"[:300])
            continue
        loads[name] = lambda fn=fn: fn(files, device=str(device))
    return loads


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", default=f"1x2x64,4x8x16,8x16x16,{DEFAULT}",
                    help="READERSxBUFFERSxCHUNK_MIB, comma-separated; 'default' for the module's")
    ap.add_argument("--peers", action="store_true",
                    help="also time the peers that load onto the device, and st-cuda")
    ap.add_argument("--tp", default="1,8")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache", default="warm,cold")
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args(argv)
    names = [s.strip() for s in args.settings.split(",") if s.strip()]
    settings = {name: setting_of(name) for name in names}
    tps = [int(t) for t in args.tp.split(",")]
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print("CUDA is not available", file=sys.stderr)
            return 2
        torch.empty(1, device=device)
    cache = PageCache()
    failed = False
    with bench_workdir(args.workdir) as workdir:
        spec, _ = model_spec(int(args.size_gib * (1 << 30)))
        weights = make_weights(spec)
        write_checkpoints(weights, {n: d for n, _, d in spec}, workdir, tps)
        del weights
        files = sorted(p for p in workdir.rglob("*.safetensors"))
        print("settings (readers x pinned buffers x MiB, direct reads when cold): "
              + ", ".join(f"{n} = {'x'.join(map(str, s[:3]))}{'' if s[3] else ' cached'}"
                          for n, s in settings.items()))
        peer_names: list[str] = []
        for tp in tps:
            ckpt, rank = workdir / f"tp{tp}", tp - 1
            rank_files = shardspec.open(ckpt).rank_files(rank)
            nbytes = sum(p.stat().st_size for p in rank_files)
            loads: dict[str, Callable[[], Any]] = {
                name: (lambda s=setting, c=ckpt, r=rank: load_with(s, c, r, device))
                for name, setting in settings.items()}
            if args.peers:
                peers = device_peers(device, rank_files)
                loads.update(peers)
                peer_names = list(peers)
            columns = [*names, *peer_names]
            print(f"\nTP={tp}, rank {rank}, {nbytes / MiB:.0f} MiB\n")
            print("| cache | " + " | ".join(f"{n} ms [range]" for n in columns)
                  + " | " + " | ".join(f"{n} GB/s" for n in columns) + " |")
            print("|" + "---:|" * (1 + 2 * len(columns)))
            expected = shardspec.open(ckpt).load_rank(rank, "cpu")
            for name, setting in settings.items():
                got = load_with(setting, ckpt, rank, device)
                bad = [k for k, v in expected.items()
                       if not torch.equal(got[k].cpu().view(torch.uint8), v.view(torch.uint8))]
                if bad or set(got) != set(expected):
                    print(f"TP={tp} {name}: differs from the CPU load: {bad[:5]}")
                    failed = True
            del expected, got
            for state in [c.strip() for c in args.cache.split(",")]:
                times: dict[str, list[float]] = {n: [] for n in columns}
                for repeat in range(args.repeats):
                    shift = repeat % len(columns)
                    for name in columns[shift:] + columns[:shift]:
                        if state == "cold":
                            cache.evict(files)
                        gc.collect()
                        start = time.perf_counter()
                        result = loads[name]()
                        if device.type == "cuda":
                            torch.cuda.synchronize(device)
                        times[name].append(time.perf_counter() - start)
                        del result
                med = {n: statistics.median(v) for n, v in times.items()}
                print(f"| {state} | "
                      + " | ".join(f"{med[n] * 1e3:.1f} [{min(times[n]) * 1e3:.0f}-"
                                   f"{max(times[n]) * 1e3:.0f}]" for n in columns) + " | "
                      + " | ".join(f"{nbytes / med[n] / GB:.2f}" for n in columns) + " |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
