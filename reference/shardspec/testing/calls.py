"""One reader call as the suite makes it: on a copy of the checkpoint, with what its output may
hold, and its judgement.

A reader never gets the suite's own checkpoints (the installed vectors, a generated checkpoint
kept for the report): it gets a :class:`Pristine` copy, made again before the next call
whenever a call changed anything in it. Its output is read within what is expected (see
:func:`~shardspec.testing.output.read_bounded`), and :func:`judge` names an output larger than
every expected one as such.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path

from .adapter import BatchReader, CommandReader, Outcome, PythonReader, Reader
from .checks import judge_load
from .output import RankTensors, TensorData, allowed_bytes

__all__ = ["Pristine", "call", "copy_of", "judge"]

_State = tuple[tuple[str, int, int, int, int, int], ...]


def _state(root: Path) -> _State | None:
    """Every entry under ``root`` (itself included) as lstat sees it: a change of content,
    name, kind, mode or link shows in its size, inode, mtime or ctime (which no process can
    set back)."""
    entries = []
    try:
        for where, directories, files in os.walk(root):
            for name in [".", *directories, *files]:
                path = os.path.join(where, name)
                st = os.lstat(path)
                entries.append((path, st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns,
                                st.st_ctime_ns))
    except OSError:
        return None
    return tuple(sorted(entries))


def copy_of(source: Path) -> Callable[[Path], Path]:
    """A maker for :class:`Pristine`: ``source`` (links kept as links) copied into
    ``DEST/checkpoint``."""
    def make(dest: Path) -> Path:
        shutil.copytree(source, dest / "checkpoint", symlinks=True)
        return dest / "checkpoint"
    return make


class Pristine:
    """A checkpoint to hand to a reader: what ``make`` builds in an empty directory (it returns
    the checkpoint directory in it), under ``work``. :meth:`path` builds it again, in a fresh
    directory, whenever anything in the last one changed since it was built: a reader that
    deletes or writes inside its checkpoint damages only its own copy."""

    def __init__(self, make: Callable[[Path], Path], work: Path) -> None:
        self._make, self._work, self._made = make, work, 0
        self._dest: Path | None = None
        self._root = work
        self._built: _State | None = None

    def path(self) -> Path:
        if self._dest is None or self._built is None or _state(self._dest) != self._built:
            if self._dest is not None:
                shutil.rmtree(self._dest, ignore_errors=True)
            self._made += 1
            self._dest = self._work / f"copy-{self._made}"
            self._dest.mkdir(parents=True)
            self._root = self._make(self._dest)
            self._built = _state(self._dest)
        return self._root


def call(reader: Reader, checkpoint: Path, rank: int, output: Path, ignore: Sequence[str],
         expect: Iterable[Mapping[str, TensorData]]) -> Outcome:
    """``reader.run``; the readers of this package read the output within ``expect`` (the
    tensors the output may hold: see :func:`~shardspec.testing.output.read_bounded`)."""
    if isinstance(reader, (CommandReader, BatchReader, PythonReader)):
        return reader.run(checkpoint, rank, output, ignore, expect=list(expect))
    return reader.run(checkpoint, rank, output, ignore)


def judge(outcome: Outcome, expected: RankTensors, *, rank: int, sections: tuple[str, ...],
          others: Mapping[int, RankTensors] | None = None, aliases: Collection[str] = ()
          ) -> tuple[tuple[str, ...], bool, str]:
    """:func:`~shardspec.testing.checks.judge_load`; an output holding more tensor bytes than
    any expected one says so first."""
    judged = judge_load(outcome, expected, rank=rank, sections=sections, others=others,
                        aliases=aliases)
    bound = allowed_bytes([expected, *(others or {}).values()])
    size = outcome.output_bytes
    if judged[1] or outcome.output is None or size is None or size <= bound:
        return judged
    return judged[0], False, (f"the output holds {size} bytes of tensor data, more than the "
                              f"{bound} bytes expected (tensors unlike any expected were not "
                              f"read): {judged[2]}")
