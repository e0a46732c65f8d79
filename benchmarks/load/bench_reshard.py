"""Resharding-on-load benchmark: rank 0 of TP=2 read from a TP=8 checkpoint vs. a native TP=2 one.

On a synthetic Llama-shaped bf16 checkpoint (default 512 MiB), written at TP=8 and at TP=2,
this times, interleaved per repeat (order alternating), two loads of the same tensors:

* ``native``    - ``shardspec.open(tp2).load_rank(0, device)``: rank 0's own files, read whole;
* ``resharded`` - ``shardspec.open(tp8).load_rank(0, device, layout=Layout(tp_size=2))``: the
  byte ranges of TP=8 ranks 0-3 that make up TP=2 rank 0, read with partial reads.

Both include opening the checkpoint (manifest parse and checks). Cold by default: before every
timed load every data file of both checkpoints is flushed and evicted from the page cache
(``fsync`` + ``posix_fadvise(POSIX_FADV_DONTNEED)``, no root needed); ``--warm`` also times
warm loads. The bytes each load reads are counted (for the resharded load, by the loader's own
:class:`shardspec.reshard.load.ReadStats`), and the two results are compared bit for bit.

Goals (the issue): bytes read <= 1.1 x the target piece's bytes; time <= 1.3 x native.
This is a benchmark, not a test: it exits non-zero only when the loaded tensors differ.

    PYTHONPATH=reference python benchmarks/load/bench_reshard.py [--size-mib 512] [--repeats 5]
        [--device cpu|cuda] [--warm] [--json OUT] [--keep]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
import shardspec  # noqa: E402
from harness import OUT  # noqa: E402
from harness.synthetic import LAYERS, VOCAB, Spec, evict, make_weights, model_spec  # noqa: E402
from shardspec import Layout  # noqa: E402
from shardspec.reshard.load import ReadStats, load_resharded  # noqa: E402

MiB = 1 << 20
SOURCE_TP, TARGET_TP, RANK = 8, 2, 0


def write_checkpoint(
    path: Path, spec: Spec, tp: int
) -> None:
    """Deterministic finite bf16 weights (random bit patterns, top exponent bit cleared)."""
    weights = make_weights(spec, seed=7)
    states: dict[int, dict[str, torch.Tensor]] = {r: {} for r in range(tp)}
    sharding: dict[int, dict[str, shardspec.Shard]] = {r: {} for r in range(tp)}
    for name, _, dim in spec:
        tensor = weights[name]
        for rank, (piece, shard) in enumerate(shardspec.split(tensor, dim, tp)):
            states[rank][name] = piece
            sharding[rank][name] = shard
    shardspec.save(states, path, layout=Layout(tp_size=tp), sharding=sharding)


def timed(load: Callable[[], dict[str, torch.Tensor]], device: torch.device) -> float:
    gc.collect()
    start = time.perf_counter()
    result = load()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    del result
    gc.collect()
    return elapsed


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    if set(a) != set(b):
        return [f"names differ: {sorted(set(a) ^ set(b))[:5]}"]
    return [n for n in a if a[n].shape != b[n].shape
            or not torch.equal(a[n].view(torch.int16).cpu(), b[n].view(torch.int16).cpu())]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=512, help="checkpoint size (default 512)")
    ap.add_argument("--repeats", type=int, default=5, help="timed loads of each kind per mode")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    ap.add_argument("--warm", action="store_true", help="also time with a warm page cache")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoints")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.empty(1, device=device)
        torch.cuda.synchronize(device)

    OUT.mkdir(parents=True, exist_ok=True)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="reshard-", dir=OUT))
    spec, _ = model_spec(args.size_mib * MiB)
    hidden = spec[0][1][1]
    total = sum(2 * torch.Size(shape).numel() for _, shape, _ in spec)
    print(f"# synthetic Llama: hidden {hidden}, {LAYERS} layers, vocab {VOCAB}, "
          f"{total / MiB:.0f} MiB bf16; writing TP={SOURCE_TP} and TP={TARGET_TP} to {workdir}",
          file=sys.stderr)
    source, native = workdir / f"tp{SOURCE_TP}", workdir / f"tp{TARGET_TP}"
    for path, tp in ((source, SOURCE_TP), (native, TARGET_TP)):
        if not (path / "shardspec.json").exists():
            write_checkpoint(path, spec, tp)
    files = [p for p in source.iterdir()] + [p for p in native.iterdir()]
    target = Layout(tp_size=TARGET_TP)

    def load_native() -> dict[str, torch.Tensor]:
        return shardspec.open(native).load_rank(RANK, device)

    def load_resharded_api() -> dict[str, torch.Tensor]:
        return shardspec.open(source).load_rank(RANK, device, layout=target)

    opened = {"native": shardspec.open(native), "resharded": shardspec.open(source)}

    def load_native_opened() -> dict[str, torch.Tensor]:
        return opened["native"].load_rank(RANK, device)

    def load_resharded_opened() -> dict[str, torch.Tensor]:
        return opened["resharded"].load_rank(RANK, device, layout=target)

    # correctness and byte counts (untimed)
    checkpoint = shardspec.open(source)
    stats = ReadStats()
    resharded = load_resharded(checkpoint.path, checkpoint.manifest, RANK, target,
                               torch.device("cpu"), stats=stats)
    problems = same(resharded, load_native())
    del resharded
    native_bytes = sum(f.size for f in shardspec.open(native).manifest.ranks[RANK].files)

    loads = {
        ("native", "open+load"): load_native,
        ("resharded", "open+load"): load_resharded_api,
        ("native", "load"): load_native_opened,
        ("resharded", "load"): load_resharded_opened,
    }
    modes = ["cold"] + (["warm"] if args.warm else [])
    times: dict[str, dict[str, list[float]]] = {
        m: {f"{k}/{w}": [] for k, w in loads} for m in modes}
    for mode in modes:
        if mode == "warm":
            for load in loads.values():
                load()
        for repeat in range(args.repeats):
            order = list(loads.items())
            for (kind, what), load in order if repeat % 2 == 0 else order[::-1]:
                if mode == "cold":
                    evict(files)
                times[mode][f"{kind}/{what}"].append(timed(load, device))

    target_bytes = stats.target_bytes
    rows = []
    for mode in modes:
        med = {k: statistics.median(v) for k, v in times[mode].items()}
        for kind, read in (("native", native_bytes), ("resharded", stats.bytes_read)):
            full, only = f"{kind}/open+load", f"{kind}/load"
            rows.append({
                "mode": mode, "load": kind, "median_s": med[full],
                "min_s": min(times[mode][full]), "max_s": max(times[mode][full]),
                "load_only_s": med[only], "bytes_read": read,
                "read_ratio": read / target_bytes,
                "time_ratio": med[full] / med["native/open+load"],
                "load_only_ratio": med[only] / med["native/load"],
            })
    print(f"\nTP={SOURCE_TP} -> TP={TARGET_TP}, rank {RANK}, device {device}; target piece "
          f"{target_bytes / MiB:.1f} MiB of {total / MiB:.0f} MiB; {args.repeats} interleaved "
          "repeats, median\n")
    print("| cache | load | open + load_rank, s (min-max) | time / native | load_rank only, s "
          "| time / native | bytes read | read / target |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['mode']} | {r['load']} | {r['median_s']:.3f} ({r['min_s']:.3f}-"
              f"{r['max_s']:.3f}) | {r['time_ratio']:.2f} | {r['load_only_s']:.3f} "
              f"| {r['load_only_ratio']:.2f} | {r['bytes_read'] / MiB:.1f} MiB "
              f"| {r['read_ratio']:.3f} |")
    open_times = {}
    for kind, path in (("native", native), ("resharded", source)):
        samples = []
        for _ in range(3):
            start = time.perf_counter()
            shardspec.open(path)
            samples.append(time.perf_counter() - start)
        open_times[kind] = statistics.median(samples)
    print(f"\nshardspec.open alone (warm): TP={TARGET_TP} manifest {open_times['native']:.3f} s, "
          f"TP={SOURCE_TP} manifest {open_times['resharded']:.3f} s "
          f"({(source / 'shardspec.json').stat().st_size // 1024} KiB vs "
          f"{(native / 'shardspec.json').stat().st_size // 1024} KiB)")
    print(f"resharded load: {len(stats.files_opened)} files opened, {stats.reads} read calls, "
          f"{stats.header_bytes} header bytes; {os.cpu_count()} cores, torch {torch.__version__}")
    goal_bytes = stats.bytes_read <= 1.1 * target_bytes
    cold = [r for r in rows if r["mode"] == "cold" and r["load"] == "resharded"][0]
    print(f"goals: bytes read <= 1.1x target: {'met' if goal_bytes else 'MISSED'} "
          f"({stats.bytes_read / target_bytes:.3f}x); cold time <= 1.3x native: "
          f"{'met' if cold['time_ratio'] <= 1.3 else 'MISSED'} ({cold['time_ratio']:.2f}x; "
          f"load_rank only {cold['load_only_ratio']:.2f}x)")
    if problems:
        print(f"ERROR: resharded tensors differ from native: {problems[:5]}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "target_bytes": target_bytes,
                                         "open_s": open_times,
                                         "files_opened": stats.files_opened,
                                         "reads": stats.reads, "hidden": hidden,
                                         "times": times}, indent=1))
    if not args.keep and args.workdir is None:
        shutil.rmtree(workdir)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
