"""Durable, atomic file writes and the commit protocol of SPEC 10.

Data files are written under a temporary name, synced and renamed; the manifest is written the
same way, last. A crash at any point leaves either the old manifest with its files, or none.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from ..format.limits import MANIFEST_NAME

__all__ = ["LEFTOVER", "TEMP_SUFFIX", "commit_manifest", "fsync_dir", "interrupted_write",
           "uncommit", "write_durably"]

#: Temporary files start with '.' and end with this, so no reader or vLLM glob matches them.
TEMP_SUFFIX = ".shardspec-tmp"

#: What a writer leaves behind when it is stopped before its manifest: data files under the
#: default names and temporary files.
LEFTOVER = re.compile(r"^model-rank-\d+-.*\.safetensors$|^\..*" + re.escape(TEMP_SUFFIX) + "$")


def interrupted_write(names: Iterable[str]) -> bool:
    """Whether a directory (or prefix) holding ``names`` is what an interrupted write leaves:
    no manifest (so no checkpoint, SPEC 2.3), only data and temporary files of a writer. A new
    write may replace it without being asked to overwrite."""
    names = list(names)
    return bool(names) and MANIFEST_NAME not in names and all(LEFTOVER.match(n) for n in names)


def fsync_dir(directory: Path) -> None:
    """Make renames and removals in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(final: Path, write: Callable[[Path], object]) -> None:
    """Run ``write(temp_path)``, sync the result and rename it to ``final`` (SPEC 10.1).

    The directory itself is synced by the caller, once for a batch of files.
    """
    temp = final.with_name(f".{final.name}{TEMP_SUFFIX}")
    try:
        write(temp)
        _fsync_file(temp)
        os.replace(temp, final)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def commit_manifest(root: Path, manifest_json: bytes) -> None:
    """Write the manifest last, atomically; after this the checkpoint exists (SPEC 10.1)."""
    fsync_dir(root)  # every data file's rename is durable before the manifest can be

    def write(temp: Path) -> None:
        temp.write_bytes(manifest_json)

    write_durably(root / MANIFEST_NAME, write)
    fsync_dir(root)


def uncommit(root: Path) -> None:
    """Remove the manifest durably before any data file changes (SPEC 10.2)."""
    (root / MANIFEST_NAME).unlink(missing_ok=True)
    fsync_dir(root)
