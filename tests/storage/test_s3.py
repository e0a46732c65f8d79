"""Checkpoints in S3, against a real S3-protocol server on 127.0.0.1 (tests/helpers/s3_server.py).

The server counts every byte asked and injects the failures object storage has: missing and
truncated objects, server errors mid-read, refused credentials, an object replaced while read.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
from typer.testing import CliRunner

import shardspec
from checkpoints import assert_same_tensor, tp_states
from hf_helpers import llama_tensors, write_hf_dir
from shardspec import Layout
from shardspec.cli import app
from shardspec.format.limits import MANIFEST_NAME
from shardspec.reshard import load as reshard_load
from shardspec.reshard.load import REMOTE_GAP_BUDGET
from shardspec.storage import remote, remote_link, remote_s3
from shardspec.storage.remote import RemoteRoot
from shardspec.storage.remote_files import RemoteObject

if TYPE_CHECKING:
    from s3_server import Request, S3Server

TP = 2


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retry as in production, without the production waits."""
    monkeypatch.setattr(remote, "RETRY_WAIT", 0.001)


def model(tp: int) -> tuple[dict[str, torch.Tensor], dict[int, dict[str, torch.Tensor]],
                            dict[int, dict[str, shardspec.Shard]]]:
    """Global tensors of a few MiB (headers are a small share of what a rank reads), and their
    TP split: column-parallel, row-parallel and replicated."""
    gen = torch.Generator().manual_seed(11)
    tensors = {
        "col.weight": (torch.randn(1024, 512, generator=gen), 0),
        "row.weight": (torch.randn(512, 1024, generator=gen).to(torch.bfloat16), 1),
        "norm.weight": (torch.randn(512, generator=gen), None),
    }
    states, sharding = tp_states(tensors, tp)
    return {name: tensor for name, (tensor, _) in tensors.items()}, states, sharding


@pytest.fixture
def saved(s3_server: S3Server, s3_bucket: str, tmp_path: Path
          ) -> tuple[str, dict[str, Any], shardspec.Manifest, Path]:
    """The model saved to s3://bucket/ck and, the same way, to a local directory."""
    _, states, sharding = model(TP)
    url = f"s3://{s3_bucket}/ck"
    options = s3_server.storage_options()
    manifest = shardspec.save(states, url, layout=Layout(tp_size=TP), sharding=sharding,
                              storage_options=options)
    shardspec.save(states, tmp_path / "local", layout=Layout(tp_size=TP), sharding=sharding)
    s3_server.clear_log()
    return url, options, manifest, tmp_path / "local"


def assert_loads_as_saved(url: str, options: dict[str, Any], local: Path, rank: int) -> None:
    """``rank`` loaded from the bucket holds the tensors it holds loaded from the local copy."""
    loaded = shardspec.load_rank(url, rank, "cpu", storage_options=options)
    expected = shardspec.load_rank(local, rank, "cpu")
    for key in expected:
        assert_same_tensor(loaded[key], expected[key])


def data_keys(requests: list[Request]) -> set[str]:
    return {r.key.rsplit("/", 1)[1] for r in requests if r.key.endswith(".safetensors")}


# --- writing ---------------------------------------------------------------------------------


def test_save_uploads_data_first_and_the_manifest_last(s3_server: S3Server,
                                                       s3_bucket: str) -> None:
    _, states, sharding = model(TP)
    manifest = shardspec.save(states, f"s3://{s3_bucket}/ck", layout=Layout(tp_size=TP),
                              sharding=sharding, storage_options=s3_server.storage_options())
    puts = [r.key for r in s3_server.requests("PUT") if r.key]
    assert puts[-1] == f"ck/{MANIFEST_NAME}" and puts.count(f"ck/{MANIFEST_NAME}") == 1
    assert {p.removeprefix("ck/") for p in puts[:-1]} == {
        f.path for r in manifest.ranks for f in r.files}


def test_a_failed_upload_leaves_no_checkpoint(s3_server: S3Server, s3_bucket: str) -> None:
    _, states, sharding = model(TP)
    options = s3_server.storage_options()
    s3_server.fail("PUT", "*model-rank-1-*", times=None)
    with pytest.raises(shardspec.StorageError) as caught:
        shardspec.save(states, f"s3://{s3_bucket}/ck", layout=Layout(tp_size=TP),
                       sharding=sharding, storage_options=options)
    assert caught.value.code == "storage-failed" and "model-rank-1" in str(caught.value)
    assert not s3_server.requests("PUT", f"ck/{MANIFEST_NAME}")
    s3_server.clear_rules()
    with pytest.raises(shardspec.NotCommittedError):  # rank 0's object is there: not read
        shardspec.open(f"s3://{s3_bucket}/ck", storage_options=options)


