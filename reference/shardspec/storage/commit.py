"""Durable, atomic file writes and the commit protocol of SPEC 10.

Data files are written under a temporary name, synced and renamed; the manifest is written the
same way, last. A crash at any point leaves either the old manifest with its files, or none.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from collections.abc import Callable, Collection, Iterable
from pathlib import Path

from ..format.errors import Finding, PathError
from ..format.limits import MANIFEST_NAME
from ..format.manifest import Manifest
from .entries import create_temporary, folder_inside, readable_mode

__all__ = ["ADOPTED_KEY", "CLAIM_NAME", "LEFTOVER", "TEMP_SUFFIX", "adopted_files", "claim_bytes",
           "claimed_names",
           "commit_manifest", "drop_claim", "foreign_weights", "fsync_dir", "interrupted_write",
           "read_claim", "removable", "uncommit", "write_claim", "write_durably",
           "write_inside"]

#: Temporary files start with '.' and end with this, so no reader or vLLM glob matches them.
TEMP_SUFFIX = ".shardspec-tmp"

#: What a writer leaves behind when it is stopped before its manifest: data files under the
#: default names and temporary files. Never torch's ``shard-S-model-C-of-N.safetensors``: a
#: distributed save of transformers or torch is exactly such files without a manifest, and no
#: write removes a user's save; a writer naming its files so claims them first (CLAIM_NAME).
LEFTOVER = re.compile(r"^model-rank-\d+-.*\.safetensors$|^\..*" + re.escape(TEMP_SUFFIX) + "$")

#: A writer whose data files LEFTOVER does not match (``convert``'s torch names) lists them in
#: this hidden file before it writes the first, and removes it after its manifest: what a claim
#: lists is provably the writer's own, so an interrupted write's files may be replaced.
CLAIM_NAME = ".shardspec-writing"

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)

#: The longest claim read back (a larger one claims nothing).
_CLAIM_LIMIT = 64 << 20


def claim_bytes(names: Iterable[str]) -> bytes:
    """A claim's content: the data files a write is about to create, as JSON."""
    return json.dumps({"files": sorted(set(names))}).encode("utf-8") + b"\n"


def claimed_names(data: bytes) -> frozenset[str]:
    """The names a claim lists; only plain ``*.safetensors`` names at the top of the directory
    count, and a claim that cannot be read claims nothing."""
    try:
        files = json.loads(data.decode("utf-8")).get("files") if len(data) <= _CLAIM_LIMIT \
            else None
    except (ValueError, AttributeError, RecursionError):
        return frozenset()
    if not isinstance(files, list):
        return frozenset()
    return frozenset(n for n in files if isinstance(n, str) and n.endswith(".safetensors")
                     and not n.startswith(".") and "/" not in n and "\\" not in n)


def interrupted_write(names: Iterable[str], claimed: Collection[str] = ()) -> bool:
    """Whether a directory (or prefix) holding ``names`` is what an interrupted write leaves:
    no manifest (so no checkpoint, SPEC 2.3), only data and temporary files of a writer, its
    claim and the files the claim lists. A new write may replace it without being asked to
    overwrite."""
    names = list(names)
    return bool(names) and MANIFEST_NAME not in names and all(
        LEFTOVER.match(n) or n == CLAIM_NAME or n in claimed for n in names)


#: The manifest metadata key that ``shardspec import`` writes: its files were adopted in
#: place (a user's save), not written by a shardspec writer.
ADOPTED_KEY = "imported_from"


def adopted_files(previous: Manifest | None) -> list[str]:
    """The files of ``previous`` that an import adopted (all it lists), sorted; none for a
    manifest a writer wrote."""
    if previous is None or ADOPTED_KEY not in previous.metadata:
        return []
    return sorted({f.path for r in previous.ranks for f in r.files}
                  | {f.path for f in previous.extra_files})


