"""Writing a checkpoint into object storage: data objects first, the manifest last (SPEC 10.4).

An object store has no rename and no directory to sync, but a PUT is atomic: an object appears
whole or not at all. So each data file is produced in a local temporary file (one at a time),
hashed, uploaded and its size checked; the manifest is PUT only once every object it lists is
in place, and removed first when a prefix is written again.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Collection
from pathlib import Path

from ..format.errors import Finding, IntegrityError
from ..format.integrity import digest_stream
from ..format.limits import MANIFEST_NAME
from ..format.manifest import FileRecord
from .commit import (
    CLAIM_NAME,
    LEFTOVER,
    claim_bytes,
    claimed_names,
    foreign_weights,
    interrupted_write,
    removable,
)
from .manifest_file import read_manifest
from .remote import RemoteRoot

__all__ = ["commit_remote", "prepare_prefix", "upload_file", "write_object"]

#: The longest claim read back (commit.claimed_names claims nothing past its own limit).
_CLAIM_READ = (64 << 20) + 1

def prepare_prefix(root: RemoteRoot, overwrite: bool, claim: Collection[str] = ()) -> None:
    """Refuse a prefix holding objects unless ``overwrite`` (or what an interrupted write left);
    else uncommit it (the manifest goes first) and remove the old checkpoint's objects, the
    interrupted write's and those its claim lists (SPEC 10.2), having claimed ``claim``, as
    :func:`shardspec.write.directory.prepare_directory` does in a directory."""
    existing = root.names()
    claimed = claimed_names(root.read_whole(CLAIM_NAME, _CLAIM_READ)) \
        if CLAIM_NAME in existing else frozenset()
    previous = read_manifest(root).manifest if MANIFEST_NAME in existing else None
    stale = removable(existing, previous, claimed)
    if claim:
        foreign_weights(root.url, existing, stale)
    if existing and not overwrite and not interrupted_write(existing, claimed):
        raise FileExistsError(f"{root.url} holds objects; pass overwrite=True to replace the "
                              "checkpoint in it")
    pending = set(claim) | {n for n in stale if n.endswith(".safetensors")
                            and not LEFTOVER.match(n)}
    if pending:  # claimed before the manifest goes, as in a directory
        root.put_bytes(CLAIM_NAME, claim_bytes(pending))
    if not existing:
        return
    root.remove(MANIFEST_NAME)  # from here on a failure leaves no manifest, never a stale one
    for name in sorted((stale & set(existing)) - {CLAIM_NAME}):
        root.remove(name)
    if claim and pending != set(claim):
        root.put_bytes(CLAIM_NAME, claim_bytes(claim))
    elif not claim and (pending or CLAIM_NAME in existing):
        root.remove(CLAIM_NAME)


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


def commit_remote(root: RemoteRoot, manifest_json: bytes, *, claimed: bool = False) -> None:
    """PUT the manifest, last: from now on the prefix is a checkpoint (SPEC 10.4); then
    remove the write's claim (``claimed``)."""
    root.put_bytes(MANIFEST_NAME, manifest_json)
    if claimed:
        root.remove(CLAIM_NAME)
