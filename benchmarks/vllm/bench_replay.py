"""The replay alone, outside vLLM: where a resharded load's time goes, cold and warm.

``bench_vllm.py`` times whole engine loads; this benchmark replays the placement plans such a
run recorded (keep its ``--workdir``; a ``--tp 1`` run, one worker a plan) into fresh memory of
each parameter's size, as vLLM's untouched parameters are, without the engine around it:

* ``own``        - the TP-1 checkpoint's plan (``shardspec`` in ``bench_vllm.py``);
* ``from-tp4``   - the TP-4 checkpoint's plan (``shardspec-from-tp4``: a row-parallel weight in
  four parts of every row, one from each file);
* ``*-contiguous`` and ``*-strided`` - the same plans' reads split: whole runs (column-parallel
  weights, whole tensors) and the row-parallel weights, which ``from-tp4`` reads in strided runs.

Cold evicts every file of both checkpoints with ``posix_fadvise(DONTNEED)`` before each
replay; warm reads the files once first. Each way runs once a repeat, in the same order.
``--cpus`` binds the replay to those cores, as vLLM's CPU build binds a worker (at TP 1 on a
2-core machine, one core: the other is kept for its scheduler).

    PYTHONPATH=reference python benchmarks/vllm/bench_vllm.py --tp 1 --workdir W ...
    PYTHONPATH=reference python benchmarks/vllm/bench_replay.py W [--repeats 5] [--cpus 1]
        [--cache cold,warm] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness.load import machine_info  # noqa: E402
from harness.synthetic import evict  # noqa: E402
from shardspec.integrations.vllm.placements import PlacementPlan, Read  # noqa: E402
from shardspec.integrations.vllm.replay import replay  # noqa: E402
from shardspec.storage.manifest_file import read_manifest  # noqa: E402

CHECKPOINTS = {"own": "shardspec-tp1", "from-tp4": "shardspec-tp4"}


def plans_of(workdir: Path) -> dict[str, PlacementPlan]:
    """Each checkpoint's one plan in the run's plan cache: the plan that reads all of its data
    files (a TP-1 worker reads every file of either checkpoint; the names overlap)."""
    found: dict[str, list[PlacementPlan]] = {name: [] for name in CHECKPOINTS}
    for path in sorted((workdir / "plan-cache").glob("*.json")):
        plan = PlacementPlan.from_dict(json.loads(path.read_text())["plan"])
        for name, directory in CHECKPOINTS.items():
            if set(plan.files) == {f.name for f in (workdir / directory).glob("*.safetensors")}:
                found[name].append(plan)
    if any(len(plans) != 1 for plans in found.values()):
        sys.exit(f"{workdir}/plan-cache: want one plan a checkpoint (a --tp 1 run of "
                 f"bench_vllm.py), found {({n: len(p) for n, p in found.items()})}")
    return {name: plans[0] for name, plans in found.items()}


def contiguous(read: Read) -> bool:
    return read.count == 1 or read.src_stride == read.length == read.dst_stride


def ways(plans: dict[str, PlacementPlan]) -> dict[str, tuple[str, PlacementPlan]]:
    strided = {r.target for r in plans["from-tp4"].reads if not contiguous(r)}
    out: dict[str, tuple[str, PlacementPlan]] = {}
    for name, plan in plans.items():
        out[name] = (name, plan)
        out[f"{name}-contiguous"] = (name, PlacementPlan(
            [r for r in plan.reads if r.target not in strided]))
        out[f"{name}-strided"] = (name, PlacementPlan(
            [r for r in plan.reads if r.target in strided]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workdir", type=Path, help="a bench_vllm.py --tp 1 run's --workdir")
    ap.add_argument("--repeats", type=int, default=5, help="replays a way (default 5)")
    ap.add_argument("--cache", default="cold,warm", help="cold, warm or both (default)")
    ap.add_argument("--cpus", default=None,
                    help="cores to bind the replay to, comma-separated (default: all)")
    ap.add_argument("--json", type=Path, default=None, help="write all results to this file")
    args = ap.parse_args(argv)
    if args.cpus:  # threads started later inherit it
        os.sched_setaffinity(0, {int(cpu) for cpu in args.cpus.split(",")})
    plans = plans_of(args.workdir)
    manifests = {}
    for name, directory in CHECKPOINTS.items():
        parsed = read_manifest(args.workdir / directory)
        if parsed.manifest is None:
            sys.exit(f"{args.workdir / directory}: {parsed.errors}")
        manifests[name] = parsed.manifest
    files = [f for d in CHECKPOINTS.values() for f in (args.workdir / d).glob("*.safetensors")]
    sizes: dict[str, int] = {}
    for read in plans["own"].reads:
        sizes[read.target] = max(sizes.get(read.target, 0), read.dst_end)
    every_way = ways(plans)
    times: dict[str, list[float]] = {}
    for cache in args.cache.split(","):
        for _ in range(args.repeats):
            for way, (name, plan) in every_way.items():
                targets = {t: torch.empty(n, dtype=torch.uint8) for t, n in sizes.items()}
                if cache == "cold":
                    evict(files)
                else:
                    for f in files:
                        f.read_bytes()
                started = time.perf_counter()
                replay(args.workdir / CHECKPOINTS[name], manifests[name], plan, targets)
                times.setdefault(f"{cache} {way}", []).append(time.perf_counter() - started)
    info = machine_info(args.workdir, torch.device("cpu"))
    print(f"{info['cpu']}, {info['cores']} cores; commit {info['commit']}; {info['date']}")
    print(f"{sum(sizes.values()) / 2**30:.2f} GiB of parameters; medians of {args.repeats}; "
          f"cores {sorted(os.sched_getaffinity(0))}\n")
    print("| cache way | s | spread |\n|---|---|---|")
    for key, values in times.items():
        print(f"| {key} | {statistics.median(values):.3f} | {min(values):.3f}-{max(values):.3f} |")
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "cpus": sorted(os.sched_getaffinity(0)),
                                         "times_s": times}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
