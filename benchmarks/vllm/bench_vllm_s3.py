"""vLLM serving one model from one bucket, cold: ``load_format="shardspec"`` against vLLM's
``runai_streamer`` and ``runai_streamer_sharded``, load time and bytes fetched, side by side.

One random Llama-shaped bf16 model (:func:`bench_vllm.write_model`; by default 16 layers of
hidden 2048, 1.59 GiB) goes into one bucket of a local S3 server (moto on 127.0.0.1, in this
process) four ways: its Hugging Face files as ``save_pretrained`` wrote them, and through
``shardspec convert`` at each benchmarked TP with Hugging Face names and with ``--names vllm
--sharded-state`` (converted locally and put into moto's store directly: moto 5.2 fails to
complete a multipart upload of a 1.5 GiB object). Every contender is a fresh engine
(``tests/helpers/vllm_runner.py`` in the vLLM venv of ``make vllm``), in a rotating order each
repeat,
each reading the bucket as a user sets it up (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...):

| contender | in the bucket | vLLM's model | load format |
|---|---|---|---|
| runai_streamer | Hugging Face files | ``s3://bench/hf`` | same |
| runai_streamer_sharded | ``--names vllm`` at the TP | ``s3://bench/vllm-tpN`` | same |
| shardspec | ``convert --tp N`` | ``fetch-config`` dir, ``source`` | ``shardspec`` |
| shardspec-own | ``--names vllm`` at the TP | ``fetch-config`` dir, ``source`` | ``shardspec`` |

(``shardspec-own`` loads each rank whole, at its own layout.)

**cold**: a fresh engine process each time; there is no client cache between engines (the
server holds the objects). **load time**: each worker's ``load_weights``, timed by the runner
around vLLM's ``BaseModelLoader.load_model`` as in ``bench_vllm.py`` (what vLLM's "Loading
weights took" line reports, for every loader alike); a run's figure is its slowest worker's.
The engine's start (``LLM(...)`` returning) is reported too. **bytes**: the body bytes the
server sent for the checkpoint's objects during the engine's run (manifest, configs and data;
counted as the server yields them, so a stream the client closes early counts what was sent),
in all and per worker (the total over the TP workers; shardspec's workers also log their
own, which agree).

Moto answers a ranged GET by reading the whole object first (a request costs in proportion to
the object, which S3 does not do), and the test server's middleware reads every answer whole
before it sends the first byte: here object GETs are answered in front of both, straight from
moto's stored bytes, reading only the range asked and streaming it as it is read
(:class:`RangedGets`), with moto's own ETag and Last-Modified, so that a GET costs what it
costs on S3 and a client that stops reading stops the sending. The server shares the
machine's cores with the engine: read the ratios, not the rates.

    PYTHONPATH=reference python benchmarks/vllm/bench_vllm_s3.py [--tp 1,2] [--layers 16]
        [--hidden 2048] [--repeats 3] [--contenders a,b] [--json OUT] [--vllm-python PATH]
"""

from __future__ import annotations

import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
import harness.vllm as serve  # noqa: E402
from harness import use_test_helpers  # noqa: E402

use_test_helpers()
from s3_server import (  # noqa: E402
    AWS_ENVIRONMENT,
    AWS_UNSET,
    S3Server,
    bucket_and_key,
    moto_s3,
    signing_key_id,
)

BUCKET = "bench"
#: name -> (what the bucket holds for it, load format, the module vLLM needs for it)
CONTENDERS: dict[str, tuple[str, str, str | None]] = {
    "runai_streamer": ("hf", "runai_streamer", "runai_model_streamer_s3"),
    "runai_streamer_sharded": ("vllm", "runai_streamer_sharded", "runai_model_streamer_s3"),
    "shardspec": ("shardspec", "shardspec", "s3fs"),
    "shardspec-own": ("vllm", "shardspec", "s3fs"),
}
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_WORKER_BYTES = re.compile(r"shardspec: worker .* read (\d+) bytes")


