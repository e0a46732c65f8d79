"""Writing a checkpoint into object storage: data objects first, the manifest last (SPEC 10.4).

An object store has no rename and no directory to sync, but a PUT is atomic: an object appears
whole or not at all. So each data file is produced in a local temporary file (one at a time),
hashed, uploaded and its size checked; the manifest is PUT only once every object it lists is
in place, and removed first when a prefix is written again.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..format.errors import Finding, IntegrityError
from ..format.integrity import digest_stream
from ..format.limits import MANIFEST_NAME
from ..format.manifest import FileRecord
from .commit import TEMP_SUFFIX, interrupted_write
from .manifest_file import read_manifest
from .remote import RemoteRoot

__all__ = ["commit_remote", "prepare_prefix", "upload_file", "write_object"]

#: Objects a writer may remove from a prefix it overwrites, besides the old manifest's files.
_STALE = re.compile(r"^model-rank-\d+-.*\.safetensors$|^\..*" + re.escape(TEMP_SUFFIX) + "$")


def prepare_prefix(root: RemoteRoot, overwrite: bool) -> None:
    """Refuse a prefix holding objects unless ``overwrite``; else uncommit it (the manifest
    goes first) and remove the old checkpoint's objects (SPEC 10.2)."""
    existing = root.names()
    if not existing:
        return
    if not overwrite and not interrupted_write(existing):
        raise FileExistsError(f"{root.url} holds objects; pass overwrite=True to replace the "
                              "checkpoint in it")
    previous = read_manifest(root).manifest if MANIFEST_NAME in existing else None
    root.remove(MANIFEST_NAME)  # from here on a failure leaves no manifest, never a stale one
    stale = {name for name in existing if _STALE.match(name)}
    if previous is not None:
        stale |= {f.path for r in previous.ranks for f in r.files}
        stale |= {f.path for f in previous.extra_files}
    for name in sorted(stale & set(existing)):
        root.remove(name)


def write_object(
    root: RemoteRoot, relative: str, write: Callable[[Path], object]
) -> FileRecord:
    """Run ``write(path)`` to produce the object's bytes in a local temporary file, then upload
    it; the record carries the size and sha256 of the bytes uploaded."""
    with tempfile.TemporaryDirectory(prefix="shardspec-upload-") as folder:
        local = Path(folder) / Path(relative).name
        write(local)
        return upload_file(root, relative, local)


def upload_file(root: RemoteRoot, relative: str, local: Path) -> FileRecord:
    """Upload ``local`` as ``relative``; its record, its size checked in the store after."""
    with local.open("rb") as handle:
        digests, size = digest_stream(handle)
    root.put_file(relative, str(local))
    stored = root.version(relative).size
    if stored != size:
        raise IntegrityError(Finding(
            code="file-size", file=relative,
            message=f"uploaded {size} bytes but the store holds {stored}"))
    return FileRecord(path=relative, size=size, checksums=digests)


def commit_remote(root: RemoteRoot, manifest_json: bytes) -> None:
    """PUT the manifest, last: from now on the prefix is a checkpoint (SPEC 10.4)."""
    root.put_bytes(MANIFEST_NAME, manifest_json)