# --- reading ---------------------------------------------------------------------------------


def test_each_rank_reads_exactly_its_own_bytes(
        s3_server: S3Server, saved: tuple[str, dict[str, Any], shardspec.Manifest, Path]) -> None:
    url, options, manifest, local = saved
    for rank in range(TP):
        s3_server.clear_log()
        loaded = shardspec.load_rank(url, rank, "cpu", storage_options=options)
        expected = shardspec.load_rank(local, rank, "cpu")
        assert set(loaded) == set(expected)
        for name in expected:
            assert_same_tensor(loaded[name], expected[name])
        own = {f.path: f.size for f in manifest.ranks[rank].files}
        gets = s3_server.requests("GET")
        assert data_keys(gets) == set(own)  # no other rank's object
        for path, size in own.items():  # every byte once: header request, then the rest
            assert s3_server.bytes_requested(f"ck/{path}") == size
        manifest_gets = [r for r in gets if r.key.endswith(MANIFEST_NAME)]
        assert len(manifest_gets) == 1  # fetched once


def test_the_filesystems_extra_request_options_go_with_each_get(
        saved: tuple[str, dict[str, Any], shardspec.Manifest, Path]) -> None:
    """s3fs's ``s3_additional_kwargs`` (a requester-pays flag, SSE-C keys) reach the GETs made
    with its client, those GetObject takes only: botocore refuses an unknown parameter."""
    url, options, _, local = saved
    extra = {"RequestPayer": "requester", "ACL": "private", "ContentType": "text/plain"}
    loaded = shardspec.load_rank(url, 0, "cpu",
                                 storage_options={**options, "s3_additional_kwargs": extra})
    expected = shardspec.load_rank(local, 0, "cpu")
    for name in expected:
        assert_same_tensor(loaded[name], expected[name])
    root = RemoteRoot(url, {**options, "s3_additional_kwargs": extra})
    client = root.fs.s3  # the botocore client the loads above made
    assert remote_s3._get_object_options(client, root.fs) == {"RequestPayer": "requester"}


def test_a_rank_is_one_get_per_object_and_no_head(
        s3_server: S3Server, saved: tuple[str, dict[str, Any], shardspec.Manifest, Path]) -> None:
    """Objects smaller than one request: one GET each, without a range; the size and ETag
    checked come with the answer."""
    url, options, manifest, _ = saved
    shardspec.load_rank(url, 1, "cpu", storage_options=options)
    assert not s3_server.requests("HEAD")
    for record in manifest.ranks[1].files:
        gets = s3_server.requests("GET", f"ck/{record.path}")
        assert [(r.range, r.body_length) for r in gets] == [(None, record.size)]


