"""Hostile input, round four (issue 49): manifests, imports and options that crashed or hung.

Each test failed before its fix: "internal error" on the command line, a Python exception
that is not a shardspec error, a valid verdict for a checkpoint a reader cannot load, or a
file silently dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import tracemalloc
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

import shardspec
from checkpoints import make_tiny, manifest_bytes, read_manifest_dict, write_manifest_dict
from shardspec import Layout, Shard
from shardspec.cli import app
from shardspec.convert import adopt, import_hf_distributed
from shardspec.convert.adopt import add_data_file
from shardspec.convert.hf import HFError
from shardspec.format.errors import NotCommittedError, ShardspecError
from shardspec.format.parse import parse_manifest
from shardspec.integrations.vllm.options import LoaderOptions, OptionsError
from shardspec.integrations.vllm.source import open_source
from shardspec.reshard.write import reshard
from shardspec.storage import fetch_config as fetch_config_module
from shardspec.storage.entries import walk
from shardspec.storage.fetch_config import fetch_config
from shardspec.testing.adversarial import joined_pieces, nested_paths

if TYPE_CHECKING:
    from s3_server import S3Server

runner = CliRunner()


def cli_json(*args: str) -> dict[str, Any]:
    result = runner.invoke(app, [*args, "--json"])
    said = result.stdout + result.stderr
    assert "internal error" not in said and "Traceback" not in said, said
    data: dict[str, Any] = json.loads(result.stdout)
    return data


# --- item 6: two pieces on one rank, one offset shorter than the shape ------------------------


def short_offset(root: Path) -> None:
    """Rank 0 holds a second piece of the colwise weight, in a second file, whose offset has
    one number for a tensor of two dimensions."""
    data = read_manifest_dict(root)
    data["format_version"] = "1.3"
    files = data["ranks"][0]["files"]
    files.append({**files[0], "path": "model-rank-0-part-1.safetensors"})
    data["tensors"]["layers.0.col.weight"]["pieces"].append(
        {"rank": 0, "file": "model-rank-0-part-1.safetensors", "offset": [4], "shape": [4, 4]})
    write_manifest_dict(root, data)


def test_a_short_offset_among_several_pieces_is_piece_bounds(tmp_path: Path) -> None:
    """validate and inspect said "internal error: IndexError"; shardspec.open raised it."""
    tiny = make_tiny(tmp_path / "ckpt")
    short_offset(tiny.path)
    data = (tiny.path / "shardspec.json").read_bytes()
    assert parse_manifest(data).findings[0].code == "piece-bounds"
    with pytest.raises(ShardspecError) as excinfo:
        shardspec.open(tiny.path)
    assert excinfo.value.code == "piece-bounds"
    report = cli_json("validate", str(tiny.path))
    assert report["valid"] is False and "piece-bounds" in json.dumps(report)
    assert "piece-bounds" in json.dumps(cli_json("inspect", str(tiny.path)))


# --- item 8: sub-byte joins of a tensor with no elements -------------------------------------


@pytest.mark.parametrize("dim", [0, 1])
def test_a_sub_byte_join_with_no_elements_loads_empty(tmp_path: Path, dim: int) -> None:
    """SPEC 7.7: a reader returns a zero-element tensor. validate said valid, and the writer
    and load_rank raised torch's "cannot reshape tensor of 0 elements"."""
    shape = (0, 8) if dim == 1 else (4, 0)
    value = torch.empty((shape[0], shape[1] // 2), dtype=torch.uint8).view(
        torch.float4_e2m1fn_x2)
    half = [0, 0]
    half[dim] = shape[dim] // 2
    pieces = [Shard(shape, (0, 0), shape=(*shape[:dim], half[dim], *shape[dim + 1:])),
              Shard(shape, tuple(half), shape=(*shape[:dim], half[dim], *shape[dim + 1:]))]
    shardspec.save({0: {"w": value}}, tmp_path / "c", layout=Layout(tp_size=1),
                   sharding={0: {"w": pieces}})
    assert shardspec.validate(tmp_path / "c", checksums=True).ok
    got = shardspec.load_rank(tmp_path / "c", 0, "cpu", verify=True)["w"]
    assert got.dtype == torch.float4_e2m1fn_x2 and got.numel() == 0
    assert tuple(got.shape) == tuple(value.shape)
    reshard(tmp_path / "c", tmp_path / "r", Layout(tp_size=2))
    for rank in range(2):
        assert shardspec.load_rank(tmp_path / "r", rank, "cpu")["w"].numel() == 0


# --- item 9: a listed path under another listed path or under the manifest -------------------


def extra(path: str, data: bytes = b"{}") -> dict[str, Any]:
    return {"path": path, "size": len(data),
            "checksums": {"sha256": hashlib.sha256(data).hexdigest()}}


@pytest.mark.parametrize("paths", [["shardspec.json/x"], ["a", "a/b"], ["a/b/c", "a/b"],
                                   ["model-rank-0-part-0.safetensors/config.json"]])
def test_a_path_under_a_listed_path_is_path_unsafe(manifest_dict: dict[str, Any],
                                                   paths: list[str]) -> None:
    """SPEC 2.1 rule 6: a checkpoint that validated in object storage (which holds both keys)
    could not be copied into a directory."""
    manifest_dict["extra_files"] = [extra(p) for p in paths]
    found = parse_manifest(manifest_bytes(manifest_dict)).findings
    assert [f.code for f in found] == ["path-unsafe"], found
    assert "SPEC 2.1 rule 6" in found[0].message and found[0].file == max(paths, key=len)


def test_fetch_config_refuses_a_path_under_the_manifest(
        s3_server: S3Server, s3_bucket: str, tmp_path: Path) -> None:
    """fetch-config left a folder named shardspec.json in the target and failed naming a
    temporary .part file."""
    url = f"s3://{s3_bucket}/ck"
    options = s3_server.storage_options()
    saved = shardspec.save({0: {"w": torch.zeros(2)}}, url, layout=Layout(tp_size=1),
                           storage_options=options)
    key = "ck/shardspec.json"
    data = json.loads(saved.to_json())
    data["extra_files"] = [extra("shardspec.json/x")]
    s3_server.put_object(s3_bucket, "ck/shardspec.json/x", b"{}")
    s3_server.put_object(s3_bucket, key, manifest_bytes(data))
    out = tmp_path / "local"
    with pytest.raises(ShardspecError) as excinfo:
        fetch_config(url, out, storage_options=options)
    assert excinfo.value.code == "path-unsafe" and "shardspec.json/x" in str(excinfo.value)
    assert not out.exists() or not any(out.iterdir())


def test_fetch_config_checks_every_folder_before_writing(s3_server: S3Server, s3_bucket: str,
                                                         tmp_path: Path) -> None:
    """A linked folder on the path of a later extra file: refused before the first is
    written."""
    url = f"s3://{s3_bucket}/ck"
    options = s3_server.storage_options()
    for name in ("a.json", "z.json"):
        (tmp_path / name).write_text("{}")
    shardspec.save({0: {"w": torch.zeros(2)}}, url, layout=Layout(tp_size=1),
                   storage_options=options, extra_files={
                       "a.json": tmp_path / "a.json", "sub/z.json": tmp_path / "z.json"})
    out, outside = tmp_path / "local", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    (out / "sub").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ShardspecError) as excinfo:
        fetch_config(url, out, storage_options=options, overwrite=True)
    assert excinfo.value.code == "path-escapes"
    assert sorted(p.name for p in out.iterdir()) == ["sub"] and not any(outside.iterdir())


