"""Hostile checkpoints through shardspec's DCP Reader (issue 41 items 1, 6 and 15).

Real ``dcp.save`` / ``dcp.load`` in one process (no process group) with shardspec's Writer
and Reader; each checkpoint is then edited the way an attacker, or a broken tool, would:

1. the manifest's objects index names a tensor, or an object's pickle names code to run:
   nothing runs unless the caller trusts the checkpoint, and ``validate`` says what it holds;
6. reading one object reads its byte range, not its whole file, and verifying streams;
15. the index is parsed strictly, and its errors reach the caller as shardspec errors.

The index lives in ``metadata``, which is informative (SPEC 3.1): ``validate`` reports its
problems and the pickles' presence as warnings (``objects-index``, ``objects-pickled``) and
the checkpoint stays valid; the DCP Reader, which would load the objects, refuses a malformed
index (SPEC 3.1 rule 1) with code ``objects-index``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tracemalloc
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

import shardspec
from checkpoints import file_record, read_manifest_dict, refresh_record, rewrite_manifest
from shardspec.format.errors import RequestError, SchemaError, ShardspecError
from shardspec.integrations.dcp import OBJECTS_KEY, Reader, Writer

if TYPE_CHECKING:
    from s3_server import S3Server

OBJECTS_FILE = "dcp-objects-rank-0.bin"


@pytest.fixture(autouse=True)
def single_process() -> Iterator[None]:
    """DCP warns that it saves and loads in one process when no group is initialised."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


