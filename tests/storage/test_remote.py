"""Checkpoints in object storage through fsspec, on its in-memory filesystem (SPEC 2.4, 9.3, 10.4).

The same code paths talk to S3 in tests/storage/test_s3.py; here every fsspec protocol's common
ground
is tested quickly: reads, resharding reads, writes, the commit rule and hostile prefixes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

import shardspec
from checkpoints import assert_same_tensor, make_tiny, tp_states
from hf_helpers import llama_tensors, write_hf_dir
from shardspec import Layout
from shardspec.cli import app
from shardspec.convert import convert
from shardspec.format.limits import MANIFEST_NAME
from shardspec.reshard import load_resharded, reshard
from shardspec.reshard.boxes import ReadStats, requests_for
from shardspec.reshard.load import REMOTE_GAP_BUDGET
from shardspec.storage import remote_link
from shardspec.storage.remote import ObjectVersion, RemoteRoot, is_remote, local_path
from shardspec.storage.remote_link import MAX_REQUEST_BYTES, MIN_REQUEST_BYTES, Link, link_for


@pytest.fixture
def prefix() -> Iterator[str]:
    """A fresh prefix on fsspec's in-memory filesystem, removed afterwards."""
    name = f"/shardspec-test-{uuid.uuid4().hex}"
    yield f"memory://{name}"
    memory = fsspec.filesystem("memory")
    if memory.exists(name):
        memory.rm(name, recursive=True)


def upload(directory: Path, url: str) -> None:
    """Copy a local checkpoint directory to ``url``, file by file."""
    fs, root = fsspec.core.url_to_fs(url)
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            fs.pipe_file(f"{root}/{path.relative_to(directory).as_posix()}", path.read_bytes())


def big_model(path: Path | str, tp: int = 2) -> shardspec.Manifest:
    """A TP checkpoint with enough bytes that headers do not dominate what a rank reads."""
    gen = torch.Generator().manual_seed(7)
    states, sharding = tp_states({
        "col.weight": (torch.randn(512, 256, generator=gen), 0),
        "row.weight": (torch.randn(256, 512, generator=gen), 1),
        "norm.weight": (torch.randn(256, generator=gen), None),
    }, tp)
    return shardspec.save(states, path, layout=Layout(tp_size=tp), sharding=sharding,
                          overwrite=True)


# --- URLs ------------------------------------------------------------------------------------


def test_which_paths_are_remote() -> None:
    assert is_remote("s3://bucket/prefix") and is_remote("memory://x") and is_remote("hf://a/b")
    assert not is_remote("file:///tmp/x") and not is_remote("/tmp/x") and not is_remote("x")
    assert not is_remote(Path("s3:/x"))
    assert local_path("file:///tmp/x") == "/tmp/x"


def test_file_urls_take_the_local_path(tmp_path: Path) -> None:
    tiny = make_tiny(tmp_path / "ck")
    checkpoint = shardspec.open(f"file://{tiny.path}")
    assert isinstance(checkpoint.path, Path) and not checkpoint.is_remote


@pytest.mark.parametrize("relative", [
    "../outside", "/abs", "a//b", "a/./b", "a\\b", "",
    # SPEC 2.4 rule 1: what URLs and store clients give a meaning
    "%2e%2e/%2e%2e/secret", "x.safetensors?versionId=1", "a#fragment", "a\x01b", "a\x7fb",
])
def test_a_manifest_path_cannot_name_an_object_outside_the_prefix(relative: str) -> None:
    root = RemoteRoot("memory://bucket/ck")
    with pytest.raises(shardspec.PathError) as caught:
        root.key(relative)
    assert caught.value.code == "path-unsafe"


def test_storage_options_with_a_local_path_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="storage_options"):
        shardspec.open(tmp_path, storage_options={"anon": True})


def test_an_unknown_protocol_is_a_clear_error() -> None:
    with pytest.raises(shardspec.StorageError) as caught:
        shardspec.open("nosuchprotocol://bucket/ck")
    assert caught.value.code == "storage-unavailable"


# --- reading ---------------------------------------------------------------------------------