# --- items 10 and 11: import's file names and dimensions --------------------------------------


def rank_file(path: Path, tensors: dict[str, torch.Tensor], offsets: dict[str, list[int]]
              ) -> None:
    info = {n: {"saved_offsets": o} for n, o in offsets.items()}
    save_file(tensors, str(path), metadata={"DCP_SHARDING_INFO": json.dumps(info)})


def refused_import(root: Path, *words: str) -> None:
    result = runner.invoke(app, ["import", str(root)])
    said = result.stdout + result.stderr
    assert result.exit_code == 2, said
    assert "internal error" not in said and "Traceback" not in said, said
    for word in words:
        assert word in said, said
    assert not (root / "shardspec.json").exists()


@pytest.mark.parametrize("twin", ["model-rank-0-part-0.safetensors\n",
                                  "model-rank-\u0660-part-0.safetensors"])
def test_import_takes_no_file_name_twice_as_a_vllm_rank_and_part(tmp_path: Path,
                                                                  twin: str) -> None:
    """A trailing newline ($) and Unicode digits: two files read as rank 0's part 0, and the
    real file was dropped silently."""
    save_file({"w": torch.ones(2, 2)}, str(tmp_path / "model-rank-0-part-0.safetensors"))
    save_file({"w": torch.zeros(2, 2)}, str(tmp_path / twin))
    refused_import(tmp_path, "not vLLM sharded-state files", repr(twin))


