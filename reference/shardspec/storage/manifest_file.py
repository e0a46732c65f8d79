"""Reading a location's manifest: ``shardspec.json`` opened safely, then parsed (SPEC 2.3, 2.4).

A local manifest is opened inside the directory (SPEC 2.2) and read by its real size; one in
object storage is fetched with one request, so that what is parsed is one version of it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Collection
from dataclasses import replace
from pathlib import Path

from ..format.errors import Finding, PathError, ShardspecError, StorageError
from ..format.limits import MANIFEST_NAME, MAX_MANIFEST_BYTES
from ..format.parse import ParsedManifest, parse_manifest
from .commit import CLAIM_NAME
from .paths import open_inside
from .remote import RemoteRoot

__all__ = ["read_manifest"]


def _fetch_manifest(root: RemoteRoot) -> bytes:
    """The manifest object's bytes with one request (one version of it, SPEC 9.3), at most one
    byte past the limit. A store may refuse a range of an empty object: asked its size then."""
    try:
        return root.read_whole(MANIFEST_NAME, MAX_MANIFEST_BYTES + 1)
    except StorageError as exc:
        if exc.code == "storage-failed" and root.version(MANIFEST_NAME).size == 0:
            return b""
        raise


def read_manifest(
    root: Path | RemoteRoot, *, ignore_extensions: Collection[str] = ()
) -> ParsedManifest:
    """Read ``root/shardspec.json`` safely and parse it (SPEC 2.3: no manifest, no checkpoint).

    ``root`` is a local directory or a prefix in object storage, whose manifest is fetched with
    one request (SPEC 2.4).
    """
    try:
        if isinstance(root, RemoteRoot):
            data = _fetch_manifest(root)
            size = len(data)
        else:
            handle, size = open_inside(root, MANIFEST_NAME)
    except PathError as exc:
        # a name that is there but reaches nothing (a dangling link) is file-missing (2.3 rule 3)
        if exc.code != "file-missing" or (isinstance(root, Path)
                                          and os.path.lexists(root / MANIFEST_NAME)):
            return ParsedManifest(None, [exc.finding])
        return ParsedManifest(None, [_not_committed(root)])
    except ShardspecError as exc:
        return ParsedManifest(None, [exc.finding])
    if size > MAX_MANIFEST_BYTES:
        if not isinstance(root, RemoteRoot):
            handle.close()
        return ParsedManifest(None, [Finding(
            code="json-too-large", file=MANIFEST_NAME,
            message=f"{size} bytes is over the limit of {MAX_MANIFEST_BYTES}"
            + (" (or more)" if isinstance(root, RemoteRoot) else ""))])
    if not isinstance(root, RemoteRoot):
        with handle:
            # read(n) allocates n bytes up front: size it by the file's real size, not the limit.
            data = handle.read(size + 1)
    parsed = parse_manifest(data, ignore_extensions=ignore_extensions)
    return replace(parsed, sha256=hashlib.sha256(data).hexdigest())


def _not_committed(root: Path | RemoteRoot) -> Finding:
    """Why there is no manifest, as far as the directory tells: it does not exist, it is a
    Hugging Face checkpoint, vLLM's sharded state, or what an interrupted write left."""
    message = "not a committed shardspec checkpoint: there is no shardspec.json"
    hint = "an interrupted write leaves no manifest; write the checkpoint again"
    if isinstance(root, Path):
        if not os.path.lexists(root):
            return Finding(code="not-committed", file=str(root),
                           message=f"{root} does not exist",
                           hint="check the path; a checkpoint is a directory holding "
                           "shardspec.json")
        try:
            names = set(os.listdir(root)) if root.is_dir() else set()
        except OSError:
            names = set()
        if names & {"model.safetensors", "model.safetensors.index.json"}:
            message = ("a Hugging Face checkpoint (model.safetensors), not a shardspec one: "
                       "there is no shardspec.json")
            hint = f"convert it: shardspec convert {root} OUT --tp N"
        elif CLAIM_NAME in names:
            hint = ("an interrupted write left it (its files are listed in "
                    f"{CLAIM_NAME}): write it again")
        elif any(n.startswith("model-rank-") and n.endswith(".safetensors") for n in names):
            hint = ("rank files without a manifest: vLLM's save_sharded_state (add a manifest "
                    f"with shardspec import-vllm {root}) or an interrupted write (write it again)")
        elif any(n.startswith("shard-") and n.endswith(".safetensors") for n in names):
            hint = ("rank files without a manifest: a distributed save of transformers or "
                    f"torch (add a manifest with shardspec import {root})")
    return Finding(code="not-committed", file=str(root), message=message, hint=hint)