class RangedGets:
    """WSGI: object GETs answered from moto's stored bytes, only the range asked, streamed in
    pieces and counted as they go out (``sent``: key -> bytes), unsigned requests refused;
    anything else (and a GET with a query string or conditions) goes to ``app`` (the test
    server's middleware, then moto)."""

    PIECE = 4 << 20

    def __init__(self, app: Any) -> None:
        self.app = app
        self.sent: dict[str, int] = {}
        self.gets: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        bucket, key = bucket_and_key(environ)
        if (environ["REQUEST_METHOD"] != "GET" or not bucket or not key
                or environ.get("QUERY_STRING") or environ.get("HTTP_IF_MATCH")
                or environ.get("HTTP_IF_NONE_MATCH")):
            return self.app(environ, start_response)
        if signing_key_id(environ) is None:
            return self.app(environ, start_response)  # the middleware refuses it
        try:
            stored = moto_s3().get_object(bucket, key)
        except Exception:  # noqa: BLE001 - moto's NoSuchKey and friends: moto answers
            stored = None
        if stored is None:
            return self.app(environ, start_response)
        size = stored.size
        asked = environ.get("HTTP_RANGE")
        start, end = 0, size
        if asked:
            found = _RANGE.match(asked.strip())
            if not found or (not found[1] and not found[2]):
                return self.app(environ, start_response)
            if found[1]:
                start = int(found[1])
                end = min(int(found[2]) + 1, size) if found[2] else size
            else:
                start = max(size - int(found[2]), 0)
            if start >= size or end <= start:
                return self.app(environ, start_response)
        headers = [("Content-Type", "binary/octet-stream"), ("Accept-Ranges", "bytes"),
                   ("ETag", stored.etag), ("Last-Modified", stored.last_modified_RFC1123),
                   ("Content-Length", str(end - start))]
        if asked:
            headers.append(("Content-Range", f"bytes {start}-{end - 1}/{size}"))
        start_response("206 Partial Content" if asked else "200 OK", headers)
        with self.lock:
            self.gets[key] = self.gets.get(key, 0) + 1
        return self._body(stored, key, start, end)

    def _body(self, stored: Any, key: str, start: int, end: int) -> Iterator[bytes]:
        at = start
        while at < end:
            with stored.lock:
                stored._value_buffer.seek(at)
                piece = stored._value_buffer.read(min(self.PIECE, end - at))
            if not piece:
                return
            at += len(piece)
            with self.lock:
                self.sent[key] = self.sent.get(key, 0) + len(piece)
            yield piece

    def clear(self) -> None:
        with self.lock:
            self.sent.clear()
            self.gets.clear()

    def bytes_under(self, prefix: str) -> tuple[int, int]:
        """Bytes sent and GETs answered under ``prefix``."""
        with self.lock:
            return (sum(n for k, n in self.sent.items() if k.startswith(prefix)),
                    sum(n for k, n in self.gets.items() if k.startswith(prefix)))


class BenchServer(S3Server):
    """tests/helpers/s3_server.py's server with :class:`RangedGets` in front of its middleware
    (which
    reads every answer whole before sending it): object GETs stream straight out."""

    def __init__(self) -> None:
        super().__init__()
        self.ranged = RangedGets(self.middleware)

    def start(self) -> BenchServer:
        from werkzeug.serving import ThreadedWSGIServer, make_server

        from s3_server import request_handler

        server = make_server("127.0.0.1", 0, self.ranged, threaded=True,
                             request_handler=request_handler())
        assert isinstance(server, ThreadedWSGIServer)
        server.daemon_threads = False
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="s3-server",
                                        kwargs={"poll_interval": 0.05})
        self._thread.start()
        return self


def start_server() -> tuple[S3Server, RangedGets, dict[str, Any]]:
    """The server, with ranged GETs in front of moto, and the environment every S3 client of
    the engines reads (runai's C++ client and s3fs alike)."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    os.environ.update(AWS_ENVIRONMENT)
    for name in AWS_UNSET:
        os.environ.pop(name, None)
    server = BenchServer()
    ranged = server.ranged
    server.start()
    os.environ.update({"AWS_ENDPOINT_URL": server.endpoint_url, "AWS_REGION": "us-east-1",
                       "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
                       "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"})
    server.create_bucket(BUCKET)
    return server, ranged, server.storage_options()


@dataclass(frozen=True)
class Run:
    weights: float  # the slowest worker's load_weights, s
    start: float  # LLM(...) returning, s
    sent: int  # bytes the server sent for the contender's prefix
    gets: int  # object GETs answered under it
    worker_bytes: tuple[int, ...]  # what shardspec's workers say they read


def run(python: Path, model: str, load_format: str, tp: int, extra: dict[str, Any],
        ranged: RangedGets, prefix: str) -> Run:
    ranged.clear()
    log, started, timed = serve.run_engine(python, {"model": model, "load_format": load_format,
                                              "tp": tp, "extra": extra}, first_error=False)
    sent, gets = ranged.bytes_under(prefix)
    return Run(max(t["seconds"] for t in timed), started, sent, gets,
               tuple(int(n) for n in _WORKER_BYTES.findall(log)))


def upload_directory(server: S3Server, local: Path, prefix: str) -> None:
    """Every file of ``local`` into the bucket under ``prefix``, straight into moto's store (a
    multipart upload of a 1.5 GiB object through the protocol fails in moto 5.2: "seek of
    closed file" on completing it); the manifest last."""
    files = sorted((p for p in local.iterdir() if p.is_file()),
                   key=lambda p: (p.name == "shardspec.json", p.name))
    for path in files:
        server.put_object(BUCKET, f"{prefix}/{path.name}", path.read_bytes())
        _ = moto_s3().get_object(BUCKET, f"{prefix}/{path.name}").etag  # hashed on first use


