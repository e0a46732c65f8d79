"""Serving from object storage without an engine: ``shardspec fetch-config`` (the local
directory vLLM takes as its model), the plugin's ``source`` and ``storage_options`` options,
and its check that the local directory and the bucket hold one checkpoint.

Against the S3 server of tests/helpers/s3_server.py; tests/integrations/vllm/test_vllm_s3.py runs
the engine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
from typer.testing import CliRunner

import shardspec
from shardspec import Layout
from shardspec.cli import app
from shardspec.format.limits import MANIFEST_NAME
from shardspec.integrations.vllm.options import LoaderOptions, OptionsError
from shardspec.integrations.vllm.source import open_source
from shardspec.storage.fetch_config import fetch_config

if TYPE_CHECKING:
    from s3_server import S3Server

runner = CliRunner()

CONFIG = b'{"model_type": "llama", "hidden_size": 8}\n'
TOKENIZER = b'{"model": {"vocab": {"a": 0}}}\n'


@pytest.fixture
def stored(s3_server: S3Server, s3_bucket: str, tmp_path: Path
           ) -> tuple[str, dict[str, Any], shardspec.Manifest]:
    """A TP 2 checkpoint in the bucket with a config and a tokenizer in a folder."""
    (tmp_path / "config.json").write_bytes(CONFIG)
    (tmp_path / "tokenizer.json").write_bytes(TOKENIZER)
    states = {r: {"w": torch.full((4, 8), float(r))} for r in range(2)}
    sharding = {r: {"w": shardspec.Shard((8, 8), (4 * r, 0))} for r in range(2)}
    url = f"s3://{s3_bucket}/ck"
    options = s3_server.storage_options()
    manifest = shardspec.save(states, url, layout=Layout(tp_size=2), sharding=sharding,
                              storage_options=options,
                              extra_files={"config.json": tmp_path / "config.json",
                                           "tok/tokenizer.json": tmp_path / "tokenizer.json"})
    s3_server.clear_log()
    return url, options, manifest


def test_fetch_config_writes_the_manifest_and_extra_files_verified(
        s3_server: S3Server, stored: tuple[str, dict[str, Any], shardspec.Manifest],
        tmp_path: Path) -> None:
    url, options, manifest = stored
    out = tmp_path / "local"
    fetched = fetch_config(url, out, storage_options=options)
    assert fetched.files == ["config.json", "tok/tokenizer.json", MANIFEST_NAME]
    assert (out / "config.json").read_bytes() == CONFIG
    assert (out / "tok" / "tokenizer.json").read_bytes() == TOKENIZER
    # one GET of each small file, none of the data files, nothing written
    gets = [r.key for r in s3_server.requests("GET") if r.key]
    assert sorted(gets) == sorted(f"ck/{name}" for name in fetched.files)
    assert not s3_server.requests("PUT") and not s3_server.requests("HEAD")
    assert sorted(p.name for p in out.rglob("*") if p.is_file()) == [
        "config.json", MANIFEST_NAME, "tokenizer.json"]  # no data file, no temporary left
    assert fetched.manifest_sha256 == shardspec.open(url, storage_options=options
                                                     ).manifest_sha256
    assert [f.path for f in manifest.extra_files] == fetched.files[:-1]


def test_fetch_config_refuses_a_directory_that_is_not_empty(
        stored: tuple[str, dict[str, Any], shardspec.Manifest], tmp_path: Path) -> None:
    url, options, _ = stored
    out = tmp_path / "local"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty"):
        fetch_config(url, out, storage_options=options)
    assert (out / "config.json").read_text() == "{}"
    fetched = fetch_config(url, out, storage_options=options, overwrite=True)
    assert (out / "config.json").read_bytes() == CONFIG
    assert fetched.left_in_place == ["notes.txt"]


def test_fetch_config_refuses_an_extra_file_that_is_not_the_manifests(
        s3_server: S3Server, stored: tuple[str, dict[str, Any], shardspec.Manifest],
        tmp_path: Path) -> None:
    """Same size, other bytes: the sha256 tells; nothing is taken for the checkpoint (no
    manifest is written)."""
    url, options, _ = stored
    s3_server.put_object(url.split("/")[2], "ck/config.json", CONFIG.replace(b"8", b"9"))
    with pytest.raises(shardspec.IntegrityError) as caught:
        fetch_config(url, tmp_path / "local", storage_options=options)
    assert caught.value.code == "checksum-mismatch" and "config.json" in str(caught.value)
    assert not (tmp_path / "local" / MANIFEST_NAME).exists()


def test_fetch_config_never_writes_through_a_symlink(
        stored: tuple[str, dict[str, Any], shardspec.Manifest], tmp_path: Path) -> None:
    url, options, _ = stored
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "local"
    out.mkdir()
    os.symlink(outside, out / "tok")
    with pytest.raises(shardspec.PathError) as caught:
        fetch_config(url, out, storage_options=options, overwrite=True)
    assert caught.value.code == "path-escapes"
    assert not any(outside.iterdir())
    assert not (out / MANIFEST_NAME).exists()


def test_fetch_config_of_a_prefix_without_a_checkpoint(s3_server: S3Server, s3_bucket: str,
                                                       tmp_path: Path) -> None:
    with pytest.raises(shardspec.NotCommittedError):
        fetch_config(f"s3://{s3_bucket}/nothing", tmp_path / "local",
                     storage_options=s3_server.storage_options())


def test_the_command(stored: tuple[str, dict[str, Any], shardspec.Manifest],
                     tmp_path: Path) -> None:
    url, options, _ = stored
    out = tmp_path / "local"
    args = ["--storage-options", json.dumps(options), "fetch-config", url, str(out)]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["files"][-1] == MANIFEST_NAME and data["source"] == url
    again = runner.invoke(app, [*args, "--json"])
    assert again.exit_code == 2
    assert "--overwrite" in json.loads(again.stdout)["error"]["message"]
    text = runner.invoke(app, [*args, "--overwrite"])
    assert text.exit_code == 0, text.output
    assert "fetched 3 files" in text.stdout
    assert f"vllm serve {out} --load-format shardspec" in " ".join(text.stdout.split())


# --- the plugin's options and its check of the local directory ---------------------------------


def test_source_and_storage_options_are_parsed_strictly() -> None:
    options = LoaderOptions.parse({"source": "s3://bucket/ck",
                                   "storage_options": {"anon": False,
                                                       "client_kwargs": {"region_name": "x"}}})
    assert options.source == "s3://bucket/ck"
    assert options.storage_options == {"anon": False, "client_kwargs": {"region_name": "x"}}
    assert LoaderOptions.parse({}).source is None
    for bad in ("/local/dir", "file:///local/dir", "s3://", 3, ""):
        with pytest.raises(OptionsError, match="'source' must be an object-storage URL"):
            LoaderOptions.parse({"source": bad})
    with pytest.raises(OptionsError, match="'source', which is not given"):
        LoaderOptions.parse({"storage_options": {"anon": True}})
    for bad_options, why in (([1], "must be an object"), ({"not a name": 1}, "not an option"),
                             ({"client_kwargs": "x"}, "must be an object of options")):
        with pytest.raises(OptionsError, match=why):
            LoaderOptions.parse({"source": "s3://b/c", "storage_options": bad_options})
    with pytest.raises(OptionsError, match="'source' \\(an object-storage URL\\)"):
        LoaderOptions.parse({"sourse": "s3://b/c"})


def test_the_local_directory_must_hold_the_sources_manifest(
        s3_server: S3Server, stored: tuple[str, dict[str, Any], shardspec.Manifest],
        tmp_path: Path) -> None:
    url, options, _ = stored
    local = tmp_path / "local"
    with pytest.raises(shardspec.NotCommittedError) as missing:
        open_source(url, local, storage_options=options)
    assert f"shardspec fetch-config {url} {local}" in str(missing.value)
    fetch_config(url, local, storage_options=options)
    checkpoint = open_source(url, local, storage_options=options)
    assert checkpoint.is_remote and str(checkpoint.path) == url
    # another checkpoint's files in the local directory: refused, naming both
    other = tmp_path / "other"
    shardspec.save({0: {"w": torch.ones(8, 8)}}, other, layout=Layout(tp_size=1),
                   sharding={0: {"w": shardspec.Shard((8, 8), (0, 0))}})
    (local / MANIFEST_NAME).write_bytes((other / MANIFEST_NAME).read_bytes())
    s3_server.clear_log()
    with pytest.raises(shardspec.IntegrityError) as caught:
        open_source(url, local, storage_options=options)
    assert caught.value.code == "checksum-mismatch"
    assert str(local / MANIFEST_NAME) in str(caught.value) and url in str(caught.value)
    assert not [r for r in s3_server.requests("GET") if r.key.endswith(".safetensors")]
