"""Object-storage benchmark: one rank's load from an S3 server against fetching more first.

A synthetic Llama-shaped bf16 model (default 512 MiB) is uploaded to a local S3 server (moto, on
127.0.0.1, in this process, behind tests/helpers/s3_server.py's middleware, which logs every
request the
server answers) twice: as a shardspec checkpoint with TP ranks, and as one whole
safetensors file. Rank TP-1 (the last) is then loaded by every contender, interleaved in a
rotating order in each repeat:

* ``shardspec``      - ``shardspec.open(url).load_rank(rank)``: the manifest, then ranged
  requests for the rank's own objects only, several in flight, into memory;
* ``shardspec-1req`` - the same with one GET per object (``remote_link.REQUEST_BYTES`` raised
  past the object, in place of the size the measured link gives): one request per object;
* ``download-all``   - the whole checkpoint prefix downloaded to local disk (``fs.get``), then
  ``shardspec.load_rank`` from there: what a user does with ``aws s3 sync`` first;
* ``download-rank``  - only the manifest and the rank's files downloaded (what ``shardspec
  files --rank`` lists), then loaded from disk;
* ``st-rank``        - ``safetensors.torch.load`` of the rank's file fetched whole with s3fs's
  ``cat_file`` (concurrent chunks): vLLM sharded-state files in a bucket, read as bytes;
* ``st-rank-listed`` - the same, with the rank's files found by listing the prefix for
  vLLM's sharded-state pattern (``model-rank-{rank}-part-*.safetensors``, one LIST), as a
  loader without a manifest must: ``st-rank`` is handed the names;
* ``st-whole``       - ``safetensors.torch.load`` of the whole unsharded file fetched with s3fs,
  then the rank's slice of every tensor copied out: the whole-checkpoint loader;
* ``runai``          - runai-model-streamer's ``SafetensorsStreamer`` reading the rank's objects
  by ``s3://`` URL from the same server (its S3 backend, endpoint from ``AWS_ENDPOINT_URL``), with
  its default concurrency; ``runai-1worker`` the same with ``RUNAI_STREAMER_CONCURRENCY=1``.
  Skipped, with a note, where the package does not import;

and, untimed against the others, ``reshard``: rank 2*TP-1 of a layout with twice the TP size,
loaded from the TP checkpoint with partial ranged reads (bytes and requests counted for the data
objects, headers included, the manifest's one request not), once per gap budget of
``--reshard-budgets`` (``shardspec.reshard.load.REMOTE_GAP_BUDGET``), to report the bytes asked
against the bytes of its pieces and the requests made: a row-parallel slice is a run per row,
and only bridging the gaps between runs, with bytes nobody wants, saves requests.

Bytes fetched are counted by the client (shardspec's ``RemoteRoot.traffic``; the object sizes
for the others); requests by the server, per method, for each contender's last repeat. There
is no client cache to warm: every remote read goes to the server, which holds the objects in
memory; the downloaded copies are written fresh each repeat. The server shares the machine's
cores with the client, so absolute rates are the server's, not S3's: read the ratios. Moto
answers a ranged GET by copying the whole object first, so on it a request costs in proportion
to the object's size, which is not how S3 behaves: ``shardspec-1req`` shows that share.
shardspec's link is measured from the first load on, so its ``first s`` is the load made with
the guesses (30 ms, 90 MB/s).

This is a benchmark, not a test: it exits non-zero only when loaded tensors are wrong.

    PYTHONPATH=reference python benchmarks/storage/bench_remote.py [--size-mib 512] [--tp 4]
        [--repeats 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import fsspec
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import use_test_helpers  # noqa: E402
from harness.synthetic import make_weights, model_spec  # noqa: E402

use_test_helpers()
import shardspec  # noqa: E402
from s3_server import AWS_ENVIRONMENT, AWS_UNSET, S3Server  # noqa: E402
from shardspec import Layout  # noqa: E402
from shardspec.format.limits import MANIFEST_NAME  # noqa: E402
from shardspec.reshard import load as reshard_load  # noqa: E402
from shardspec.storage import remote_link  # noqa: E402
from shardspec.storage.remote import RemoteRoot  # noqa: E402

BUCKET = "bench"


def start_server() -> tuple[S3Server, dict[str, Any]]:
    """The server, and the environment every S3 client here reads (runai's included)."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    os.environ.update(AWS_ENVIRONMENT)
    for name in AWS_UNSET:
        os.environ.pop(name, None)
    server = S3Server().start()
    os.environ.update({"AWS_ENDPOINT_URL": server.endpoint_url, "AWS_REGION": "us-east-1",
                       "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
                       "NO_PROXY": "127.0.0.1"})
    server.create_bucket(BUCKET)
    # fsspec caches the filesystem instance for these options: every contender, shardspec
    # included, reuses one S3 client, as a serving process does (botocore's own retries).
    options = server.storage_options(config_kwargs={"s3": {"addressing_style": "path"}},
                                     skip_instance_cache=False)
    return server, options


def runai_load(urls: list[str], concurrency: int | None) -> dict[str, torch.Tensor]:
    """runai-model-streamer's SafetensorsStreamer reading ``urls`` (its default concurrency, or
    ``concurrency`` workers)."""
    from runai_model_streamer import SafetensorsStreamer

    saved = os.environ.get("RUNAI_STREAMER_CONCURRENCY")
    if concurrency is not None:
        os.environ["RUNAI_STREAMER_CONCURRENCY"] = str(concurrency)
    try:
        with SafetensorsStreamer() as streamer:
            streamer.stream_files(urls)
            return dict(streamer.get_tensors())
    finally:
        os.environ.pop("RUNAI_STREAMER_CONCURRENCY", None)
        if saved is not None:
            os.environ["RUNAI_STREAMER_CONCURRENCY"] = saved


def runai_missing() -> str | None:
    """Why the runai contenders cannot run here, or None."""
    try:
        import runai_model_streamer  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - an import of a native library fails many ways
        return f"{type(exc).__name__}: {exc}"
    return None


def count_requests(server: S3Server, prefix: str) -> dict[str, int]:
    """Requests the server answered under ``prefix``, per method (a GET of no key: LIST)."""
    counts: dict[str, int] = {}
    for request in server.requests(key_prefix=prefix):
        kind = "LIST" if request.method == "GET" and not request.key else request.method
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def split_states(weights: dict[str, torch.Tensor], spec: list[Any], tp: int
                 ) -> tuple[dict[int, dict[str, torch.Tensor]], dict[int, dict[str, Any]]]:
    states: dict[int, dict[str, torch.Tensor]] = {r: {} for r in range(tp)}
    sharding: dict[int, dict[str, Any]] = {r: {} for r in range(tp)}
    for name, _, dim in spec:
        for rank, (piece, shard) in enumerate(shardspec.split(weights[name], dim, tp)):
            states[rank][name] = piece
            sharding[rank][name] = shard
    return states, sharding


def expected_rank(weights: dict[str, torch.Tensor], spec: list[Any], tp: int, rank: int
                  ) -> dict[str, torch.Tensor]:
    return {name: shardspec.split(weights[name], dim, tp)[rank][0] for name, _, dim in spec}


def slice_rank(whole: dict[str, torch.Tensor], spec: list[Any], tp: int, rank: int
               ) -> dict[str, torch.Tensor]:
    """The whole-checkpoint loader's last step: the rank's slices, copied contiguous."""
    out = {}
    for name, _, dim in spec:
        tensor = whole[name]
        if dim is None:
            out[name] = tensor.clone()
        else:
            step = tensor.shape[dim] // tp
            out[name] = tensor.narrow(dim, rank * step, step).contiguous()
    return out


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def check(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], who: str) -> None:
    wrong = [n for n in expected if n not in got or not torch.equal(
        got[n].view(torch.int16), expected[n].view(torch.int16))]
    if wrong or set(got) != set(expected):
        raise SystemExit(f"{who}: wrong tensors: {wrong[:5]}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--tp", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--reshard-budgets", default="0.1,1.0",
                        help="comma-separated REMOTE_GAP_BUDGET values for the reshard run")
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spec, hidden = model_spec(args.size_mib * 1024 * 1024)
    weights = make_weights(spec)
    total = sum(t.numel() * 2 for t in weights.values())
    tp, rank = args.tp, args.tp - 1
    server, options = start_server()
    workdir = Path(tempfile.mkdtemp(prefix="shardspec-bench-remote-"))
    try:
        fs = fsspec.filesystem("s3", **options)
        url = f"s3://{BUCKET}/tp{tp}"
        states, sharding = split_states(weights, spec, tp)
        started = time.perf_counter()
        manifest = shardspec.save(states, url, layout=Layout(tp_size=tp), sharding=sharding,
                                  storage_options=options)
        upload_s = time.perf_counter() - started
        fs.pipe_file(f"{BUCKET}/whole/model.safetensors", st_save(weights))
        del states
        expected = expected_rank(weights, spec, tp, rank)
        rank_files = [f.path for f in manifest.ranks[rank].files]
        rank_bytes = sum(f.size for f in manifest.ranks[rank].files)
        manifest_bytes = fs.size(f"{BUCKET}/tp{tp}/{MANIFEST_NAME}")
        whole_bytes = fs.size(f"{BUCKET}/whole/model.safetensors")

        def fresh_dir(name: str) -> Path:
            target = workdir / name
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            return target

        fetched: dict[str, int] = {}

        def c_shardspec() -> dict[str, torch.Tensor]:
            ckpt = shardspec.open(url, storage_options=options)
            tensors = ckpt.load_rank(rank, "cpu")
            assert isinstance(ckpt.path, RemoteRoot)
            fetched["shardspec"] = ckpt.path.traffic.bytes_read
            return tensors

        def c_shardspec_1req() -> dict[str, torch.Tensor]:
            remote_link.REQUEST_BYTES = 1 << 40  # one GET per object
            try:
                ckpt = shardspec.open(url, storage_options=options)
                tensors = ckpt.load_rank(rank, "cpu")
            finally:
                remote_link.REQUEST_BYTES = None
            assert isinstance(ckpt.path, RemoteRoot)
            fetched["shardspec-1req"] = ckpt.path.traffic.bytes_read
            return tensors

        def c_download_all() -> dict[str, torch.Tensor]:
            target = fresh_dir("all")
            fs.get(f"{BUCKET}/tp{tp}/", str(target), recursive=True)
            fetched["download-all"] = sum(p.stat().st_size for p in target.rglob("*")
                                          if p.is_file())
            return shardspec.load_rank(target, rank, "cpu")

        def c_download_rank() -> dict[str, torch.Tensor]:
            target = fresh_dir("rank")
            for name in [MANIFEST_NAME, *rank_files]:
                fs.get_file(f"{BUCKET}/tp{tp}/{name}", str(target / name))
            fetched["download-rank"] = manifest_bytes + rank_bytes
            return shardspec.load_rank(target, rank, "cpu")

        def c_st_rank() -> dict[str, torch.Tensor]:
            out: dict[str, torch.Tensor] = {}
            for name in rank_files:
                out.update(st_load(fs.cat_file(f"{BUCKET}/tp{tp}/{name}")))
            fetched["st-rank"] = rank_bytes
            return out

        def c_st_rank_listed() -> dict[str, torch.Tensor]:
            fs.invalidate_cache()  # s3fs keeps listings: each load asks the server
            out: dict[str, torch.Tensor] = {}
            for name in sorted(fs.glob(f"{BUCKET}/tp{tp}/model-rank-{rank}-part-*.safetensors")):
                out.update(st_load(fs.cat_file(name)))
            fetched["st-rank-listed"] = rank_bytes
            return out

        def c_st_whole() -> dict[str, torch.Tensor]:
            whole = st_load(fs.cat_file(f"{BUCKET}/whole/model.safetensors"))
            fetched["st-whole"] = whole_bytes
            return slice_rank(whole, spec, tp, rank)

        rank_urls = [f"s3://{BUCKET}/tp{tp}/{name}" for name in rank_files]

        def c_runai(concurrency: int | None, name: str) -> dict[str, torch.Tensor]:
            fetched[name] = rank_bytes
            return runai_load(rank_urls, concurrency)

        contenders: dict[str, Callable[[], dict[str, torch.Tensor]]] = {
            "shardspec": c_shardspec, "shardspec-1req": c_shardspec_1req,
            "download-all": c_download_all, "download-rank": c_download_rank,
            "st-rank": c_st_rank, "st-rank-listed": c_st_rank_listed, "st-whole": c_st_whole}
        skipped = runai_missing()
        if skipped is None:
            contenders["runai"] = partial(c_runai, None, "runai")
            contenders["runai-1worker"] = partial(c_runai, 1, "runai-1worker")
        else:
            print(f"runai contenders skipped: {skipped}", file=sys.stderr)
        times: dict[str, list[float]] = {name: [] for name in contenders}
        requests: dict[str, dict[str, int]] = {}
        names = list(contenders)
        for repeat in range(args.repeats):
            order = names[repeat % len(names):] + names[:repeat % len(names)]
            for name in order:
                server.clear_log()
                seconds, result = timed(contenders[name])
                requests[name] = count_requests(server, "")
                check(result, expected, name)
                del result
                times[name].append(seconds)
                print(f"repeat {repeat + 1}: {name} {seconds:.3f} s", file=sys.stderr)
        link = repr(RemoteRoot(url, options).link)

        # resharding on load: twice the TP size, the last rank; bytes asked vs piece bytes
        target = Layout(tp_size=2 * tp)
        reshard = []
        for budget in (float(b) for b in args.reshard_budgets.split(",")):
            reshard_load.REMOTE_GAP_BUDGET = budget
            ckpt = shardspec.open(url, storage_options=options)
            server.clear_log()
            seconds, resharded = timed(partial(ckpt.load_rank, 2 * tp - 1, "cpu", layout=target))
            served = count_requests(server, f"tp{tp}/model-")
            check(resharded, expected_rank(weights, spec, 2 * tp, 2 * tp - 1), "reshard")
            assert isinstance(ckpt.path, RemoteRoot)
            piece_bytes = sum(t.numel() * t.element_size() for t in resharded.values())
            traffic = ckpt.path.traffic
            asked = traffic.bytes_read - manifest_bytes  # of the data objects, headers included
            reshard.append({"budget": budget, "seconds": seconds, "bytes_asked": asked,
                            "piece_bytes": piece_bytes, "requests": traffic.reads - 1,
                            "served": served, "ratio": asked / piece_bytes})
            del resharded
            print(f"reshard, gap budget {budget}: {seconds:.2f} s", file=sys.stderr)
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    result = {
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "torch": torch.__version__, "fsspec": fsspec.__version__},
        "model": {"bytes": total, "hidden": hidden, "tp": tp, "rank": rank,
                  "rank_bytes": rank_bytes, "upload_seconds": upload_s},
        "contenders": {name: {"median_s": statistics.median(ts), "first_s": ts[0], "all_s": ts,
                              "bytes_fetched": fetched[name], "requests": requests[name]}
                       for name, ts in times.items()},
        "runai_skipped": skipped,
        "link": link,
        "reshard": reshard,
    }
    report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


