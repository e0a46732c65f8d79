"""torch.distributed.checkpoint side by side: shardspec's Writer/Reader vs DCP's own formats.

The same synthetic Llama-shaped bf16 weights (``synthetic.model_spec``) are saved by a world of
4 gloo ranks holding them FSDP-style (every tensor ``Shard(0)`` as a DTensor, uneven where a
dimension does not divide) with each of three storage writers:

* ``shardspec``  - :class:`shardspec.integrations.dcp.Writer` (replicas off: nothing is
  replicated under FSDP);
* ``dcp-fs``     - DCP's ``FileSystemWriter`` (its own format: ``.distcp`` files + pickled
  ``.metadata``);
* ``dcp-hf``     - DCP's ``HuggingFaceStorageWriter(save_distributed=True)``: one safetensors
  file per rank with ``DCP_SHARDING_INFO`` in its metadata.

The shardspec checkpoint is loaded twice: ``shardspec`` is ``Reader(path)`` (gaps between
wanted runs read only within 10% of the wanted bytes), ``shardspec-coalesce`` is
``Reader(path, gap_budget=None)`` (every gap under 1 MiB read: fewer, longer reads).

Then a world of 2 ranks loads each checkpoint with the matching reader (``Reader``,
``FileSystemReader``, ``HuggingFaceStorageReader``) into the *same target sharding*: tensor
parallel 2 (column-parallel tensors ``Shard(0)``, row-parallel ``Shard(1)``, norms
``Replicate()``), so that every reader reshards FSDP 4 -> TP 2. Loads are cold by default
(every checkpoint file flushed and evicted from the page cache before every timed load, no
root needed) and alternate their order per repeat. Every load is compared bit for bit with the
weights.

Bytes read per rank, two ways:

* ``reader``: what the reader itself asked for: shardspec's ``ReadStats.bytes_read`` (headers,
  data and bridged gaps); for ``dcp-fs`` every byte its ``FileSystemReader`` read from a stream
  (counted by wrapping its filesystem); for ``dcp-hf`` the bytes of the slices it takes from
  safetensors' memory maps (a floor: faults bring whole pages);
* ``disk``: ``read_bytes`` of ``/proc/self/io`` over the load, summed over both ranks (cold
  cache: bytes the kernel read from the disk, readahead included). The ranks share one page
  cache, so a page one rank brought in is not read again by the other: only the sum means
  anything, and it is compared with the checkpoint's size.

``target`` is the bytes of the rank's target shards. This is a benchmark, not a test: it exits
non-zero only when a load is not bit-exact.

    PYTHONPATH=reference python benchmarks/convert/bench_dcp.py [--size-mib 256] [--repeats 3]
        [--warm] [--json OUT] [--workdir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import removed_after  # noqa: E402
from harness.synthetic import evict, make_weights, model_spec  # noqa: E402
from shardspec.integrations.dcp import Reader, Writer  # noqa: E402

MiB = 1 << 20
SAVE_WORLD, LOAD_WORLD = 4, 2
CONTENDERS = ["shardspec", "shardspec-coalesce", "dcp-fs", "dcp-hf"]
#: Where each contender's checkpoint is (the two shardspec readers load one checkpoint).
SOURCE = {"shardspec": "shardspec", "shardspec-coalesce": "shardspec", "dcp-fs": "dcp-fs",
          "dcp-hf": "dcp-hf"}
WRITERS = ["shardspec", "dcp-fs", "dcp-hf"]


# --- counting what DCP's readers read -----------------------------------------------------------


class _CountingStream:
    """A file object that counts the bytes read through it."""

    def __init__(self, inner: Any, counter: list[int]) -> None:
        self._inner, self._counter = inner, counter

    def read(self, *args: Any) -> bytes:
        data = self._inner.read(*args)
        self._counter[0] += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        count = self._inner.readinto(buffer)
        self._counter[0] += count or 0
        return count

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def counting_fs_reader(path: str) -> Any:
    from torch.distributed.checkpoint import FileSystemReader

    class CountingReader(FileSystemReader):
        counter = [0]

        def read_data(self, plan: Any, planner: Any) -> Any:
            real = self.fs.create_stream

            @contextlib.contextmanager
            def create_stream(path: Any, mode: str) -> Iterator[Any]:
                with real(path, mode) as stream:
                    yield _CountingStream(stream, self.counter)

            self.fs.create_stream = create_stream  # type: ignore[method-assign]
            try:
                return super().read_data(plan, planner)
            finally:
                self.fs.create_stream = real  # type: ignore[method-assign]

    return CountingReader(path)


def counting_hf_reader(path: str) -> Any:
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    class CountingReader(HuggingFaceStorageReader):
        counter = [0]

        def _process_read_request(self, f: Any, req: Any, planner: Any) -> None:
            target = planner.resolve_tensor(req)
            self.counter[0] += int(torch.Size(req.lengths).numel()) * target.element_size()
            super()._process_read_request(f, req, planner)

    return CountingReader(path)


# --- the worlds ---------------------------------------------------------------------------------


def _weights(size: int) -> tuple[dict[str, torch.Tensor], dict[str, int | None]]:
    spec, _ = model_spec(size)
    return make_weights(spec, seed=11), {name: dim for name, _, dim in spec}


def _os_read_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


def _writer(kind: str, path: str) -> Any:
    if kind == "shardspec":
        return Writer(path, replicas=False, overwrite=True)
    if kind == "dcp-fs":
        return dcp.FileSystemWriter(path)
    return dcp.HuggingFaceStorageWriter(path, save_distributed=True)


def _reader(kind: str, path: str) -> Any:
    if kind == "shardspec":
        return Reader(path)
    if kind == "shardspec-coalesce":
        return Reader(path, gap_budget=None)
    if kind == "dcp-fs":
        return counting_fs_reader(path)
    return counting_hf_reader(path)


def _reader_bytes(kind: str, reader: Any) -> int:
    if kind.startswith("shardspec"):
        return int(reader.stats.bytes_read)
    return int(reader.counter[0])


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def _save_world(rank: int, world: int, args: dict[str, Any]) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    weights, _ = _weights(args["size"])
    mesh = init_device_mesh("cpu", (world,))
    state = {n: distribute_tensor(t, mesh, [Shard(0)], src_data_rank=None)
             for n, t in weights.items()}
    times: dict[str, list[float]] = {k: [] for k in WRITERS}
    for repeat in range(args["repeats"]):
        order = WRITERS[repeat % 3:] + WRITERS[: repeat % 3]
        for kind in order:
            path = Path(args["workdir"], kind)
            if rank == 0:
                shutil.rmtree(path, ignore_errors=True)
                path.mkdir()
            dist.barrier()
            start = time.perf_counter()
            dcp.save(state, storage_writer=_writer(kind, str(path)))
            dist.barrier()
            times[kind].append(time.perf_counter() - start)
    sizes = {k: sum(p.stat().st_size for p in _files(Path(args["workdir"], k)))
             for k in WRITERS}
    return {"save_seconds": times, "checkpoint_bytes": sizes}


def _load_world(rank: int, world: int, args: dict[str, Any]) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    weights, dims = _weights(args["size"])
    mesh = init_device_mesh("cpu", (world,))

    def placement(dim: int | None) -> Any:
        return Replicate() if dim is None else Shard(dim)

    expected = {n: distribute_tensor(t, mesh, [placement(dims[n])], src_data_rank=None)
                for n, t in weights.items()}
    target = sum(t.to_local().nbytes for t in expected.values())
    times: dict[str, list[float]] = {k: [] for k in CONTENDERS}
    read: dict[str, dict[str, int]] = {}
    exact: dict[str, bool] = {}
    for repeat in range(args["repeats"]):
        order = CONTENDERS[repeat % 4:] + CONTENDERS[: repeat % 4]
        for kind in order:
            path = Path(args["workdir"], SOURCE[kind])
            state = {n: distribute_tensor(torch.zeros_like(t), mesh, [placement(dims[n])],
                                          src_data_rank=None) for n, t in weights.items()}
            if not args["warm"]:
                if rank == 0:
                    evict(_files(path))
            else:  # one untimed load first
                dcp.load(state, storage_reader=_reader(kind, str(path)))
            dist.barrier()
            reader = _reader(kind, str(path))
            before = _os_read_bytes()
            start = time.perf_counter()
            dcp.load(state, storage_reader=reader)
            dist.barrier()
            times[kind].append(time.perf_counter() - start)
            read[kind] = {"reader": _reader_bytes(kind, reader),
                          "os": _os_read_bytes() - before}
            exact[kind] = all(torch.equal(state[n].to_local(), expected[n].to_local())
                              for n in weights)
    return {"load_seconds": times, "bytes": read, "target_bytes": target, "exact": exact}


SCENARIOS = {"save": _save_world, "load": _load_world}


def _child(rank: int, world: int, scenario: str, args: dict[str, Any], out: str) -> None:
    result: dict[str, Any] = {"ok": False}
    try:
        dist.init_process_group("gloo", init_method=f"file://{out}.store", rank=rank,
                                world_size=world, timeout=timedelta(minutes=30))
        result.update(SCENARIOS[scenario](rank, world, args))
        result["ok"] = True
    except Exception:  # noqa: BLE001 - reported to the parent
        result["traceback"] = traceback.format_exc()
    Path(f"{out}.{rank}.json").write_text(json.dumps(result))
    os._exit(0)


def run_world(world: int, scenario: str, args: dict[str, Any]) -> list[dict[str, Any]]:
    out = str(Path(args["workdir"], f"result-{scenario}"))
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_child, args=(r, world, scenario, args, out))
             for r in range(world)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    results = [json.loads(Path(f"{out}.{r}.json").read_text()) for r in range(world)]
    for r, result in enumerate(results):
        if not result["ok"]:
            sys.exit(f"rank {r} of {scenario} failed:\n{result['traceback']}")
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warm", action="store_true", help="warm page cache instead of cold")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--keep", action="store_true")
    options = parser.parse_args()
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="bench-dcp-"))
    workdir.mkdir(parents=True, exist_ok=True)
    args = {"size": options.size_mib * MiB, "repeats": options.repeats, "warm": options.warm,
            "workdir": str(workdir)}
    with removed_after(workdir, options.keep):
        saved = run_world(SAVE_WORLD, "save", args)
        loaded = run_world(LOAD_WORLD, "load", args)
    print(f"torch {torch.__version__}; {options.size_mib} MiB bf16 weights "
          f"(synthetic Llama shapes); FSDP {SAVE_WORLD} (Shard(0)) -> TP {LOAD_WORLD}; "
          f"median of {options.repeats}; {'warm' if options.warm else 'cold'} cache\n")
    print("| writer | save s | checkpoint MiB |")
    print("|---|---:|---:|")
    for kind in WRITERS:
        seconds = statistics.median(saved[0]["save_seconds"][kind])
        print(f"| {kind} | {seconds:.3f} | {saved[0]['checkpoint_bytes'][kind] / MiB:.1f} |")
    print("\n| reader | rank | load s | target MiB | reader read MiB | x target | bit-exact |")
    print("|---|---:|---:|---:|---:|---:|---|")
    exact = True
    for kind in CONTENDERS:
        for rank, result in enumerate(loaded):
            target = result["target_bytes"]
            got = result["bytes"][kind]["reader"]
            exact &= result["exact"][kind]
            print(f"| {kind} | {rank} | {statistics.median(result['load_seconds'][kind]):.3f} | "
                  f"{target / MiB:.1f} | {got / MiB:.1f} | {got / target:.3f} | "
                  f"{result['exact'][kind]} |")
    print("\n| reader | disk read MiB, both ranks (last repeat) | checkpoint MiB |")
    print("|---|---:|---:|")
    for kind in CONTENDERS:
        disk = sum(result["bytes"][kind]["os"] for result in loaded)
        size = saved[0]["checkpoint_bytes"][SOURCE[kind]]
        print(f"| {kind} | {disk / MiB:.1f} | {size / MiB:.1f} |")
    if options.json:
        options.json.write_text(json.dumps({"save": saved, "load": loaded}, indent=1))
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
