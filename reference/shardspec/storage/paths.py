"""Opening files inside a checkpoint directory, and only there (SPEC 2.2).

A manifest is untrusted input: its paths are checked lexically, resolved, required to stay
inside the checkpoint, and opened without following a last-moment symlink or blocking on a FIFO.
"""

from __future__ import annotations

import errno
import io
import os
import stat
from pathlib import Path

from ..format.checks import path_problem
from ..format.errors import Finding, PathError

__all__ = ["open_inside", "resolve_inside"]


def resolve_inside(root: Path, relative: str) -> Path:
    """The real path of ``relative`` under ``root``; PathError if unsafe, outside or missing."""
    problem = path_problem(relative)
    if problem:
        raise PathError(Finding(code="path-unsafe", file=relative, message=f"path is {problem}"))
    if not os.path.lexists(os.path.join(root, relative.split("/", 1)[0])):
        # nothing at the first segment, so no link to follow: missing, at one lstat (realpath
        # costs one a segment: 9,000 listed paths of 500 segments took 50 s to validate)
        raise PathError(Finding(code="file-missing", file=relative,
                                message="listed in the manifest but not found"))
    real_root = Path(os.path.realpath(root))
    real = Path(os.path.realpath(real_root / relative))
    if real != real_root and real_root not in real.parents:
        raise PathError(Finding(
            code="path-escapes", file=relative,
            message="resolves outside the checkpoint directory (through a symlink)",
            hint="copy the file into the checkpoint instead of linking to it"))
    if not os.path.lexists(real):
        raise PathError(Finding(code="file-missing", file=relative,
                                message="listed in the manifest but not found"))
    return real


def open_inside(root: Path, relative: str) -> tuple[io.FileIO, int]:
    """Open a regular file of the checkpoint for reading; return it and its size.

    The path is resolved and checked first (:func:`resolve_inside`); then the resolved path,
    which had no symlink in it, is opened one component at a time from a descriptor of the
    checkpoint directory, each with ``O_NOFOLLOW``: a directory or file swapped for a symlink
    after the check is refused (``path-escapes``), never followed out of the checkpoint, and a
    FIFO swapped in cannot block the open (``O_NONBLOCK``).
    """
    real = resolve_inside(root, relative)
    not_regular = PathError(Finding(code="file-not-regular", file=relative,
                                    message="is not a regular file (device, FIFO, socket or "
                                    "directory)"))
    real_root = Path(os.path.realpath(root))
    parts = real.relative_to(real_root).parts
    if not parts:  # the checkpoint directory itself
        raise not_regular
    try:
        fd = _open_beneath(real_root, parts)
    except PathError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.exists(real):
            # O_NOFOLLOW met a symlink that leads somewhere: the check resolved past it, so it
            # appeared since (a loop of links, which leads nowhere, is file-missing below)
            raise PathError(Finding(
                code="path-escapes", file=relative,
                message="a symlink appeared in the path after it was checked")) from None
        if exc.errno in (errno.ENOTDIR, errno.EISDIR):
            raise not_regular from None
        raise PathError(Finding(code="file-missing", file=relative,
                                message=f"cannot be opened: {exc.strerror}")) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise not_regular
    os.set_blocking(fd, True)
    return io.FileIO(fd, "rb", closefd=True), info.st_size


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def _open_beneath(real_root: Path, parts: tuple[str, ...]) -> int:
    """A descriptor of ``real_root/parts...``, each component opened relative to the one
    before it without following a symlink (``openat`` with ``O_NOFOLLOW``)."""
    if os.open not in os.supports_dir_fd or not _NOFOLLOW:  # no openat: the path, as before
        return os.open(real_root.joinpath(*parts), os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW)
    directory = os.open(real_root, os.O_RDONLY | _DIRECTORY)
    try:
        for part in parts[:-1]:
            try:
                child = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=directory)
            except NotADirectoryError:  # Linux says so of a symlink opened this way
                if stat.S_ISLNK(os.stat(part, dir_fd=directory, follow_symlinks=False).st_mode):
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP)) from None
                raise
            os.close(directory)
            directory = child
        return os.open(parts[-1], os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW, dir_fd=directory)
    finally:
        os.close(directory)
