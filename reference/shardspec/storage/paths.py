"""Opening files inside a checkpoint directory, and only there (SPEC 2.2).

A manifest is untrusted input: its paths are checked lexically, resolved, required to stay
inside the checkpoint, and opened without following a last-moment symlink or blocking on a FIFO.
"""

from __future__ import annotations

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
    """Open a regular file of the checkpoint for reading; return it and its size."""
    real = resolve_inside(root, relative)
    not_regular = PathError(Finding(code="file-not-regular", file=relative,
                                    message="is not a regular file (device, FIFO, socket or "
                                    "directory)"))
    try:
        if not stat.S_ISREG(os.stat(real).st_mode):
            raise not_regular
        # O_NONBLOCK: a FIFO swapped in after the check cannot block us; O_NOFOLLOW: nor can a
        # symlink swapped in after resolving.
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except PathError:
        raise
    except OSError as exc:
        raise PathError(Finding(code="file-missing", file=relative,
                                message=f"cannot be opened: {exc.strerror}")) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise not_regular
    os.set_blocking(fd, True)
    return io.FileIO(fd, "rb", closefd=True), info.st_size
