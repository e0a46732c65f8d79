"""Where a checkpoint lives: a local directory, or a prefix in object storage (SPEC 2.4).

Every entry point takes a path or a URL and turns it into a :data:`Location` here once; the
modules below it branch on the type. ``file://`` URLs are local paths and keep the local
path's hardening (SPEC 2.2); other URLs go through fsspec.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeAlias

from .remote import RemoteRoot, is_remote, local_path

__all__ = ["Location", "PathOrURL", "locate"]

Location: TypeAlias = Path | RemoteRoot
PathOrURL: TypeAlias = "str | os.PathLike[str] | RemoteRoot"


def locate(path: PathOrURL, storage_options: dict[str, Any] | None = None) -> Location:
    """The location of ``path``: a :class:`RemoteRoot` for a URL, else a :class:`Path`.

    ``storage_options`` go to the fsspec filesystem (credentials, endpoint, ...); passing them
    with a local path is an error rather than silently ignored.
    """
    if isinstance(path, RemoteRoot):
        return path
    if isinstance(path, str) and is_remote(path):
        return RemoteRoot(path, storage_options)
    if storage_options:
        raise ValueError("storage_options apply to object-storage URLs (s3://, gs://, ...), "
                         f"not to the local path {str(path)!r}")
    return Path(local_path(os.fspath(path)))

