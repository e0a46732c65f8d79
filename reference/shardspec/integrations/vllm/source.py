"""A checkpoint in object storage, served with a local directory as vLLM's ``model``.

vLLM 0.32 refuses an object-storage ``model`` for every load format but its own streamers
("To load a model from object storage (S3/GCS/Azure), 'load_format' must be 'modelexpress',
'runai_streamer' or 'runai_streamer_sharded'", in ``VllmConfig.__post_init__``), so the
checkpoint's URL comes in ``model_loader_extra_config`` as ``source``, and ``model`` is a local
directory holding its manifest and extra files (config, tokenizer: ``shardspec fetch-config``),
from which vLLM takes the configuration. The two must be of one checkpoint: a directory whose
``shardspec.json`` is not the source's, byte for byte, is refused before any weight is read.

Pure Python (no vLLM import).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

from ...format.errors import Finding, IntegrityError, NotCommittedError, PathError
from ...format.limits import MANIFEST_NAME, MAX_MANIFEST_BYTES
from ...reader import Checkpoint, open_checkpoint
from ...storage.paths import open_inside

__all__ = ["open_source"]


def open_source(source: str, model: str | os.PathLike[str], *,
                storage_options: dict[str, Any] | None,
                ignore_extensions: Collection[str] = ()) -> Checkpoint:
    """The checkpoint at ``source`` (credentials and endpoint from the environment, as the
    filesystem reads them, and ``storage_options``), once ``model``'s ``shardspec.json`` is
    found to be its manifest: IntegrityError ``checksum-mismatch`` naming both where it is not,
    NotCommittedError where ``model`` has none."""
    local = Path(model) / MANIFEST_NAME
    try:  # as every read is opened: a regular file inside, never blocking on a FIFO
        handle, _ = open_inside(Path(model), MANIFEST_NAME)
        with handle:
            data = handle.read(MAX_MANIFEST_BYTES + 1)
    except PathError as exc:
        if exc.code not in ("file-missing", "file-not-regular"):
            raise
        what = "no" if exc.code == "file-missing" else "a directory, FIFO or device as its"
        raise NotCommittedError(Finding(
            code="not-committed", file=str(local),
            message=f"vLLM's model {model} holds {what} {MANIFEST_NAME}: with 'source' "
            f"({source}), the model is a local directory holding the checkpoint's manifest "
            "and extra files", hint=f"shardspec fetch-config {source} {model}")) from None
    checkpoint = open_checkpoint(source, ignore_extensions=ignore_extensions,
                                 storage_options=storage_options)
    here = hashlib.sha256(data).hexdigest()
    if here != checkpoint.manifest_sha256:
        raise IntegrityError(Finding(
            code="checksum-mismatch", file=MANIFEST_NAME,
            message=f"{local} (sha256 {here[:16]}…) is not the manifest of {source} (sha256 "
            f"{(checkpoint.manifest_sha256 or '')[:16]}…): vLLM would take the configuration "
            "of one checkpoint and the weights of another",
            hint=f"fetch the source's files again: shardspec fetch-config {source} {model} "
            "--overwrite"))
    return checkpoint