@pytest.mark.parametrize("twin", ["shard-00001-model-00001-of-00001.safetensors\n",
                                  "shard-0000\u0661-model-00001-of-00001.safetensors"])
def test_import_takes_no_file_name_twice_as_a_distributed_rank_and_part(tmp_path: Path,
                                                                         twin: str) -> None:
    for name in ("shard-00001-model-00001-of-00001.safetensors", twin):
        rank_file(tmp_path / name, {"w": torch.ones(2, 8)}, {"w": [0, 0]})
    refused_import(tmp_path, "weight files besides the per-rank files", repr(twin))


def test_two_files_of_one_rank_and_part_are_refused() -> None:
    files: dict[int, dict[int, str]] = {}
    add_data_file(files, 0, 0, "a.safetensors")
    with pytest.raises(HFError, match="'a.safetensors' and 'b.safetensors' are both rank 0's "
                       "part 0"):
        add_data_file(files, 0, 0, "b.safetensors")


def test_import_names_a_tensor_whose_dimensions_differ_between_files(tmp_path: Path) -> None:
    """Was "error: zip() argument 2 is shorter than argument 1"."""
    first = "shard-00001-model-00001-of-00001.safetensors"
    second = "shard-00002-model-00001-of-00001.safetensors"
    rank_file(tmp_path / first, {"w": torch.ones(2, 8)}, {"w": [0, 0]})
    rank_file(tmp_path / second, {"w": torch.ones(2, 8, 1)}, {"w": [2, 0, 0]})
    refused_import(tmp_path, "tensor 'w' has 2 dimensions in", first, f"3 in {second}")


# --- items 12 and 14: the vLLM plugin's source and options -----------------------------------


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_the_plugins_source_refuses_a_manifest_that_is_no_regular_file(tmp_path: Path,
                                                                       kind: str) -> None:
    """A FIFO hung the worker; a folder raised IsADirectoryError."""
    model = tmp_path / "model"
    model.mkdir()
    if kind == "fifo":
        os.mkfifo(model / "shardspec.json")
    else:
        (model / "shardspec.json").mkdir()
    outcome: list[BaseException] = []

    def attempt() -> None:
        try:
            open_source("s3://bucket/ck", model, storage_options=None)
        except BaseException as exc:  # noqa: BLE001 - judged below
            outcome.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "open_source hung on the manifest"
    assert isinstance(outcome[0], NotCommittedError), outcome
    assert outcome[0].code == "not-committed" and str(model) in str(outcome[0])


@pytest.mark.parametrize("option", ["save_to", "plan_cache"])
def test_the_plugin_refuses_a_path_with_nul_when_parsing(option: str) -> None:
    with pytest.raises(OptionsError, match=f"'{option}' must be a directory path"):
        LoaderOptions.parse({option: "/tmp/x\x00y"})


# --- item 4: a file rewritten in place during the import ------------------------------------


