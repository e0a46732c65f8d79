"""CUDA staging settings side by side: one rank's load onto a GPU per setting, warm and cold.

The pinned staging ring of a CUDA load (``shardspec.load.execute``: ``STAGING_READERS`` reads in
flight, ``STAGING_BUFFERS`` pinned buffers of ``CHUNK_BYTES``) is set per load, and the settings
are timed in a rotating order in each repeat, in one process, on the same synthetic Llama-shaped
bf16 checkpoint as ``bench_load.py`` (rank TP-1 of each TP size). The clock stops after
``torch.cuda.synchronize()``. Cold loads evict every file first. Each setting's result is
checked bit for bit against a CPU load of the same rank.

    PYTHONPATH=reference python benchmarks/bench_staging.py [--settings 1x2x64,4x8x16,8x16x16]
        [--tp 1,8] [--repeats 3] [--cache warm,cold] [--size-gib 1] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import torch

import shardspec
import shardspec.load.execute as execute
from bench_load import PageCache, write_checkpoints
from synthetic import bench_workdir, make_weights, model_spec

MiB = 1 << 20
GB = 1e9
DEFAULT = "default"


def setting_of(text: str) -> tuple[int, int, int]:
    """READERSxBUFFERSxCHUNK_MIB, or ``default`` for the module's own values."""
    if text == DEFAULT:
        return execute.STAGING_READERS, execute.STAGING_BUFFERS, execute.CHUNK_BYTES // MiB
    readers, buffers, chunk_mib = (int(x) for x in text.split("x"))
    if min(readers, buffers, chunk_mib) < 1:
        raise ValueError(f"{text}: every number must be positive")
    return readers, buffers, chunk_mib


def load_with(setting: tuple[int, int, int], ckpt: Path, rank: int, device: torch.device
              ) -> dict[str, torch.Tensor]:
    saved = execute.STAGING_READERS, execute.STAGING_BUFFERS, execute.CHUNK_BYTES
    execute.STAGING_READERS, execute.STAGING_BUFFERS = setting[0], setting[1]
    execute.CHUNK_BYTES = setting[2] * MiB
    try:
        return shardspec.open(ckpt).load_rank(rank, device)
    finally:
        execute.STAGING_READERS, execute.STAGING_BUFFERS, execute.CHUNK_BYTES = saved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", default=f"1x2x64,4x8x16,8x16x16,{DEFAULT}",
                    help="READERSxBUFFERSxCHUNK_MIB, comma-separated; 'default' for the module's")
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
        print("settings (readers x pinned buffers x MiB): "
              + ", ".join(f"{n} = {'x'.join(map(str, s))}" for n, s in settings.items()))
        print("| TP | cache | " + " | ".join(f"{n} ms [range]" for n in names)
              + " | " + " | ".join(f"{n} GB/s" for n in names) + " |")
        print("|" + "---:|" * (2 + 2 * len(names)))
        for tp in tps:
            ckpt, rank = workdir / f"tp{tp}", tp - 1
            nbytes = sum(p.stat().st_size for p in shardspec.open(ckpt).rank_files(rank))
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
                times: dict[str, list[float]] = {n: [] for n in names}
                for repeat in range(args.repeats):
                    shift = repeat % len(names)
                    for name in names[shift:] + names[:shift]:
                        if state == "cold":
                            cache.evict(files)
                        gc.collect()
                        start = time.perf_counter()
                        result = load_with(settings[name], ckpt, rank, device)
                        if device.type == "cuda":
                            torch.cuda.synchronize(device)
                        times[name].append(time.perf_counter() - start)
                        del result
                med = {n: statistics.median(v) for n, v in times.items()}
                print(f"| {tp} | {state} | "
                      + " | ".join(f"{med[n] * 1e3:.1f} [{min(times[n]) * 1e3:.0f}-"
                                   f"{max(times[n]) * 1e3:.0f}]" for n in names) + " | "
                      + " | ".join(f"{nbytes / med[n] / GB:.2f}" for n in names) + " |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