def test_every_rank_loads_bit_exact_from_a_prefix(tmp_path: Path, prefix: str) -> None:
    tiny = make_tiny(tmp_path / "ck")
    upload(tiny.path, prefix)
    checkpoint = shardspec.open(prefix)
    assert checkpoint.is_remote and checkpoint.manifest == tiny.manifest
    assert checkpoint.rank_files(1) == [f"{prefix}/{f.path}"
                                        for f in tiny.manifest.ranks[1].files]
    for rank, expected in tiny.expected.items():
        loaded = checkpoint.load_rank(rank, "cpu", verify=True)
        assert set(loaded) == set(expected)
        for name, tensor in expected.items():
            assert_same_tensor(loaded[name], tensor)
        assert loaded["lm_head.weight"] is loaded["model.embed_tokens.weight"]


def test_a_rank_fetches_only_its_own_objects(tmp_path: Path, prefix: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = big_model(tmp_path / "ck")
    upload(tmp_path / "ck", prefix)
    asked: list[tuple[str, int, int]] = []
    original = RemoteRoot.read

    def counting(self: RemoteRoot, relative: str, start: int, end: int,
                 check: Any = None) -> bytes:
        asked.append((relative, start, end))
        return original(self, relative, start, end, check)

    monkeypatch.setattr(RemoteRoot, "read", counting)
    shardspec.load_rank(prefix, 1, "cpu")
    own = {f.path: f.size for f in manifest.ranks[1].files}
    assert {relative for relative, _, _ in asked} == set(own)  # the manifest: read_whole
    data = asked
    # every byte of the rank's files once: no byte twice, none of another rank
    assert sum(e - s for _, s, e in data) == sum(own.values())
    assert len({(r, s) for r, s, _ in data}) == len(data)


@pytest.mark.parametrize("target", [Layout(tp_size=4), Layout(tp_size=1), Layout(tp_size=8)])
def test_resharding_from_a_prefix_equals_resharding_from_disk(
        tmp_path: Path, prefix: str, target: Layout) -> None:
    manifest = big_model(tmp_path / "ck")
    upload(tmp_path / "ck", prefix)
    root = RemoteRoot(prefix)
    for rank in range(target.size):
        stats = ReadStats()
        remote = load_resharded(root, manifest, rank, target, torch.device("cpu"), stats=stats)
        local = load_resharded(tmp_path / "ck", manifest, rank, target, torch.device("cpu"))
        assert set(remote) == set(local)
        for name in local:
            assert_same_tensor(remote[name], local[name])
        # everything asked, the header's request included, stays within the budget
        assert stats.header_bytes + stats.data_bytes <= (
            1 + REMOTE_GAP_BUDGET) * stats.target_bytes


def test_verify_catches_a_corrupted_object(tmp_path: Path, prefix: str) -> None:
    tiny = make_tiny(tmp_path / "ck")
    data = bytearray(tiny.data_file(0).read_bytes())
    data[-1] ^= 0xFF
    tiny.data_file(0).write_bytes(bytes(data))
    upload(tiny.path, prefix)
    shardspec.load_rank(prefix, 0, "cpu")  # without verify, sizes and headers are checked only
    with pytest.raises(shardspec.IntegrityError) as caught:
        shardspec.load_rank(prefix, 0, "cpu", verify=True)
    assert caught.value.code == "checksum-mismatch"
    report = shardspec.validate(prefix, checksums=True)
    assert [f.code for f in report.errors] == ["checksum-mismatch"]


def test_an_object_replaced_while_read_is_an_error(tmp_path: Path, prefix: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """SPEC 9.3: the version is taken before and after; same size, other bytes."""
    tiny = make_tiny(tmp_path / "ck")
    upload(tiny.path, prefix)
    fs, root = fsspec.core.url_to_fs(prefix)
    name = tiny.manifest.ranks[0].files[0].path
    original = RemoteRoot.read
    replaced = []

    def read_then_replace(self: RemoteRoot, relative: str, start: int, end: int,
                          check: Any = None) -> bytes:
        data = original(self, relative, start, end, check)
        if relative == name and not replaced:  # after the version was taken, before it is again
            fs.pipe_file(f"{root}/{name}", tiny.data_file(0).read_bytes())  # a new version
            replaced.append(True)
        return data

    monkeypatch.setattr(RemoteRoot, "read", read_then_replace)
    with pytest.raises(shardspec.IntegrityError) as caught:
        shardspec.load_rank(prefix, 0, "cpu")
    assert caught.value.code == "object-changed" and name in str(caught.value)


def test_a_missing_or_truncated_object(tmp_path: Path, prefix: str) -> None:
    tiny = make_tiny(tmp_path / "ck")
    upload(tiny.path, prefix)
    fs, root = fsspec.core.url_to_fs(prefix)
    name = tiny.manifest.ranks[1].files[0].path
    fs.pipe_file(f"{root}/{name}", tiny.data_file(1).read_bytes()[:-8])
    with pytest.raises(shardspec.IntegrityError) as caught:
        shardspec.load_rank(prefix, 1, "cpu")
    assert caught.value.code == "file-size"
    fs.rm_file(f"{root}/{name}")
    with pytest.raises(shardspec.PathError) as missing:
        shardspec.load_rank(prefix, 1, "cpu")
    assert missing.value.code == "file-missing" and name in str(missing.value)
    shardspec.load_rank(prefix, 0, "cpu")  # rank 0 does not need that object
    report = shardspec.validate(prefix)
    assert [f.code for f in report.errors] == ["file-missing"]


def test_a_store_without_versions_verifies_checksums(tmp_path: Path, prefix: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """SPEC 9.3: with no version to compare, the reader checks the sha256 instead."""
    manifest = big_model(tmp_path / "ck")
    damaged = tmp_path / "ck" / manifest.ranks[0].files[0].path
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes
    damaged.write_bytes(bytes(data))
    upload(tmp_path / "ck", prefix)
    original = RemoteRoot.version

    def unversioned(self: RemoteRoot, relative: str) -> ObjectVersion:
        return ObjectVersion(original(self, relative).size, ())

    monkeypatch.setattr(RemoteRoot, "version", unversioned)
    shardspec.load_rank(prefix, 1, "cpu")  # rank 1's object is intact
    for layout in (None, Layout(tp_size=4)):  # no verify asked: verified all the same
        with pytest.raises(shardspec.IntegrityError) as caught:
            shardspec.load_rank(prefix, 0, "cpu", layout=layout)
        assert caught.value.code == "checksum-mismatch"


def test_a_prefix_without_a_manifest_is_not_a_checkpoint(tmp_path: Path, prefix: str) -> None:
    """SPEC 2.4 rule 2: data objects without a manifest (a failed upload) are not read."""
    tiny = make_tiny(tmp_path / "ck")
    (tiny.path / MANIFEST_NAME).unlink()
    upload(tiny.path, prefix)
    with pytest.raises(shardspec.NotCommittedError):
        shardspec.open(prefix)
    assert [f.code for f in shardspec.validate(prefix).errors] == ["not-committed"]


# --- writing ---------------------------------------------------------------------------------


def test_save_writes_the_same_bytes_as_on_disk(tmp_path: Path, prefix: str) -> None:
    tiny = make_tiny(tmp_path / "ck")
    make_tiny(prefix)
    fs, root = fsspec.core.url_to_fs(prefix)
    names = sorted(p.name for p in tiny.path.iterdir())
    assert sorted(fs.ls(root, detail=False)) == [f"{root}/{n}" for n in names]
    for name in names:
        assert fs.cat_file(f"{root}/{name}") == (tiny.path / name).read_bytes()
    assert shardspec.validate(prefix, checksums=True).ok


def test_the_manifest_is_written_last(tmp_path: Path, prefix: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[str] = []
    for method in ("put_file", "put_bytes"):
        original = getattr(RemoteRoot, method)

        def record(self: RemoteRoot, relative: str, source: Any,
                   _original: Any = original) -> None:
            written.append(relative)
            _original(self, relative, source)

        monkeypatch.setattr(RemoteRoot, method, record)
    tiny = make_tiny(prefix)
    assert written[-1] == MANIFEST_NAME and written.count(MANIFEST_NAME) == 1
    assert set(written[:-1]) == {f.path for r in tiny.manifest.ranks for f in r.files}


def _fail_puts(monkeypatch: pytest.MonkeyPatch, name_start: str) -> None:
    """Every put of an object whose name starts with ``name_start`` fails as storage would."""
    original = RemoteRoot.put_file

    def fail(self: RemoteRoot, relative: str, source: str) -> None:
        if relative.startswith(name_start):
            raise shardspec.StorageError(shardspec.Finding(code="storage-failed", message="x"))
        original(self, relative, source)

    monkeypatch.setattr(RemoteRoot, "put_file", fail)


def test_a_failed_write_leaves_no_manifest(tmp_path: Path, prefix: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    make_tiny(prefix)
    _fail_puts(monkeypatch, "model-rank-1")
    with pytest.raises(shardspec.StorageError):
        make_tiny(prefix, overwrite=True)
    with pytest.raises(shardspec.NotCommittedError):
        shardspec.open(prefix)  # the old manifest went first (SPEC 10.4 rule 2)


def test_overwriting_a_prefix(tmp_path: Path, prefix: str) -> None:
    make_tiny(prefix)
    with pytest.raises(FileExistsError):
        make_tiny(prefix)
    fs, root = fsspec.core.url_to_fs(prefix)
    fs.pipe_file(f"{root}/notes.txt", b"kept: not ours")
    manifest = big_model(prefix, tp=4)
    names = sorted(n.rsplit("/", 1)[1] for n in fs.find(root))
    listed = sorted(f.path for r in manifest.ranks for f in r.files)
    assert names == sorted([*listed, MANIFEST_NAME, "notes.txt"])  # the old tp=2 files: gone


def test_convert_writes_to_a_prefix(tmp_path: Path, prefix: str) -> None:
    source = write_hf_dir(tmp_path / "hf", llama_tensors(), shards=2)
    convert(source, tmp_path / "local", tp_size=2)
    manifest = convert(source, prefix, tp_size=2)
    fs, root = fsspec.core.url_to_fs(prefix)
    for record in [*manifest.extra_files, *(f for r in manifest.ranks for f in r.files)]:
        assert fs.cat_file(f"{root}/{record.path}") == (tmp_path / "local" / record.path
                                                         ).read_bytes()
    assert shardspec.validate(prefix, checksums=True).ok


def test_an_interrupted_convert_to_a_prefix_is_replaced_and_a_users_save_kept(
        tmp_path: Path, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """convert's torch-named objects are claimed before the first is put: a rerun replaces
    what an interrupted convert left (its claim lists it), and shard-* objects that no
    manifest or claim lists are refused, never removed, even with overwrite."""
    source = write_hf_dir(tmp_path / "hf", llama_tensors())
    _fail_puts(monkeypatch, "shard-00002")
    with pytest.raises(shardspec.StorageError):
        convert(source, prefix, tp_size=2)
    monkeypatch.undo()
    fs, root = fsspec.core.url_to_fs(prefix)
    assert sorted(n.rsplit("/", 1)[1] for n in fs.find(root)) == [
        ".shardspec-writing", "shard-00001-model-00001-of-00001.safetensors"]
    convert(source, prefix, tp_size=1)  # no overwrite needed; TP 2's object goes
    assert sorted(n.rsplit("/", 1)[1] for n in fs.find(root) if n.endswith(".safetensors")
                  ) == ["shard-00001-model-00001-of-00001.safetensors"]
    assert ".shardspec-writing" not in [n.rsplit("/", 1)[1] for n in fs.find(root)]
    assert shardspec.validate(prefix, checksums=True).ok
    users = f"{prefix}-users-save"
    _, users_root = fsspec.core.url_to_fs(users)
    fs.pipe_file(f"{users_root}/shard-00001-model-00001-of-00001.safetensors", b"training")
    for overwrite in (False, True):
        with pytest.raises(FileExistsError, match="never removes them"):
            convert(source, users, tp_size=1, overwrite=overwrite)
    assert fs.cat_file(f"{users_root}/shard-00001-model-00001-of-00001.safetensors") == \
        b"training"
    fs.rm(users_root, recursive=True)


@pytest.mark.parametrize("direction", ["remote-to-remote", "local-to-remote", "remote-to-local"])
def test_reshard_between_disk_and_object_storage(tmp_path: Path, prefix: str,
                                                 direction: str) -> None:
    big_model(tmp_path / "src")
    upload(tmp_path / "src", prefix + "/src")
    reshard(tmp_path / "src", tmp_path / "expected", Layout(tp_size=4))
    source = prefix + "/src" if direction.startswith("remote") else tmp_path / "src"
    target: Any = prefix + "/dst" if direction.endswith("-remote") else tmp_path / "dst"
    manifest = reshard(source, target, Layout(tp_size=4))
    for record in (f for r in manifest.ranks for f in r.files):
        expected = (tmp_path / "expected" / record.path).read_bytes()
        if isinstance(target, Path):
            assert (target / record.path).read_bytes() == expected
        else:
            fs, root = fsspec.core.url_to_fs(target)
            assert fs.cat_file(f"{root}/{record.path}") == expected
    assert shardspec.validate(target, checksums=True).ok


# --- the command line ------------------------------------------------------------------------


def test_the_cli_reads_a_prefix(tmp_path: Path, prefix: str) -> None:
    tiny = make_tiny(tmp_path / "ck")
    upload(tiny.path, prefix)
    runner = CliRunner()
    result = runner.invoke(app, ["validate", prefix, "--checksums"])
    assert result.exit_code == 0, result.output
    assert "valid" in result.output
    result = runner.invoke(app, ["files", prefix, "--rank", "1"])
    assert result.exit_code == 0
    assert result.output.split() == [MANIFEST_NAME, *(f.path for f in tiny.manifest.ranks[1].files)]
    result = runner.invoke(app, ["inspect", prefix, "--json"])
    assert result.exit_code == 0 and '"tp_size": 2' in result.output
    result = runner.invoke(app, ["validate", prefix + "-nothing-here"])
    assert result.exit_code == 1 and "not-committed" in result.output


def test_the_cli_takes_file_urls(tmp_path: Path) -> None:
    make_tiny(tmp_path / "ck")
    result = CliRunner().invoke(app, ["validate", f"file://{tmp_path / 'ck'}"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("args", [["merge", "memory://a/ck", "out"],
                                  ["merge", "ck", "memory://a/hf"],
                                  ["import-vllm", "memory://a/vllm"],
                                  ["convert", "memory://a/hf", "out", "--tp", "2"]])
def test_commands_for_local_directories_refuse_urls(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "local" in result.output, result.output
    assert "Traceback" not in result.output


def test_resharding_onto_the_source_prefix_is_refused(tmp_path: Path, prefix: str) -> None:
    big_model(prefix)
    same = prefix.replace("memory://", "memory:///")  # another spelling of the same prefix
    with pytest.raises(ValueError, match="source"):
        reshard(prefix, same, Layout(tp_size=4), overwrite=True)
    assert shardspec.validate(prefix).ok  # nothing of the source was removed


def test_the_cli_refuses_bad_storage_options() -> None:
    result = CliRunner().invoke(app, ["--storage-options", "{not json", "validate", "memory://x"])
    assert result.exit_code == 2 and "not JSON" in result.output


# --- the request planner ---------------------------------------------------------------------


@given(st.lists(st.tuples(st.integers(0, 5000), st.integers(1, 700)), min_size=1, max_size=40),
       st.sampled_from([0.0, 0.1, 0.5]), st.integers(1, 3000))
def test_requests_cover_every_target_within_the_allowance(
        runs: list[tuple[int, int]], budget: float, most: int) -> None:
    targets, position = [], 0
    for gap, length in runs:  # disjoint, sorted targets
        position += gap
        targets.append((position, memoryview(bytearray(length))))
        position += length
    wanted = sum(len(v) for _, v in targets)
    requests = requests_for(targets, budget * wanted, most)
    asked = sum(end - start for start, end, _ in requests)
    assert asked <= wanted * (1 + budget) + 1e-9
    assert all(0 < end - start <= most for start, end, _ in requests)
    assert all(a[1] <= b[0] for a, b in zip(requests, requests[1:], strict=False))
    for start, end, inside in requests:  # exactly the targets each request overlaps
        overlapping = [id(v) for at, v in targets if at < end and at + len(v) > start]
        assert [id(v) for _, v in inside] == overlapping
    # every wanted byte lies in exactly one request
    covered = sorted((s, e) for s, e, _ in requests)
    for at, view in targets:
        inside = sum(max(0, min(e, at + len(view)) - max(s, at)) for s, e in covered)
        assert inside == len(view)


# --- request sizing by the measured link ------------------------------------------------------


def test_before_any_measurement_requests_are_sized_for_s3() -> None:
    link = Link()
    assert link.request_bytes() == int(4 * 0.030 * 90e6)  # 10.8 MB: S3's 8-16 MB


@pytest.mark.parametrize(("latency", "throughput", "expected"), [
    (0.0005, 2e9, MIN_REQUEST_BYTES),  # a fast local server: never below the floor
    (0.050, 200e6, int(4 * 0.050 * 200e6)),  # 40 MB: about four latencies' worth
    (2.0, 1e9, MAX_REQUEST_BYTES),  # a slow store's first byte: never above the ceiling
])
def test_requests_ask_four_latencies_worth_within_bounds(
        latency: float, throughput: float, expected: int) -> None:
    link = Link()
    # a short body teaches the latency, a long one the throughput; the first sample of each
    # replaces the guess
    link.observe(latency, 1000, first_byte_s=latency)
    link.observe(latency + 64e6 / throughput, 64_000_000, first_byte_s=latency)
    assert link.latency_s == pytest.approx(latency)
    assert link.throughput == pytest.approx(throughput)
    assert link.request_bytes() == expected


def test_without_a_first_byte_time_short_bodies_teach_the_latency() -> None:
    link = Link()
    link.observe(0.010, 100)
    link.observe(0.010 + 32 * 2**20 / 100e6, 32 * 2**20)
    assert link.latency_s == pytest.approx(0.010)
    assert link.throughput == pytest.approx(100e6)


def test_an_objects_own_latency_sizes_its_requests_where_it_is_longer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    link = Link()
    link.observe(0.002, 1000, first_byte_s=0.002)  # the manifest's small GET
    link.observe(0.002 + 4e6 / 1e9, 4_000_000, first_byte_s=0.002)
    assert link.data_measured and link.request_bytes() == MIN_REQUEST_BYTES
    assert link.latency_of(0.100 + 8e6 / 1e9, 8_000_000) == pytest.approx(0.100)
    assert link.request_bytes(latency_s=0.100) == int(4 * 0.100 * 1e9)  # 400 MB
    assert link.request_bytes(latency_s=0.0001) == MIN_REQUEST_BYTES  # the link's, if longer
    assert link.ranges(0, 100_000_000, latency_s=0.100) == [(0, 100_000_000)]
    # a stream's own first MiB: its rate in place of the link's
    assert link.request_bytes(latency_s=0.100, throughput=50e6) == int(4 * 0.100 * 50e6)
    assert len(link.ranges(0, 100_000_000, latency_s=0.100, throughput=50e6)) == 5
    assert not Link().data_measured
    link = Link()
    link.observe(0.002, 500_000, first_byte_s=0.001)  # a body shorter than a data request's
    assert not link.data_measured
    monkeypatch.setattr(remote_link, "REQUEST_BYTES", 1000)
    assert link.data_measured  # a fixed size: nothing to probe


def test_data_requests_are_sized_with_the_latency_of_data_sized_answers() -> None:
    # moto copies an object for each GET: a 140 MiB object's first byte comes after 60 ms, a
    # manifest's after 2 ms. The manifests' GETs between loads do not shrink the data requests.
    link = Link()
    link.observe(0.060 + 0.150, 146_800_640, first_byte_s=0.060)
    for _ in range(5):
        link.observe(0.002 + 0.000150, 150_000, first_byte_s=0.002)
    assert link.latency_s < 0.020
    assert link.request_latency_s == pytest.approx(0.060)
    assert link.ranges(0, 146_800_640) == [(0, 146_800_640)]
    untimed = Link()
    untimed.observe(0.5, 8_000_000)  # a client that does not time the first byte
    assert untimed.request_latency_s == untimed.latency_s


def test_ranges_are_even_and_an_object_under_one_request_is_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    link = Link()
    assert link.ranges(0, 1000) == [(0, 1000)]
    monkeypatch.setattr(remote_link, "REQUEST_BYTES", 1000)
    assert link.ranges(0, 1000) == [(0, 1000)]
    assert link.ranges(100, 2101) == [(100, 767), (767, 1434), (1434, 2101)]
    assert link.ranges(5, 5) == []


def test_a_measured_size_is_a_balance_not_a_bound() -> None:
    link = Link()
    target = link.request_bytes()
    assert len(link.ranges(0, int(target * 1.05))) == 1  # not two halves for 5% over
    assert len(link.ranges(0, int(target * 1.6))) == 2
    assert len(link.ranges(0, int(target * 0.3))) == 1
    link.latency_s = 10.0  # requests at the ceiling: that stays a bound
    assert len(link.ranges(0, MAX_REQUEST_BYTES + 1)) == 2


def test_one_link_per_store_endpoint() -> None:
    memory = fsspec.filesystem("memory")
    assert link_for(memory) is link_for(fsspec.filesystem("memory", skip_instance_cache=True))
    assert RemoteRoot("memory://a").link is link_for(memory)