def test_import_takes_the_header_from_the_bytes_it_hashes(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """Rank 0's file is rewritten in place (same size) after its header was read: its new
    header places its rows where rank 1's lie. The manifest placed them where the old header
    said, and passed validate --checksums (the digest was of the new bytes)."""
    w = torch.arange(32, dtype=torch.float32).reshape(4, 8)
    save = tmp_path / "save"
    save.mkdir()
    first = save / "shard-00001-model-00001-of-00001.safetensors"
    rank_file(first, {"w": w[:2]}, {"w": [0, 0]})
    rank_file(save / "shard-00002-model-00001-of-00001.safetensors", {"w": w[2:]},
              {"w": [2, 0]})
    rewritten = tmp_path / "rewritten.safetensors"
    rank_file(rewritten, {"w": w[2:]}, {"w": [2, 0]})
    assert rewritten.stat().st_size == first.stat().st_size
    real = adopt.read_header

    def read_then_rewrite(handle: Any, size: int, name: str) -> Any:
        header = real(handle, size, name)
        if name == first.name:
            with first.open("r+b") as out:  # in place: the import's descriptor sees it
                out.write(rewritten.read_bytes())
        return header

    monkeypatch.setattr(adopt, "read_header", read_then_rewrite)
    try:
        import_hf_distributed(save)
    except HFError:
        return  # refused: as good
    report = shardspec.validate(save, checksums=True)
    assert not report.ok and report.findings[0].code == "checksum-mismatch"
    assert report.findings[0].file == first.name


# --- item 7: a folder nested past the recursion limit ----------------------------------------

DEEP = 1_100


def nest(root: Path, depth: int = DEEP) -> list[str]:
    """``root/d/d/.../d`` ``depth`` deep, made without recursion (os.makedirs recurses); the
    folders' paths, deepest last."""
    paths, folder = [], os.fspath(root)
    for _ in range(depth):
        folder = os.path.join(folder, "d")
        os.mkdir(folder)
        paths.append(folder)
    return paths


def unnest(paths: list[str]) -> None:
    """Remove what :func:`nest` made (shutil.rmtree recurses too)."""
    for folder in reversed(paths):
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        os.rmdir(folder)


def test_walk_is_os_walk_without_recursion(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "x").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "a", target_is_directory=True)
    (tmp_path / "y").write_text("y")
    assert [(f, sorted(d), sorted(n)) for f, d, n in walk(tmp_path)] == \
        [(f, sorted(d), sorted(n)) for f, d, n in os.walk(tmp_path)]
    paths = nest(tmp_path / "a" / "b")
    try:
        assert sum(1 for _ in walk(tmp_path)) == DEEP + 3
    finally:
        unnest(paths)


def test_a_deep_folder_is_walked_by_import_convert_and_fetch_config(
        tmp_path: Path, s3_server: S3Server, s3_bucket: str) -> None:
    """RecursionError on Python 3.10 and 3.11 in import, convert and fetch-config --overwrite
    (the last after it had written the files)."""
    save = tmp_path / "save"
    save.mkdir()
    save_file({"w": torch.ones(2, 2)}, str(save / "model-rank-0-part-0.safetensors"))
    hf = tmp_path / "hf"
    hf.mkdir()
    save_file({"model.norm.weight": torch.ones(4)}, str(hf / "model.safetensors"))
    (hf / "config.json").write_text('{"model_type": "llama"}')
    url = f"s3://{s3_bucket}/ck"
    options = s3_server.storage_options()
    shardspec.save({0: {"w": torch.zeros(2)}}, url, layout=Layout(tp_size=1),
                   storage_options=options)
    local = tmp_path / "local"
    local.mkdir()
    made = [nest(save), nest(hf), nest(local)]
    try:
        result = runner.invoke(app, ["import", str(save)])
        assert result.exit_code == 0, result.stdout + result.stderr
        result = runner.invoke(app, ["convert", str(hf), str(tmp_path / "out"), "--tp", "1"])
        assert result.exit_code == 0, result.stdout + result.stderr
        fetched = fetch_config(url, local, storage_options=options, overwrite=True)
        assert fetched.files == ["shardspec.json"] and fetched.left_in_place == []
    finally:
        for paths in made:
            unnest(paths)


# --- item 13: fetch-config in parallel, bounded, streamed -------------------------------------


def stored_with_extras(s3_server: S3Server, s3_bucket: str, tmp_path: Path,
                       extras: dict[str, bytes]) -> tuple[str, dict[str, Any]]:
    url = f"s3://{s3_bucket}/ck"
    options = s3_server.storage_options()
    sources = {}
    for name, data in extras.items():
        sources[name] = tmp_path / "sources" / name
        sources[name].parent.mkdir(parents=True, exist_ok=True)
        sources[name].write_bytes(data)
    shardspec.save({0: {"w": torch.zeros(2)}}, url, layout=Layout(tp_size=1),
                   storage_options=options, extra_files=sources)
    s3_server.clear_log()
    return url, options