def test_requests_are_sized_by_the_link_and_ask_every_byte_once(
        s3_server: S3Server, saved: tuple[str, dict[str, Any], shardspec.Manifest, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    url, options, manifest, local = saved
    monkeypatch.setattr(remote_link, "REQUEST_BYTES", 256 * 1024)
    loaded = shardspec.load_rank(url, 0, "cpu", storage_options=options)
    expected = shardspec.load_rank(local, 0, "cpu")
    for name in expected:
        assert_same_tensor(loaded[name], expected[name])
    assert not s3_server.requests("HEAD")
    for record in manifest.ranks[0].files:
        gets = s3_server.requests("GET", f"ck/{record.path}")
        assert len(gets) == -(-record.size // (256 * 1024))
        assert s3_server.bytes_requested(f"ck/{record.path}") == record.size


@pytest.mark.parametrize("measured", [False, True])
def test_before_a_data_request_is_measured_an_object_that_costs_per_request_is_one_get(
        s3_server: S3Server, saved: tuple[str, dict[str, Any], shardspec.Manifest, Path],
        monkeypatch: pytest.MonkeyPatch, measured: bool) -> None:
    # A store whose every request costs 0.2 s before its first byte (as one that copies the
    # object for each ranged GET does), and a link that knows only a fast small answer: the
    # object's first GET shows its latency, and it goes on alone to the end.
    url, options, manifest, local = saved
    monkeypatch.setattr(remote_link, "_LINKS", {})
    monkeypatch.setattr(remote_link, "MIN_REQUEST_BYTES", 64 * 1024)  # objects of 1.5 MiB
    monkeypatch.setattr(remote_link, "DATA_SAMPLE_BYTES", 64 * 1024)
    checkpoint = shardspec.open(url, storage_options=options)
    (link,) = remote_link._LINKS.values()
    link.latency_s, link.throughput = 0.001, 100e6  # requests of 400 kB: several per object
    link.data_samples = int(measured)
    s3_server.on_request("GET", lambda key: key.endswith(".safetensors"),
                         lambda request: time.sleep(0.2), times=None)
    s3_server.clear_log()
    planned = {r.path: len(link.ranges(0, r.size)) for r in manifest.ranks[0].files}
    assert min(planned.values()) >= 3
    loaded = checkpoint.load_rank(0, "cpu")
    expected = shardspec.load_rank(local, 0, "cpu")
    for name in expected:
        assert_same_tensor(loaded[name], expected[name])
    for record in manifest.ranks[0].files:
        gets = s3_server.requests("GET", f"ck/{record.path}")
        assert len(gets) == (planned[record.path] if measured else 1), record.path
        assert s3_server.bytes_requested(f"ck/{record.path}") == record.size
    assert link.data_measured


def test_before_a_data_request_is_measured_a_slow_objects_first_get_is_cut_and_the_rest_ranged(
        s3_server: S3Server, saved: tuple[str, dict[str, Any], shardspec.Manifest, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Bodies sent at 2 MB/s (one connection of a slow network): the first 64 KiB of each
    # object's GET measure that, the rest of the object goes out in ranged GETs at once, and
    # the first GET stops where they begin. No byte is received twice.
    url, options, manifest, local = saved
    monkeypatch.setattr(remote_link, "_LINKS", {})
    monkeypatch.setattr(remote_link, "MIN_REQUEST_BYTES", 64 * 1024)
    monkeypatch.setattr(remote_link, "DATA_SAMPLE_BYTES", 64 * 1024)
    checkpoint = shardspec.open(url, storage_options=options)
    (link,) = remote_link._LINKS.values()
    link.latency_s = 0.001  # what the manifest's small answer shows: several requests planned
    assert not link.data_measured
    assert len(link.ranges(0, manifest.ranks[0].files[0].size)) >= 3
    s3_server.pace("GET", lambda key: key.endswith(".safetensors"), 2e6)
    s3_server.clear_log()
    assert isinstance(checkpoint.path, RemoteRoot)
    before = checkpoint.path.traffic.bytes_read
    loaded = checkpoint.load_rank(0, "cpu")
    expected = shardspec.load_rank(local, 0, "cpu")
    for name in expected:
        assert_same_tensor(loaded[name], expected[name])
    records = manifest.ranks[0].files
    assert checkpoint.path.traffic.bytes_read - before == sum(r.size for r in records)
    for record in records:
        first, *rest = s3_server.requests("GET", f"ck/{record.path}")
        assert (first.range, first.body_length) == (None, record.size)
        assert len(rest) >= 2, record.path
        spans = sorted(tuple(int(x) for x in r.range.removeprefix("bytes=").split("-"))
                       for r in rest if r.range is not None)
        assert len(spans) == len(rest)
        assert spans[-1][1] == record.size - 1
        assert all(a[1] + 1 == b[0] for a, b in zip(spans, spans[1:], strict=False))
        assert 64 * 1024 <= spans[0][0] < record.size / 2  # the first GET kept its share
    assert link.data_measured


@pytest.mark.parametrize(("tp", "budget", "most_gets"), [
    (4, REMOTE_GAP_BUDGET, 3), (1, REMOTE_GAP_BUDGET, 3), (8, REMOTE_GAP_BUDGET, None),
    (8, 3.0, 3)])
def test_resharding_asks_within_the_budget_in_few_requests(
        s3_server: S3Server, saved: tuple[str, dict[str, Any], shardspec.Manifest, Path],
        monkeypatch: pytest.MonkeyPatch, tp: int, budget: float, most_gets: int | None) -> None:
    """At most (1 + budget) x the pieces' bytes are asked, headers included. A row-parallel
    piece (512 rows here) split in two wants half of every row, its gaps as long as its
    runs: the default budget bridges them, a few GETs per object, not one per row. Split in
    four (TP 2 -> 8) its gaps are three times its runs: that takes a budget of 3."""
    url, options, _, local = saved
    monkeypatch.setattr(reshard_load, "REMOTE_GAP_BUDGET", budget)
    target = Layout(tp_size=tp)
    checkpoint = shardspec.open(url, storage_options=options)
    for rank in range(target.size):
        s3_server.clear_log()
        loaded = checkpoint.load_rank(rank, "cpu", layout=target)
        expected = shardspec.load_rank(local, rank, "cpu", layout=target)
        for name in expected:
            assert_same_tensor(loaded[name], expected[name])
        pieces = sum(t.numel() * t.element_size() for t in expected.values())
        asked = s3_server.bytes_requested("ck/model-")  # headers included
        assert asked <= (1 + budget) * pieces, (rank, asked, pieces)
        gets = s3_server.requests("GET", "ck/model-")
        if most_gets is not None:
            assert len(gets) <= most_gets * len(data_keys(gets)), (rank, len(gets))
        assert not s3_server.requests("HEAD")


@pytest.mark.parametrize("budget", [0.0, REMOTE_GAP_BUDGET])
def test_resharding_with_verify_fetches_every_byte_of_an_object_once(
        s3_server: S3Server, saved: tuple[str, dict[str, Any], shardspec.Manifest, Path],
        monkeypatch: pytest.MonkeyPatch, budget: float) -> None:
    """``verify`` hashes whole objects (SPEC 9.2): the object is streamed once, hashed, and
    the rank's boxes are copied out of the stream, never asked again by ranged GETs; a byte
    changed (same size, before the load) is refused."""
    url, options, manifest, local = saved
    monkeypatch.setattr(reshard_load, "REMOTE_GAP_BUDGET", budget)
    monkeypatch.setattr(remote_link, "REQUEST_BYTES", 256 * 1024)  # several GETs an object
    target = Layout(tp_size=4)
    checkpoint = shardspec.open(url, storage_options=options)
    sizes = {f.path: f.size for r in manifest.ranks for f in r.files}
    for rank in range(target.size):
        s3_server.clear_log()
        loaded = checkpoint.load_rank(rank, "cpu", layout=target, verify=True)
        expected = shardspec.load_rank(local, rank, "cpu", layout=target)
        for name in expected:
            assert_same_tensor(loaded[name], expected[name])
        keys = data_keys(s3_server.requests("GET"))
        assert keys
        for path in keys:
            assert s3_server.bytes_requested(f"ck/{path}") == sizes[path], (rank, path)
    name = manifest.ranks[1].files[0].path
    other = bytearray((local / name).read_bytes())
    other[-1] ^= 1
    s3_server.put_object(url.split("/")[2], f"ck/{name}", bytes(other))
    with pytest.raises(shardspec.IntegrityError) as caught:
        checkpoint.load_rank(3, "cpu", layout=target, verify=True)
    assert caught.value.code == "checksum-mismatch" and name in str(caught.value)


def test_a_missing_object_is_named(
        s3_server: S3Server, saved: tuple[str, dict[str, Any], shardspec.Manifest, Path]) -> None:
    url, options, manifest, _ = saved
    name = manifest.ranks[1].files[0].path
    RemoteRoot(url, options).remove(name)
    with pytest.raises(shardspec.PathError) as caught:
        shardspec.load_rank(url, 1, "cpu", storage_options=options)
    assert caught.value.code == "file-missing" and f"{url}/{name}" in str(caught.value)
    shardspec.load_rank(url, 0, "cpu", storage_options=options)


def test_the_manifest_is_one_request_and_an_empty_one_is_a_syntax_error(
        s3_server: S3Server, saved: tuple[str, dict[str, Any], shardspec.Manifest, Path]) -> None:
    url, options, _, _ = saved
    shardspec.open(url, storage_options=options)
    assert [(r.method, r.key) for r in s3_server.requests()] == [("GET", f"ck/{MANIFEST_NAME}")]
    s3_server.put_object(url.split("/")[2], f"ck/{MANIFEST_NAME}", b"")
    with pytest.raises(shardspec.ManifestSyntaxError) as caught:
        shardspec.open(url, storage_options=options)
    assert caught.value.code == "json-syntax"


def test_a_truncated_object_is_refused_before_its_data_is_read(
        s3_server: S3Server, saved: tuple[str, dict[str, Any], shardspec.Manifest, Path]) -> None:
    url, options, manifest, local = saved
    bucket = url.split("/")[2]
    name = manifest.ranks[0].files[0].path
    s3_server.put_object(bucket, f"ck/{name}", (local / name).read_bytes()[:-100])
    with pytest.raises(shardspec.IntegrityError) as caught:
        shardspec.load_rank(url, 0, "cpu", storage_options=options)
    assert caught.value.code == "file-size" and name in str(caught.value)
    assert not s3_server.requests("HEAD")  # the GET's answer told the size, before its body
    report = shardspec.validate(url, storage_options=options)
    assert [(f.code, f.file) for f in report.errors] == [("file-size", name)]


def test_a_range_past_the_end_is_a_clear_file_size_error(
        s3_server: S3Server, saved: tuple[str, dict[str, Any], shardspec.Manifest, Path]) -> None:
    """S3 answers 416 to a range that begins past the object's end: the object is shorter
    than its record."""
    url, options, manifest, local = saved
    record = manifest.ranks[0].files[0]
    s3_server.put_object(url.split("/")[2], f"ck/{record.path}",
                         (local / record.path).read_bytes()[:1000])
    source = RemoteObject(RemoteRoot(url, options), record.path, record.size)
    with pytest.raises(shardspec.IntegrityError) as caught:
        source.read(record.size - 100, record.size)
    error = caught.value
    assert error.code == "file-size" and error.section == "9.1"
    assert f"{url}/{record.path}" in str(error) and "416" in str(error)
    assert [r.status for r in s3_server.requests("GET", f"ck/{record.path}")] == [416]


def test_a_server_error_mid_read_is_retried(
        s3_server: S3Server, saved: tuple[str, dict[str, Any], shardspec.Manifest, Path]) -> None:
    url, options, manifest, local = saved
    name = manifest.ranks[1].files[0].path
    s3_server.fail("GET", f"*{name}", status=500, times=remote.RETRIES - 1)
    assert_loads_as_saved(url, options, local, 1)
    failed = [r for r in s3_server.requests("GET", f"ck/{name}") if r.status == 500]
    assert len(failed) == remote.RETRIES - 1


def test_a_server_that_keeps_failing_is_a_clear_error(
        s3_server: S3Server, saved: tuple[str, dict[str, Any], shardspec.Manifest, Path]) -> None:
    url, options, manifest, _ = saved
    name = manifest.ranks[1].files[0].path
    s3_server.fail("GET", f"*{name}", status=503, code="ServiceUnavailable", times=None)
    with pytest.raises(shardspec.StorageError) as caught:
        shardspec.load_rank(url, 1, "cpu", storage_options=options)
    error = caught.value
    assert error.code == "storage-failed" and error.section == "2.4"
    assert f"{url}/{name}" in str(error) and f"after {remote.RETRIES} attempts" in str(error)
    assert len(s3_server.requests("GET", f"ck/{name}")) == remote.RETRIES


def test_a_connection_dropped_mid_body_is_retried(
        s3_server: S3Server, saved: tuple[str, dict[str, Any], shardspec.Manifest, Path]) -> None:
    """A short body is retried like a 5xx: shardspec's retries are the only ones (the GET is
    made with the client, not through s3fs's retrying wrapper)."""
    url, options, manifest, local = saved
    name = manifest.ranks[0].files[0].path
    s3_server.truncate("GET", f"*{name}", after_bytes=1000, times=remote.RETRIES - 1)
    assert_loads_as_saved(url, options, local, 0)
    drops = sum(r.fault == "truncate" for r in s3_server.requests("GET", f"ck/{name}"))
    assert drops == remote.RETRIES - 1


def test_refused_credentials(s3_server: S3Server,
                             saved: tuple[str, dict[str, Any], shardspec.Manifest, Path]) -> None:
    url, _, _, _ = saved
    wrong = s3_server.storage_options(key="not-a-key")
    with pytest.raises(shardspec.StorageError) as caught:
        shardspec.open(url, storage_options=wrong)
    assert caught.value.code == "storage-denied" and MANIFEST_NAME in str(caught.value)
    assert len(s3_server.requests()) == 1  # one HEAD of the manifest: not retried
    result = CliRunner().invoke(app, ["--storage-options", json.dumps(wrong), "validate", url])
    assert result.exit_code == 2, result.output
    assert "storage-denied" in result.output and "Traceback" not in result.output


def test_an_object_replaced_while_read_is_an_error(
        s3_server: S3Server, saved: tuple[str, dict[str, Any], shardspec.Manifest, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SPEC 9.3: same size, other bytes, swapped in between two ranged GETs of the object: the
    second answer's ETag is not the first's."""
    url, options, manifest, local = saved
    bucket = url.split("/")[2]
    name = manifest.ranks[0].files[0].path
    other = bytearray((local / name).read_bytes())
    other[-1] ^= 1

    def replace(_: Request) -> None:
        s3_server.put_object(bucket, f"ck/{name}", bytes(other))

    monkeypatch.setattr(remote_link, "REQUEST_BYTES", 256 * 1024)  # several GETs
    monkeypatch.setattr(remote, "REQUESTS_IN_FLIGHT", 1)  # in order: the first answer first
    monkeypatch.setattr(remote, "_POOL", None)
    s3_server.on_request("GET", f"*{name}", replace)  # after the first GET
    with pytest.raises(shardspec.IntegrityError) as caught:
        shardspec.load_rank(url, 0, "cpu", storage_options=options)
    assert caught.value.code == "object-changed" and name in str(caught.value)
    assert "ETag" in str(caught.value)


def test_an_object_replaced_before_the_load_is_caught_by_verify(
        s3_server: S3Server, saved: tuple[str, dict[str, Any], shardspec.Manifest, Path]) -> None:
    """A replacement finished before the reader takes the version leaves consistent bytes of
    another object: the size check (same size here) cannot tell; the checksum does."""
    url, options, manifest, local = saved
    bucket = url.split("/")[2]
    name = manifest.ranks[0].files[0].path
    checkpoint = shardspec.open(url, storage_options=options)
    other = bytearray((local / name).read_bytes())
    other[-1] ^= 1
    s3_server.put_object(bucket, f"ck/{name}", bytes(other))
    with pytest.raises(shardspec.IntegrityError) as caught:
        checkpoint.load_rank(0, "cpu", verify=True)
    assert caught.value.code == "checksum-mismatch"
    report = shardspec.validate(url, checksums=True, storage_options=options)
    assert [(f.code, f.file) for f in report.errors] == [("checksum-mismatch", name)]


# --- validate, the command line, convert and reshard -----------------------------------------


def test_validate_with_checksums(
        s3_server: S3Server, saved: tuple[str, dict[str, Any], shardspec.Manifest, Path]) -> None:
    url, options, manifest, _ = saved
    report = shardspec.validate(url, checksums=True, storage_options=options)
    assert report.ok and report.checksums_verified == sum(len(r.files) for r in manifest.ranks)
    # every byte once: the header's GET, then the rest of the object for the hash
    for record in (f for r in manifest.ranks for f in r.files):
        assert s3_server.bytes_requested(f"ck/{record.path}") == record.size


def test_the_cli_end_to_end(s3_server: S3Server, s3_bucket: str, tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """convert to S3, validate, inspect, files, reshard S3 -> S3, through the command line."""
    source = write_hf_dir(tmp_path / "hf", llama_tensors(hidden=64, intermediate=128), shards=2)
    monkeypatch.setenv("SHARDSPEC_STORAGE_OPTIONS", json.dumps(s3_server.storage_options()))
    runner = CliRunner()
    url = f"s3://{s3_bucket}/llama-tp2"
    for args in (["convert", str(source), url, "--tp", "2"],
                 ["validate", url, "--checksums"],
                 ["inspect", url],
                 ["files", url, "--rank", "1"],
                 ["reshard", url, f"s3://{s3_bucket}/llama-tp4", "--tp", "4", "--gap-budget",
                  "1.0"],
                 ["validate", f"s3://{s3_bucket}/llama-tp4", "--checksums"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, (args, result.output)
    converted = tmp_path / "local-tp2"
    assert runner.invoke(app, ["convert", str(source), str(converted), "--tp", "2"]
                         ).exit_code == 0
    for rank in range(4):
        remote_rank = shardspec.load_rank(f"s3://{s3_bucket}/llama-tp4", rank, "cpu",
                                          storage_options=s3_server.storage_options())
        local_rank = shardspec.load_rank(converted, rank, "cpu", layout=Layout(tp_size=4))
        for name in local_rank:
            assert_same_tensor(remote_rank[name], local_rank[name])