def removable(existing: Collection[str], previous: Manifest | None,
              claimed: Collection[str]) -> set[str]:
    """What a write may remove of ``existing``: the previous manifest's files, leftovers
    (:data:`~shardspec.storage.commit.LEFTOVER`) and what the previous write claimed."""
    stale = {n for n in existing if LEFTOVER.match(n)} | set(claimed)
    if previous is not None:
        stale |= {f.path for r in previous.ranks for f in r.files}
        stale |= {f.path for f in previous.extra_files}
    return stale


def foreign_weights(where: object, existing: Collection[str], ours: Collection[str]) -> None:
    """Refuse to write files named as torch names them beside ``*.safetensors`` files that
    this write may not remove (``ours``: the ones it may): transformers and torch's
    ``HuggingFaceStorageReader`` read every ``*.safetensors`` file of the directory, so they
    would read the two mixed. Nothing is removed: the files may be a user's own save."""
    other = sorted(n for n in existing if n.endswith(".safetensors") and n not in ours)
    if other:
        more = f" and {len(other) - 1} more" if len(other) > 1 else ""
        raise FileExistsError(
            f"{where} holds safetensors files that no shardspec manifest or interrupted write "
            f"lists, such as {other[0]!r}{more} (a distributed save of transformers or torch?)"
            ": shardspec never removes them, and transformers and torch would read them with "
            "the new checkpoint's; move them away or write the checkpoint elsewhere")


def read_claim(root: Path) -> frozenset[str]:
    """The names the claim in ``root`` lists: none without a claim, or where it is not a
    regular file of its own (a link, a FIFO: nothing to follow or to hang on)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(root / CLAIM_NAME, flags)
    except OSError:
        return frozenset()
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return frozenset()
        return claimed_names(handle.read(_CLAIM_LIMIT + 1))


def write_claim(root: Path, names: Iterable[str]) -> None:
    """Claim ``names`` durably, before the first of them is written."""
    data = claim_bytes(names)
    write_durably(root / CLAIM_NAME, lambda temp: temp.write_bytes(data))
    fsync_dir(root)


def drop_claim(root: Path) -> None:
    """Remove the claim once the manifest lists its files (or they are gone)."""
    if os.path.lexists(root / CLAIM_NAME):
        (root / CLAIM_NAME).unlink()
        fsync_dir(root)


def fsync_dir(directory: Path) -> None:
    """Make renames and removals in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(final: Path, write: Callable[[Path], object]) -> None:
    """Run ``write(temp_path)``, sync the result and rename it to ``final`` (SPEC 10.1).

    The temporary file is created here, under a new random name with ``O_EXCL|O_NOFOLLOW``, so
    that a link planted in the target is never written through; its mode and sync go through
    a descriptor, and it is renamed only if the name holds a regular file (``write`` may
    rename its own file over it, as safetensors does). The directory itself is synced by the
    caller, once for a batch of files.
    """
    fd, temp = create_temporary(final.parent, final.name, TEMP_SUFFIX)
    os.close(fd)
    try:
        write(temp)
        written = _open_written(temp, final)
        try:
            os.fchmod(written, readable_mode())
            os.fsync(written)
        finally:
            os.close(written)
        os.replace(temp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def _open_written(temp: Path, final: Path) -> int:
    """A descriptor of the file ``write`` left at ``temp``, which must be a regular file: a
    link there was not ours to rename into place."""
    try:
        fd = os.open(temp, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        fd = -1
    if fd < 0 or not stat.S_ISREG(os.fstat(fd).st_mode):
        if fd >= 0:
            os.close(fd)
        raise PathError(Finding(code="path-escapes", file=str(final), message=(
            f"{temp} was replaced while it was written (not a regular file now): nothing is "
            "renamed into place")))
    return fd


def write_inside(root: Path, relative: str, write: Callable[[Path], object], *,
                 sync_folder: bool = True) -> Path:
    """:func:`write_durably` at ``root/relative``, every folder on the way created or checked
    to be a real folder of ``root`` (never a link out of it); the file's path."""
    folder = folder_inside(root, relative, create=True)
    assert folder is not None
    final = folder / relative.rsplit("/", 1)[-1]
    write_durably(final, write)
    if sync_folder:
        fsync_dir(folder)
    return final


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