def test_fetch_config_fetches_extra_files_in_parallel(s3_server: S3Server, s3_bucket: str,
                                                      tmp_path: Path) -> None:
    """One at a time before: 500 tiny extra files took 16 s against a local server."""
    extras = {f"tok/{i}.json": b"{}" for i in range(8)}
    url, options = stored_with_extras(s3_server, s3_bucket, tmp_path, extras)
    lock, active, most = threading.Lock(), [0], [0]

    def slow(request: object) -> None:
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.2)
        with lock:
            active[0] -= 1

    s3_server.on_request("GET", "ck/tok/*", slow, times=None)
    fetched = fetch_config(url, tmp_path / "local", storage_options=options)
    assert fetched.files == [*extras, "shardspec.json"]
    assert most[0] > 1
    for name, data in extras.items():
        assert (tmp_path / "local" / name).read_bytes() == data


@pytest.mark.parametrize(("bound", "value", "words"), [
    ("MAX_EXTRA_FILES", 2, "lists 3 extra files"),
    ("MAX_EXTRA_TOTAL", 5, "6 bytes in all"),
])
def test_fetch_config_bounds_the_extra_files_before_fetching(
        s3_server: S3Server, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        bound: str, value: int, words: str) -> None:
    url, options = stored_with_extras(s3_server, s3_bucket, tmp_path,
                                      {f"{i}.json": b"{}" for i in range(3)})
    monkeypatch.setattr(fetch_config_module, bound, value)
    with pytest.raises(ValueError, match=words):
        fetch_config(url, tmp_path / "local", storage_options=options)
    assert [r.key for r in s3_server.requests("GET")] == ["ck/shardspec.json"]
    assert not (tmp_path / "local").exists()


def traced(function: Any) -> Any:
    """``function``, then tracemalloc started: what comes after it is measured."""
    def call(*args: Any) -> Any:
        result = function(*args)
        tracemalloc.start()
        return result
    return call


def test_fetch_config_streams_each_extra_file(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Each was held whole in memory (a 200 MB extra file: 486 MB peak). Measured around
    the extra files alone: reading the manifest allocates its size limit at once."""
    big = tmp_path / "big.bin"
    with big.open("wb") as out:
        for _ in range(32):
            out.write(os.urandom(1 << 20))
    shardspec.save({0: {"w": torch.zeros(2)}}, tmp_path / "ckpt", layout=Layout(tp_size=1),
                   extra_files=[big])
    peaks = []
    real = fetch_config_module._write

    def measured(out: Path, relative: str, data: bytes) -> None:
        peaks.append(tracemalloc.get_traced_memory()[1])  # before the manifest is written
        real(out, relative, data)

    monkeypatch.setattr(fetch_config_module, "_write", measured)
    monkeypatch.setattr(fetch_config_module, "parse_manifest", traced(
        fetch_config_module.parse_manifest))
    try:
        fetch_config(tmp_path / "ckpt", tmp_path / "local")
    finally:
        tracemalloc.stop()
    assert peaks[-1] < 8 << 20, peaks
    assert (tmp_path / "local" / "big.bin").read_bytes() == big.read_bytes()


# --- the adversarial manifests of round four (bounds: benchmarks/hostile/bench_hostile.py)


def test_round_four_adversarial_manifests_get_their_answers() -> None:
    assert parse_manifest(joined_pieces(500)).findings == []
    short = parse_manifest(joined_pieces(500, short_offsets=True)).findings
    assert short and short[0].code == "piece-bounds"
    assert "piece-bounds" in {f.code for f in short} and "IndexError" not in str(short)
    nested = parse_manifest(nested_paths(50)).findings
    assert [f.code for f in nested] == ["path-unsafe"] * 50


def test_the_nesting_check_is_linear_in_path_length() -> None:
    """Comparing every prefix of 9,000 paths of 500 segments took seconds a pass."""
    data = nested_paths(8900)
    started = time.perf_counter()
    findings = parse_manifest(data).findings
    assert len(findings) == 8900 and time.perf_counter() - started < 20
