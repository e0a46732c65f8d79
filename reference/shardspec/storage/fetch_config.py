"""A checkpoint's small files in a local directory: its manifest and its extra files (config,
tokenizer, ...), each verified against the manifest; never a data file.

What a server that reads the weights from object storage needs on local disk: vLLM takes its
configuration and tokenizer from a local ``model`` directory, and the vLLM plugin reads the data
files from the bucket (``model_loader_extra_config={"source": URL}``), refusing a directory whose
manifest is not the source's. The manifest is fetched with one request (one version of it,
SPEC 2.4) and written last, byte for byte, so that a directory an interrupted fetch left has
none: it is never taken for the checkpoint's.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..format.errors import (
    Finding,
    IntegrityError,
    NotCommittedError,
    PathError,
    raise_first_error,
)
from ..format.integrity import Digests, check_digests
from ..format.limits import MANIFEST_NAME, MAX_MANIFEST_BYTES
from ..format.manifest import FileRecord, Manifest
from ..format.parse import parse_manifest
from .commit import fsync_dir, write_inside
from .entries import folder_inside, walk
from .location import Location, PathOrURL, locate
from .paths import open_inside
from .remote import RemoteRoot, wait_all
from .remote_files import RemoteObject

__all__ = ["FetchedConfig", "fetch_config"]

#: The largest extra file fetched: a tokenizer is megabytes; past this it is not a config.
MAX_EXTRA_BYTES = 1 << 30
#: The most extra files fetched, and their largest total: a model's configs and tokenizer are
#: tens of files and megabytes; a manifest listing more is not asking for its configuration
#: (each file is synced before the manifest: about 1.5 ms a file on a loaded 2-core VM).
MAX_EXTRA_FILES = 1024
MAX_EXTRA_TOTAL = 4 << 30
#: Extra files fetched at once (each streamed to its temporary file, never held whole).
FETCHES_IN_FLIGHT = 16
_CHUNK = 1 << 20


@dataclass
class FetchedConfig:
    """What :func:`fetch_config` wrote: the files (relative paths, the manifest last), their
    bytes, the manifest's sha256, and files of the directory it left in place."""

    source: str
    target: Path
    manifest: Manifest
    manifest_sha256: str
    files: list[str] = field(default_factory=list)
    bytes_written: int = 0
    left_in_place: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "target": str(self.target), "files": self.files,
                "bytes": self.bytes_written, "manifest_sha256": self.manifest_sha256,
                "left_in_place": self.left_in_place}


def fetch_config(source: PathOrURL, target: str | os.PathLike[str], *,
                 storage_options: dict[str, Any] | None = None,
                 overwrite: bool = False) -> FetchedConfig:
    """Write the manifest and every extra file of the checkpoint at ``source`` (a URL or a
    directory) into the local directory ``target``, each extra file checked against its
    record's size and digests before it is written; the manifest last, as fetched.

    ``target`` must be empty or missing (ValueError otherwise) unless ``overwrite``: then the
    checkpoint's files replace those of the same names, and any other file is left in place
    (listed in the result). Nothing is written outside ``target``: the manifest's paths are
    checked by SPEC 2.2, and a directory or file of ``target`` that is a symlink is refused.
    """
    root = locate(source, storage_options)
    out = Path(target)
    if isinstance(root, Path) and out.exists() and out.resolve() == root.resolve():
        raise ValueError(f"{out} is the source checkpoint itself")
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is not a directory")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"{out} is not empty; pass overwrite=True to replace the checkpoint's "
                         "files there")
    data = _read_manifest_bytes(root)
    parsed = parse_manifest(data)
    raise_first_error(parsed.findings)
    assert parsed.manifest is not None
    manifest = parsed.manifest
    result = FetchedConfig(str(root), out, manifest, hashlib.sha256(data).hexdigest())
    _check_bounds(manifest.extra_files)
    for record in manifest.extra_files:  # a link or a file on a path's way: before any write
        folder_inside(out, record.path, create=False)
    out.mkdir(parents=True, exist_ok=True)
    _fetch_all(root, out, manifest.extra_files)
    result.files += [record.path for record in manifest.extra_files]
    result.bytes_written += sum(record.size for record in manifest.extra_files)
    _write(out, MANIFEST_NAME, data)
    result.files.append(MANIFEST_NAME)
    result.bytes_written += len(data)
    written = set(result.files)
    result.left_in_place = [name for name in _files_under(out) if name not in written]
    return result


