"""vLLM serving a checkpoint that lives in a bucket (issue 42), against a real S3-protocol server.

The server is moto on 127.0.0.1 in this process (tests/helpers/s3_server.py), which logs every
request
and its bytes; the engine is a real vLLM in its own venv (tests/helpers/vllm_engine.py), started as
a
user starts it: ``model`` is a local directory holding the checkpoint's manifest and extra
files (``shardspec fetch-config``), the data files stay in the bucket, and
``model_loader_extra_config={"source": "s3://..."}`` says where. vLLM refuses
``model="s3://..."`` for any load format but its own streamers, so that way is not open.
Credentials come from the environment as every AWS client reads them (``AWS_ACCESS_KEY_ID``,
``AWS_ENDPOINT_URL``, ...), or in ``storage_options``.

Each cell is one engine, compared with ``auto`` on the local Hugging Face directory at the same
layout (tokens and logprobs, unread bytes NaN-poisoned), and the bytes the server sent counted:

- TP 1 from a TP 1 checkpoint, the endpoint from ``AWS_ENDPOINT_URL``;
- TP 2 from a TP 2 checkpoint, the endpoint in ``storage_options``;
- TP 2 from a TP 1 checkpoint (resharded on load), with ``verify``: every object a worker reads
  is hashed whole, and still fetched once per worker;
- an object replaced in the middle of its load: the engine does not start (``object-changed``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import fsspec
import pytest

import shardspec
from shardspec.convert import convert
from shardspec.storage.fetch_config import fetch_config
from vllm_engine import EngineError, Generated, generate, save_llama

if TYPE_CHECKING:
    from s3_server import Request, S3Server

pytestmark = pytest.mark.vllm

BUCKET = "models"

#: Everything the engine asks of the bucket, manifest included, at the engine's own layout: at
#: most this much more than the checkpoint's data files.
OWN_LAYOUT_OVERHEAD = 1.05


@dataclass(frozen=True)
class Stored:
    url: str
    local: Path  # the manifest and extra files, as fetch-config wrote them
    data_bytes: int  # of the data files
    sizes: dict[str, int]  # data file -> bytes


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_llama(tmp_path_factory.mktemp("hf") / "llama")


@pytest.fixture(scope="module")
def auto(llama: Path) -> Callable[[int], Generated]:
    """``auto`` on the Hugging Face directory, one engine per TP, run once."""
    cache: dict[int, Generated] = {}

    def get(tp: int) -> Generated:
        if tp not in cache:
            cache[tp] = generate(llama, "auto", tp=tp)
        return cache[tp]

    return get


@pytest.fixture(scope="module")
def bucket(s3_server: S3Server) -> Iterator[str]:
    """The bucket for the module (tests/helpers/s3_server.py's ``s3_bucket`` resets the server after
    each test); the server is reset afterwards."""
    s3_server.reset()
    s3_server.create_bucket(BUCKET)
    yield BUCKET
    try:
        s3_server.raise_hook_errors()
    finally:
        s3_server.reset()


@pytest.fixture(scope="module")
def stored(llama: Path, s3_server: S3Server, bucket: str,
           tmp_path_factory: pytest.TempPathFactory) -> dict[int, Stored]:
    """The model converted straight into the bucket at TP 1 and 2, and each one's small files
    fetched into a local directory."""
    options = s3_server.storage_options()
    out = {}
    for tp in (1, 2):
        url = f"s3://{bucket}/llama-tp{tp}"
        manifest = convert(llama, url, tp_size=tp, storage_options=options)
        out[tp] = _fetched(url, manifest, tmp_path_factory.mktemp(f"local-tp{tp}") / "llama",
                           options)
    return out


def _fetched(url: str, manifest: shardspec.Manifest, local: Path,
             options: dict[str, object]) -> Stored:
    fetched = fetch_config(url, local, storage_options=options)
    assert "config.json" in fetched.files and fetched.files[-1] == "shardspec.json"
    sizes = {f.path: f.size for r in manifest.ranks for f in r.files}
    assert not any(local.glob("*.safetensors"))  # the data stays in the bucket
    return Stored(url, local, sum(sizes.values()), sizes)


@pytest.fixture
def server(s3_server: S3Server, bucket: str) -> Iterator[S3Server]:
    """The server with an empty log and no rules, for one engine."""
    s3_server.clear_log()
    s3_server.clear_rules()
    yield s3_server
    s3_server.clear_rules()
    s3_server.raise_hook_errors()


def _same(got: Generated, want: Generated) -> None:
    assert got.tokens == want.tokens
    assert got.logprobs == want.logprobs  # bit-equal logits: bit-equal weights


def _worker_bytes(log: str) -> list[int]:
    """What each worker says it read, headers included (one line a worker)."""
    return [int(n) for n in re.findall(r"shardspec: worker .* read (\d+) bytes", log)]


def _gets(server: S3Server, key_prefix: str) -> list[Request]:
    return [r for r in server.requests("GET", key_prefix) if r.key]


def _report(cell: str, server: S3Server, stored: Stored, got: Generated) -> tuple[int, int]:
    """Bytes the server sent for the checkpoint (all of it, manifest included) and for its
    data files, printed with what each worker says it read (``pytest -s`` shows it)."""
    prefix = stored.url.split("/", 3)[3] + "/"
    total = server.bytes_requested(prefix)
    data = sum(server.bytes_requested(prefix + name) for name in stored.sizes)
    print(f"\n{cell}: checkpoint data {stored.data_bytes} bytes; the server sent {total} "
          f"({total / stored.data_bytes:.4f}x), {data} of them data files; workers report "
          f"{_worker_bytes(got.log)}; {len(_gets(server, prefix))} GETs")
    return total, data


def test_tp1_from_a_tp1_checkpoint_with_the_endpoint_from_the_environment(
        stored: dict[int, Stored], auto: Callable[[int], Generated], server: S3Server) -> None:
    ckpt = stored[1]
    got = generate(ckpt.local, "shardspec", tp=1, extra={"source": ckpt.url},
                   env={"AWS_ENDPOINT_URL": server.endpoint_url})
    _same(got, auto(1))
    total, _ = _report("TP 1 from TP 1", server, ckpt, got)
    assert total <= OWN_LAYOUT_OVERHEAD * ckpt.data_bytes
    prefix = ckpt.url.split("/", 3)[3] + "/"
    for name, size in ckpt.sizes.items():  # every data byte once
        assert server.bytes_requested(prefix + name) == size, name
    assert not server.requests("HEAD") and not server.requests("PUT")
    # Issue 51: replayed into the parameters by a placement plan, as from a directory, not
    # handed to the model's load_weights
    assert re.search(r"placement plan .*, 0 tensors through load_weights", got.log), got.log


def test_tp2_from_a_tp2_checkpoint_with_the_endpoint_in_storage_options(
        stored: dict[int, Stored], auto: Callable[[int], Generated], server: S3Server) -> None:
    """No ``AWS_ENDPOINT_URL``: the endpoint in ``storage_options``, the keys from the
    environment. Each worker fetches its own rank's object, the manifest, and (vLLM pads the
    vocabulary of 1000 to 1024 and gives each worker 512 rows, the checkpoint's ranks hold 500)
    rank 0's worker 12 rows of rank 1's embedding and LM head."""
    ckpt = stored[2]
    options = {"client_kwargs": {"endpoint_url": server.endpoint_url}}
    got = generate(ckpt.local, "shardspec", tp=2,
                   extra={"source": ckpt.url, "storage_options": options})
    _same(got, auto(2))
    total, data = _report("TP 2 from TP 2", server, ckpt, got)
    assert total <= OWN_LAYOUT_OVERHEAD * ckpt.data_bytes
    workers = _worker_bytes(got.log)
    assert len(workers) == 2 and all(w < 0.55 * ckpt.data_bytes for w in workers), workers
    assert sum(workers) == data  # the workers' count is the server's


def test_tp2_from_a_tp1_checkpoint_resharded_with_verify(
        stored: dict[int, Stored], auto: Callable[[int], Generated], server: S3Server) -> None:
    """Resharded on load, ``verify``: each worker hashes every object it reads from, whole
    (SPEC 9.2 digests cover whole objects), and the boxes it wants are copied out of that one
    stream: no object is fetched twice by a worker."""
    ckpt = stored[1]
    got = generate(ckpt.local, "shardspec", tp=2, extra={"source": ckpt.url, "verify": True},
                   env={"AWS_ENDPOINT_URL": server.endpoint_url})
    _same(got, auto(2))
    _report("TP 2 from TP 1, verify", server, ckpt, got)
    prefix = ckpt.url.split("/", 3)[3] + "/"
    for name, size in ckpt.sizes.items():
        assert server.bytes_requested(prefix + name) <= 2 * size, name  # once per worker


def test_an_object_replaced_while_the_engine_loads_it_is_refused(
        llama: Path, s3_server: S3Server, bucket: str, server: S3Server,
        tmp_path: Path) -> None:
    """SPEC 9.3 in the engine: TP 2 from a TP 1 checkpoint, whose one object the worker of
    rank 1 reads in several GETs (it wants less than half of it: vLLM gives it 488 rows of the
    vocabulary of 1000, rank 0 512), its header's first. Right after that ranged GET the object
    is replaced (same size, one byte changed); the worker's next answer has another ETag: the
    engine fails with ``object-changed``, it never serves torn weights. (A GET without a range,
    rank 0's whole object, is one version of it: no hook there.)"""
    options = s3_server.storage_options()
    url = f"s3://{bucket}/replaced-tp1"
    manifest = convert(llama, url, tp_size=1, storage_options=options)
    ckpt = _fetched(url, manifest, tmp_path / "local", options)
    (name,) = ckpt.sizes
    fs = fsspec.filesystem("s3", **options)
    other = bytearray(fs.cat_file(f"{bucket}/replaced-tp1/{name}"))
    other[-1] ^= 1
    replaced: list[str] = []

    def replace(request: Request) -> None:
        if request.range is not None and not replaced:
            replaced.append(request.range)
            s3_server.put_object(bucket, f"replaced-tp1/{name}", bytes(other))

    server.on_request("GET", f"replaced-tp1/{name}", replace, times=None)
    with pytest.raises(EngineError) as failed:
        generate(ckpt.local, "shardspec", tp=2, extra={"source": url}, generate=False,
                 env={"AWS_ENDPOINT_URL": server.endpoint_url})
    log = failed.value.log
    assert replaced, "no ranged GET of the object"
    assert "object-changed" in log and name in log, log[-3000:]
