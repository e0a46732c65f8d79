"""The local directories convert reads and writes: which files of a Hugging Face directory
travel with the weights, and a URL refused where only a local directory will do."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..format.checks import path_problem
from ..format.json_text import load_json
from ..format.limits import MANIFEST_NAME
from ..storage.entries import walk
from ..storage.remote import is_remote
from .hf import HFError

__all__ = [
    "Progress",
    "SKIPPED_DIRS",
    "WEIGHT_SUFFIXES",
    "hf_extra_files",
    "local_dir",
    "read_json",
]


#: progress(bytes just written, total bytes to write)
Progress = Callable[[int, int], None]


#: Never copied from a Hugging Face directory: weights in other formats and stale indexes.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack",
                    ".gguf", ".index.json")


#: Never copied: Meta's original weights and tool caches.
SKIPPED_DIRS = ("original",)


def hf_extra_files(root: Path, exclude: Path | None = None) -> dict[str, Path]:
    """The files of a Hugging Face directory that belong with the weights (config, tokenizer,
    generation config, ...): every regular file except weights (``.safetensors``, ``.bin``,
    ``.pt``, ...), indexes (``*.index.json``), hidden files, ``original/`` folders, a
    ``shardspec.json`` and the folder ``exclude`` (a destination inside the source)."""
    out: dict[str, Path] = {}
    skip = _identity(exclude) if exclude is not None else None
    for folder, dirs, files in walk(root):
        relative = Path(folder).relative_to(root)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS
                         and (skip is None or _identity(Path(folder) / d) != skip))
        for name in sorted(files):
            path = Path(folder) / name
            rel = (relative / name).as_posix()
            if (name.startswith(".") or name.endswith(WEIGHT_SUFFIXES)
                    or rel == MANIFEST_NAME or not path.is_file()):
                continue
            if path_problem(rel):
                raise HFError(f"cannot list {rel!r} as an extra file: {path_problem(rel)}")
            if path.is_symlink() and not _resolves_inside(root, path):
                raise HFError(
                    f"{rel} links to {path.resolve()}, outside the directory being converted "
                    "(and outside the Hugging Face cache's blobs of its repository): it is not "
                    "copied into the checkpoint as its own; copy the file in, or remove it")
            out[rel] = path
    return out


def _identity(path: Path) -> tuple[int, int] | None:
    """The device and inode of the folder ``path`` names (one stat: resolving a path is a
    stat a component, quadratic down a deep tree)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _resolves_inside(root: Path, path: Path) -> bool:
    """Whether the link ``path`` ends inside ``root`` or, for a snapshot of the Hugging Face
    cache (``models--org--name/snapshots/REV``), inside that repository's ``blobs``."""
    target = path.resolve()
    allowed = [root.resolve()]
    if root.resolve().parent.name == "snapshots":
        allowed.append(root.resolve().parent.parent / "blobs")
    return any(target == place or place in target.parents for place in allowed)


def local_dir(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` as a local directory; ValueError for an object-storage URL."""
    if is_remote(os.fspath(path)):
        raise ValueError(f"{what} must be a local directory, not the URL {os.fspath(path)!r}: "
                         "copy it to local disk first")
    return Path(os.fspath(path))


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = load_json(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise HFError(f"{path}: not valid JSON: {exc}") from None
    return data if isinstance(data, dict) else None