def _files_under(out: Path) -> list[str]:
    """The files under ``out``, relative, sorted (links are not followed)."""
    found = []
    for folder, _, files in walk(out):
        relative = Path(folder).relative_to(out)
        found += [(relative / name).as_posix() for name in files]
    return sorted(found)


def _read_manifest_bytes(root: Location) -> bytes:
    """The manifest's bytes, with one request from object storage; NotCommittedError where
    there is none."""
    try:
        if isinstance(root, RemoteRoot):
            data = root.read_whole(MANIFEST_NAME, MAX_MANIFEST_BYTES + 1)
        else:
            handle, _ = open_inside(root, MANIFEST_NAME)
            with handle:
                data = handle.read(MAX_MANIFEST_BYTES + 1)
    except PathError as exc:
        if exc.code != "file-missing":
            raise
        raise NotCommittedError(Finding(
            code="not-committed", file=str(root),
            message=f"not a committed shardspec checkpoint: {root} has no {MANIFEST_NAME}",
            hint="check the URL (the prefix the checkpoint was written to)")) from None
    return data  # an oversized manifest is refused by the parser (json-too-large)


def _check_bounds(records: Sequence[FileRecord]) -> None:
    """ValueError, before any request, for more extra files or bytes than a config has."""
    if len(records) > MAX_EXTRA_FILES:
        raise ValueError(f"the manifest lists {len(records)} extra files: more than "
                         f"{MAX_EXTRA_FILES} are not fetched")
    for record in records:
        if record.size > MAX_EXTRA_BYTES:
            raise ValueError(f"{record.path} is {record.size} bytes: extra files over "
                             f"{MAX_EXTRA_BYTES} bytes are not fetched")
    total = sum(record.size for record in records)
    if total > MAX_EXTRA_TOTAL:
        raise ValueError(f"the manifest's extra files are {total} bytes in all: more than "
                         f"{MAX_EXTRA_TOTAL} are not fetched")


def _fetch_all(root: Location, out: Path, records: Sequence[FileRecord]) -> None:
    """Every extra file into ``out``, :data:`FETCHES_IN_FLIGHT` at once; the first error
    raised (the others' temporary files removed)."""
    if not records:
        return
    with ThreadPoolExecutor(min(FETCHES_IN_FLIGHT, len(records)),
                            thread_name_prefix="shardspec-fetch") as pool:
        wait_all([pool.submit(_fetch, root, out, record) for record in records])
    for folder in {(out / r.path).parent for r in records}:  # each once, before the manifest
        fsync_dir(folder)


def _fetch(root: Location, out: Path, record: FileRecord) -> None:
    """One extra file streamed to its temporary file, checked against its record's size and
    digests (SPEC 9) before it is renamed into place."""
    def write(temp: Path) -> None:
        digests = Digests(record.checksums)
        got = 0
        with temp.open("wb") as handle:
            for chunk in _chunks(root, record):
                got += len(chunk)
                if got > record.size:
                    break
                digests.update(chunk)
                handle.write(chunk)
        if got != record.size:
            raise IntegrityError(Finding(
                code="file-size", file=record.path,
                message=f"the file has {got if got <= record.size else 'more'} bytes, the "
                f"manifest says {record.size}"))
        check_digests(record.path, record.checksums, digests.hexdigests())

    write_inside(out, record.path, write, sync_folder=False)


def _chunks(root: Location, record: FileRecord) -> Iterator[bytes]:
    """The extra file's bytes in order, a chunk at a time (one more byte than the record's size
    at most, to tell a longer file)."""
    if isinstance(root, RemoteRoot):
        source = RemoteObject(root, record.path, record.size)
        yield from source.stream(0, record.size)  # each answer's size is the record's
        source.finish()
        return
    handle, _ = open_inside(root, record.path)
    with handle:
        left = record.size + 1
        while left > 0 and (chunk := handle.read(min(_CHUNK, left))):
            left -= len(chunk)
            yield chunk


def _write(out: Path, relative: str, data: bytes) -> None:
    """``data`` as ``out/relative``: no folder on the way nor the name itself is followed
    (:func:`~shardspec.storage.commit.write_inside`)."""
    write_inside(out, relative, lambda temp: temp.write_bytes(data))