def main() -> None:
    args = serve.parse_args(__doc__, CONTENDERS)

    import shardspec
    from shardspec.storage.fetch_config import fetch_config

    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-vllm-s3-"))
    tps = [int(t) for t in args.tp.split(",")]
    hf = work / "hf"
    if not hf.exists():
        serve.write_model(hf, args.layers, args.hidden)
    size = sum(f.stat().st_size for f in hf.glob("*.safetensors"))
    server, ranged, options = start_server()
    try:
        upload_directory(server, hf, "hf")
        # contender, tp -> (vLLM's model, extra config, the bucket prefix it reads, data bytes)
        cells: dict[tuple[str, int], tuple[str, dict[str, Any], str, int]] = {}
        for tp in tps:
            for kind, names in (("shardspec", "hf"), ("vllm", "vllm")):
                prefix = f"{kind}-tp{tp}"
                url = f"s3://{BUCKET}/{prefix}"
                # vLLM's sharded loaders read a name once a rank: fused tensors rank-local
                upload_directory(server, serve.converted(hf, work / prefix, tp_size=tp, names=names,
                                                   sharded_state=names == "vllm"), prefix)
                manifest = shardspec.open(url, storage_options=options).manifest
                data = sum(f.size for r in manifest.ranks for f in r.files)
                local = work / f"local-{prefix}"
                fetch_config(url, local, storage_options=options, overwrite=True)
                for name, (holds, load_format, _) in CONTENDERS.items():
                    if holds != kind:
                        continue
                    if load_format == "shardspec":
                        cells[name, tp] = (str(local), {"source": url, "plan_cache": False},
                                           prefix + "/", data)
                    else:
                        cells[name, tp] = (url, {}, prefix + "/", data)
            cells["runai_streamer", tp] = (f"s3://{BUCKET}/hf", {}, "hf/", size)
        print(f"uploaded: Hugging Face files {size} bytes, and each TP's checkpoints",
              flush=True)
        contenders, notes = serve.installed(args.vllm_python, args.contenders,
                                      {name: c[2] for name, c in CONTENDERS.items()})
        results: dict[tuple[str, int], list[Run]] = {}
        failed: dict[str, str] = {}
        for repeat in range(args.repeats):
            order = serve.rotated(contenders, repeat)
            for tp in tps:
                for name in order:
                    cell = f"{name}@tp{tp}"
                    if cell in failed:
                        continue
                    model, extra, prefix, _ = cells[name, tp]
                    try:
                        got = run(args.vllm_python, model, CONTENDERS[name][1], tp, extra,
                                  ranged, prefix)
                    except (RuntimeError, subprocess.TimeoutExpired) as error:
                        failed[cell] = str(error)
                        print(f"{cell} failed: {error}", flush=True)
                        continue
                    results.setdefault((name, tp), []).append(got)
                    print(f"repeat {repeat} tp {tp} {name:24} weights {got.weights:7.2f} s  "
                          f"sent {got.sent / 2**20:8.1f} MiB in {got.gets:4} GETs  engine "
                          f"start {got.start:6.1f} s  workers {list(got.worker_bytes)}",
                          flush=True)
    finally:
        server.stop()
    print(f"\nmodel: {args.layers} layers, hidden {args.hidden}, {size / 2**30:.2f} GiB bf16 "
          f"({size} bytes of Hugging Face files); medians of {args.repeats}, cold (a fresh "
          "engine each run); load: load_weights s of the slowest worker; bytes: what the "
          "server sent for the contender's objects")
    for tp in tps:
        print(f"\nTP={tp}\n")
        print("| contender | load s | vs runai_streamer | engine start s | MiB sent, all "
              "workers | MiB per worker | vs the checkpoint's data | GETs |")
        print("|---|---|---|---|---|---|---|---|")
        base = results.get(("runai_streamer", tp))
        base_s = statistics.median(r.weights for r in base) if base else None
        for name in contenders:
            runs = results.get((name, tp))
            if not runs:
                continue
            load = statistics.median(r.weights for r in runs)
            sent = statistics.median(r.sent for r in runs)
            data = cells[name, tp][3]
            ratio = f"{load / base_s:.2f}x" if base_s else "-"
            print(f"| {name} | {load:.2f} | {ratio} | "
                  f"{statistics.median(r.start for r in runs):.1f} | {sent / 2**20:.1f} | "
                  f"{sent / tp / 2**20:.1f} | {sent / data:.3f}x | "
                  f"{statistics.median(r.gets for r in runs):.0f} |")
    serve.finish(args, notes, failed, "failed", hf_bytes=size,
                 results={f"{n}@tp{t}": [vars(r) for r in runs]
                          for (n, t), runs in results.items()},
                 data_bytes={f"{n}@tp{t}": c[3] for (n, t), c in cells.items()})


if __name__ == "__main__":
    sys.exit(main())