def report(result: dict[str, Any]) -> None:
    model = result["model"]
    print(f"model {model['bytes'] / 2**20:.0f} MiB, TP={model['tp']}, rank {model['rank']} "
          f"holds {model['rank_bytes'] / 2**20:.0f} MiB; uploaded with shardspec.save in "
          f"{model['upload_seconds']:.1f} s")
    base = result["contenders"]["shardspec"]["median_s"]
    print("| contender | median s | first s | x shardspec | MiB fetched | rank MiB/s | "
          "requests served |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, row in result["contenders"].items():
        mib = row["bytes_fetched"] / 2**20
        served = ", ".join(f"{n} {m}" for m, n in sorted(row["requests"].items()))
        print(f"| {name} | {row['median_s']:.3f} | {row['first_s']:.3f} | "
              f"{row['median_s'] / base:.2f} | {mib:.0f} | "
              f"{model['rank_bytes'] / 2**20 / row['median_s']:.0f} | {served} |")
    if result["runai_skipped"]:
        print(f"runai, runai-1worker: skipped ({result['runai_skipped']})")
    print(f"shardspec's link after the runs: {result['link']}")
    print(f"resharding on load to TP={2 * model['tp']}, rank {2 * model['tp'] - 1}:")
    print("| gap budget | s | requests | served | MiB asked | MiB of pieces | asked / pieces |")
    print("| ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for r in result["reshard"]:
        served = ", ".join(f"{n} {m}" for m, n in sorted(r["served"].items()))
        print(f"| {r['budget']} | {r['seconds']:.2f} | {r['requests']} | {served} | "
              f"{r['bytes_asked'] / 2**20:.1f} | {r['piece_bytes'] / 2**20:.1f} | "
              f"{r['ratio']:.3f} |")


if __name__ == "__main__":
    sys.exit(main())
