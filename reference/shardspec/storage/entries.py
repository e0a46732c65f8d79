"""Names in a directory a writer writes into, never followed (SPEC 10.1).

A target directory is not trusted: someone may have planted a symlink under a temporary's name,
as a folder on an extra file's path, or as an old data file. A writer creates its temporary
files itself with ``O_CREAT|O_EXCL|O_NOFOLLOW`` under an unpredictable name, creates or checks
each folder on the way (a symlink is refused), and removes a directory entry, never what it
names.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..format.checks import path_problem
from ..format.errors import Finding, PathError

__all__ = ["create_temporary", "folder_inside", "readable_mode", "remove_entry", "walk"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def create_temporary(folder: Path, name: str, suffix: str) -> tuple[int, Path]:
    """A new, empty file beside ``folder/name`` and its descriptor: ``.name.<random><suffix>``,
    created with ``O_CREAT|O_EXCL|O_NOFOLLOW`` (mkstemp), so no planted link is written
    through."""
    fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=suffix, dir=folder)
    return fd, Path(temporary)


def readable_mode() -> int:
    """The mode a file created with ``open()`` gets (mkstemp's is 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def folder_inside(root: Path, relative: str, *, create: bool) -> Path | None:
    """The folder of ``root/relative`` (``relative`` uses '/'), each folder on the way created
    (``create``) or checked to be a real folder: a symlink or a file there is refused
    (``path-escapes``), never followed. None where a folder is missing and not ``create``."""
    folder = root
    for part in relative.split("/")[:-1]:
        folder = folder / part
        try:
            info = os.lstat(folder)
        except FileNotFoundError:
            if not create:
                return None
            try:
                folder.mkdir()
                continue
            except FileExistsError:  # made meanwhile (writers in parallel): checked below
                info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode):
            raise PathError(Finding(
                code="path-escapes", file=relative,
                message=f"{folder} is not a folder of {root} (a symlink or a file): "
                "nothing is written through it", hint="remove it or write elsewhere"))
    return folder


def remove_entry(root: Path, relative: str) -> bool:
    """Remove the directory entry ``root/relative`` itself (a link, not what it names), where
    every folder on the way is a real folder; whether it was removed. A folder is left."""
    if path_problem(relative):
        return False
    try:
        folder = folder_inside(root, relative, create=False)
    except PathError:
        return False
    if folder is None:
        return False
    try:
        os.unlink(folder / relative.rsplit("/", 1)[-1])  # unlink never follows the last name
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.EISDIR, errno.EPERM, errno.ENOTDIR):
            return False
        raise
    return True


def walk(top: Path) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(top)`` (top-down, ``dirs`` may be pruned in place, links to folders listed but
    not entered), without recursion: os.walk recurses before Python 3.12, so a folder nested
    some thousand deep raised RecursionError; an unreadable folder is skipped, as there."""
    stack = [os.fspath(top)]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as scan:
                entries = list(scan)
        except OSError:
            continue
        dirs: list[str] = []
        files: list[str] = []
        for entry in entries:
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            (dirs if is_dir else files).append(entry.name)
        yield folder, dirs, files
        stack += [os.path.join(folder, d) for d in reversed(dirs)
                  if not os.path.islink(os.path.join(folder, d))]