class Payload:
    """A pickle that makes a directory when unpickled with ``weights_only=False``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str]]:
        return os.mkdir, (str(self.marker),)


def payload(marker: Path) -> bytes:
    buffer = io.BytesIO()
    torch.save(Payload(marker), buffer)
    return buffer.getvalue()


def weights() -> torch.Tensor:
    return torch.arange(12.0).reshape(3, 4)


def save(root: Path, **objects: Any) -> Path:
    dcp.save({"w": weights(), **objects}, storage_writer=Writer(root))
    return root


def index_of(root: Path) -> dict[str, list[Any]]:
    loaded: dict[str, list[Any]] = json.loads(read_manifest_dict(root)["metadata"][OBJECTS_KEY])
    return loaded


def set_index(root: Path, index: dict[str, Any] | str) -> None:
    text = index if isinstance(index, str) else json.dumps(index)
    rewrite_manifest(root, lambda d: d.setdefault("metadata", {}).update({OBJECTS_KEY: text}))


def add_extra_file(root: Path, name: str, data: bytes) -> None:
    (root / name).write_bytes(data)
    record = {"path": name, "size": len(data),
              "checksums": {"sha256": hashlib.sha256(data).hexdigest()}}
    rewrite_manifest(root, lambda d: d.setdefault("extra_files", []).append(record))


def refusal(excinfo: pytest.ExceptionInfo[CheckpointException]) -> BaseException:
    """The exception the one rank raised inside ``dcp.load``."""
    (error, _), = excinfo.value.failures.values()
    return error


# --- item 1: code from the checkpoint ----------------------------------------------------------


def test_an_index_naming_a_tensor_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    """A state dict of tensors only: the index names its tensor, the listed file holds a
    pickle. Before: DCP unpickled it with weights_only=False (the directory appeared, even
    with verify=True, whose digests are the attacker's) and validate said valid."""
    root = save(tmp_path / "c")
    marker = tmp_path / "ran"
    data = payload(marker)
    add_extra_file(root, "evil.bin", data)
    set_index(root, {"w": ["evil.bin", 0, len(data)]})
    state = {"w": torch.zeros(3, 4)}
    with pytest.raises(CheckpointException) as excinfo:
        dcp.load(state, storage_reader=Reader(root, verify=True))
    error = refusal(excinfo)
    assert isinstance(error, SchemaError) and error.code == "objects-index"
    assert "'w'" in str(error) and "a tensor of the manifest" in str(error)
    assert not marker.exists()
    assert torch.equal(state["w"], torch.zeros(3, 4))
    # metadata is informative (SPEC 3.1): the weights are valid and load; validate warns
    report = shardspec.validate(root, checksums=True)
    assert report.ok
    assert [(f.code, f.json_path) for f in report.warnings] == [
        ("objects-index", f"$.metadata[{OBJECTS_KEY!r}]['w']")]
    assert torch.equal(shardspec.open(root).load_rank(0, "cpu")["w"], weights())


def test_a_pickle_naming_code_is_refused_unless_trusted(tmp_path: Path) -> None:
    """An object of the state dict whose pickle names a function. Before: it ran on load."""
    root = save(tmp_path / "c", step=5)
    marker = tmp_path / "ran"
    data = payload(marker)
    add_extra_file(root, "evil.bin", data)
    set_index(root, {"step": ["evil.bin", 0, len(data)]})
    with pytest.raises(CheckpointException) as excinfo:
        dcp.load({"w": torch.zeros(3, 4), "step": 0}, storage_reader=Reader(root, verify=True))
    error = refusal(excinfo)
    assert isinstance(error, RequestError) and error.code == "reshard-unsupported"
    assert error.finding.json_path == f"$.metadata[{OBJECTS_KEY!r}]['step']"
    assert "weights_only=True" in str(error) and "trust_objects=True" in str(error)
    assert not marker.exists()
    # the documented opt-in runs it: DCP's own behaviour, for checkpoints one trusts
    state = {"w": torch.zeros(3, 4), "step": 0}
    dcp.load(state, storage_reader=Reader(root, trust_objects=True))
    assert marker.is_dir() and state["step"] is None


def test_plain_objects_load_without_trust(tmp_path: Path) -> None:
    objects = {"step": 7, "lr": 0.5, "tag": "run-1", "rng": b"\x00\xff", "n": None,
               "extra": {"betas": (0.9, 0.99), "hist": [1, 2], "state": torch.arange(3)}}
    root = save(tmp_path / "c", **objects)
    state = {"w": torch.zeros(3, 4), "step": 0, "lr": 0.0, "tag": "", "rng": b"", "n": 1,
             "extra": {"betas": (0.0, 0.0), "hist": [], "state": torch.zeros(3, dtype=torch.long)}}
    dcp.load(state, storage_reader=Reader(root, verify=True))
    assert torch.equal(state["w"], weights())
    extra = state.pop("extra")
    assert torch.equal(extra.pop("state"), torch.arange(3))
    assert extra == {"betas": (0.9, 0.99), "hist": [1, 2]}
    assert {k: v for k, v in state.items() if k != "w"} == {
        k: v for k, v in objects.items() if k != "extra"}


def test_validate_warns_that_pickled_objects_are_present(tmp_path: Path) -> None:
    root = save(tmp_path / "c", step=5)
    report = shardspec.validate(root, checksums=True)
    assert report.ok
    (warning,) = report.warnings
    assert (warning.code, warning.section) == ("objects-pickled", "3.1")
    assert warning.json_path == f"$.metadata[{OBJECTS_KEY!r}]"
    assert "pickled" in warning.message and OBJECTS_FILE in warning.message
    assert "trust_objects=True" in (warning.hint or "")


# --- item 15: a strict index, its errors shardspec errors ---------------------------------------


def _entry(**change: Any) -> Callable[[Path], dict[str, Any] | str]:
    def build(root: Path) -> dict[str, Any]:
        index: dict[str, Any] = index_of(root)
        for position, value in change.items():
            index["step"][["file", "offset", "length"].index(position)] = value
        return index
    return build


STRICT_CASES: dict[str, tuple[Callable[[Path], dict[str, Any] | str], str]] = {
    # name: (the index, the JSON path below the key of its one problem)
    "offset-fraction": (_entry(offset=0.9), "['step'][1]"),
    "offset-string": (_entry(offset="0"), "['step'][1]"),
    "offset-true": (_entry(offset=True), "['step'][1]"),
    "offset-exponent": (lambda r: json.dumps(index_of(r)).replace(", 0,", ", 0e0,"),
                        "['step'][1]"),
    "offset-negative": (_entry(offset=-1), "['step'][1]"),
    "length-true": (_entry(length=True), "['step'][2]"),
    "length-null": (_entry(length=None), "['step'][2]"),
    "file-number": (_entry(file=0), "['step'][0]"),
    "entry-short": (lambda r: {"step": [OBJECTS_FILE, 0]}, "['step']"),
    "not-json": (lambda r: "{", ""),
    "not-an-object": (lambda r: "[]", ""),
    "duplicate-name": (lambda r: f'{{"step": ["{OBJECTS_FILE}", 0, 1], '
                       f'"step": ["{OBJECTS_FILE}", 0, 1]}}', ""),
    "file-unlisted": (_entry(file="other.bin"), "['step'][0]"),
    "file-is-data": (_entry(file="model-rank-0-part-0.safetensors"), "['step'][0]"),
    "past-the-end": (_entry(length=10**6), "['step'][2]"),
}


@pytest.mark.parametrize("case", sorted(STRICT_CASES))
def test_a_loose_index_is_refused_with_a_code(tmp_path: Path, case: str) -> None:
    """Before: 0.9, "0" and true were read as 0, 0 and 1 by int(), and every other problem was
    a ValueError that DCP reported as "metadata is None". The Reader refuses the index (it
    would load the objects from it); validate only warns (metadata is informative, SPEC 3.1)."""
    build, below = STRICT_CASES[case]
    root = save(tmp_path / "c", step=5)
    set_index(root, build(root))
    with pytest.raises(CheckpointException) as excinfo:
        dcp.load({"w": torch.zeros(3, 4), "step": 0}, storage_reader=Reader(root))
    error = refusal(excinfo)
    assert isinstance(error, SchemaError), repr(error)
    path = f"$.metadata[{OBJECTS_KEY!r}]{below}"
    assert error.code == "objects-index" and error.finding.json_path == path
    assert OBJECTS_KEY in str(error) and "SPEC 3.1" in str(error)
    assert "weights themselves are fine to load with shardspec" in str(error)
    assert "metadata is None" not in str(excinfo.value)
    report = shardspec.validate(root)
    assert report.ok
    assert [(f.code, f.json_path) for f in report.warnings] == [("objects-index", path)]


def test_a_directory_without_manifest_is_refused_as_such(tmp_path: Path) -> None:
    """Every error of read_metadata reaches the caller as itself, not as DCP's assertion."""
    with pytest.raises(CheckpointException) as excinfo:
        dcp.load({"w": torch.zeros(2)}, storage_reader=Reader(tmp_path))
    assert isinstance(refusal(excinfo), shardspec.NotCommittedError)
    assert "metadata is None" not in str(excinfo.value)


# --- item 6: one object's bytes, not its file's --------------------------------------------------

PADDING = 48 * 1024 * 1024  # bytes after the objects: the file is 48 MiB, an object 1 KiB


def padded(tmp_path: Path) -> Path:
    root = save(tmp_path / "c", step=5, note="x" * 1000)
    with (root / OBJECTS_FILE).open("ab") as handle:
        handle.truncate(handle.tell() + PADDING)
    refresh_record(root, OBJECTS_FILE)
    return root


def peak_of(load: Callable[[], None]) -> int:
    tracemalloc.start()
    try:
        load()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("verify", [False, True])
def test_one_object_is_read_from_its_range_in_bounded_memory(tmp_path: Path, verify: bool) -> None:
    """Before: the whole 48 MiB file was read into memory (and hashed from a copy) for a
    1 KiB object."""
    root = padded(tmp_path)
    length = index_of(root)["note"][2]
    reader = Reader(root, verify=verify)
    state = {"note": ""}
    peak = peak_of(lambda: dcp.load(state, storage_reader=reader))
    assert state["note"] == "x" * 1000
    size = file_record(read_manifest_dict(root), OBJECTS_FILE)["size"]
    assert reader.object_bytes == (size if verify else length)
    assert peak < 8 * 1024 * 1024, peak


def test_verify_still_covers_the_whole_objects_file(tmp_path: Path) -> None:
    """The digest is of the whole file (SPEC 9.2): a byte changed far from the object read."""
    root = padded(tmp_path)
    with (root / OBJECTS_FILE).open("r+b") as handle:
        handle.seek(-1, os.SEEK_END)
        handle.write(b"\x01")
    dcp.load({"note": ""}, storage_reader=Reader(root))  # its range is intact
    with pytest.raises(CheckpointException) as excinfo:
        dcp.load({"note": ""}, storage_reader=Reader(root, verify=True))
    error = refusal(excinfo)
    assert isinstance(error, ShardspecError) and error.code == "checksum-mismatch"


def test_a_truncated_objects_file_is_file_size(tmp_path: Path) -> None:
    root = save(tmp_path / "c", step=5)
    with (root / OBJECTS_FILE).open("r+b") as handle:
        handle.truncate(3)
    for verify in (False, True):
        with pytest.raises(CheckpointException) as excinfo:
            dcp.load({"step": 0}, storage_reader=Reader(root, verify=verify))
        error = refusal(excinfo)
        assert isinstance(error, ShardspecError) and error.code == "file-size"


@pytest.mark.parametrize("verify", [False, True])
def test_objects_in_object_storage_are_read_by_range(
    s3_server: S3Server, s3_bucket: str, verify: bool
) -> None:
    url = f"s3://{s3_bucket}/dcp"
    options = s3_server.storage_options()
    dcp.save({"w": weights(), "step": 9, "note": "y" * 500},
             storage_writer=Writer(url, storage_options=options))
    state = {"w": torch.zeros(3, 4), "note": ""}
    reader = Reader(url, storage_options=options, verify=verify)
    dcp.load(state, storage_reader=reader)
    assert torch.equal(state["w"], weights()) and state["note"] == "y" * 500
    manifest = shardspec.open(url, storage_options=options).manifest
    size = next(f.size for f in manifest.extra_files if f.path == OBJECTS_FILE)
    length = json.loads(manifest.metadata[OBJECTS_KEY])["note"][2]
    assert reader.object_bytes == (size if verify else length) and length < size
